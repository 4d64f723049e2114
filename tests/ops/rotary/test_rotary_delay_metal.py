"""The Metal rotary, KV-append and delay kernels, run in the MSL emulator, against the oracles.

The kernels are the unchanged rotary.metal and delay.metal, called through the public API with
``opforge.backend("metal")`` and ``OPFORGE_METAL_EMULATE=1``.
"""
import pytest
import torch

import opforge
from opforge.ops.delay import cases as delay_cases
from opforge.ops.rotary import cases as rotary_cases
from opforge.testing import check_case

pytestmark = pytest.mark.usefixtures("emulate")

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("interleaved", [False, True])
def test_rotary_both_conventions_and_partial(dtype, interleaved):
    for r in (16, 8):
        event, _, _ = check_case(rotary_cases.make_rotary_case((2, 3, 1, 3, 16), dtype, r=r, interleaved=interleaved),
                                 "metal", device="cpu")
        assert event.variant == "elementwise"


def test_rotary_views_positions_and_inplace():
    check_case(rotary_cases.make_rotary_case((2, 4, 2, 3, 16), torch.float16, r=8, layout="transposed",
                                             positions="1d"), "metal", device="cpu")
    q, k, cos, sin, pos = rotary_cases.make_rotary_inputs(1, 2, 1, 3, 16, 8, torch.float32, "cpu", "transposed")
    ref_q, ref_k = rotary_cases.rotary_oracle((q, k, cos, sin, pos), {})
    with opforge.backend("metal"):
        qo, ko = opforge.rotary_embedding(q, k, cos, sin, pos, inplace=True)
    assert qo is q and ko is k
    assert torch.allclose(q.double(), ref_q, atol=1e-6) and torch.allclose(k.double(), ref_k, atol=1e-6)


def test_rotary_out_of_range_position_gives_zeros():
    from opforge.ops.rotary import metal as rotary_metal
    from opforge.ops.rotary.problem import RotaryCall, prepare_rotary

    q, k, cos, sin, pos = rotary_cases.make_rotary_inputs(1, 2, 1, 3, 8, 4, torch.float32, "cpu", max_positions=10)
    call = prepare_rotary(q, k, cos, sin, pos)
    bad = pos.clone()
    bad[0, 2] = 12
    qo, _ = rotary_metal.launch_rotary(RotaryCall(call.problem, q, k, cos, sin, bad, False))
    assert torch.all(qo[0, :, 2, :4] == 0) and torch.equal(qo[0, :, 2, 4:], q[0, :, 2, 4:])
    ref_q = rotary_cases.rotary_oracle((q, k, cos, sin, pos), {})[0]
    assert torch.allclose(qo[0, :, :2].double(), ref_q[0, :, :2], atol=1e-6)


@pytest.mark.parametrize("dtype", DTYPES)
def test_kv_append(dtype):
    check_case(rotary_cases.make_append_case((2, 2, 3, 7, 16), dtype), "metal", device="cpu")
    check_case(rotary_cases.make_append_case((2, 2, 1, 5, 8), dtype, layout="transposed"), "metal", device="cpu")


def test_kv_append_one_past_the_end_raises_and_kernel_masks():
    from opforge.ops.rotary import metal as rotary_metal, reference
    from opforge.ops.rotary.problem import prepare_append

    kc, vc = torch.randn(2, 1, 4, 8), torch.randn(2, 1, 4, 8)
    k, v = torch.randn(2, 1, 2, 8), torch.randn(2, 1, 2, 8)
    kc0 = kc.clone()
    with opforge.backend("metal"), pytest.raises(IndexError, match="sequence 1"):
        opforge.kv_cache_append(kc, vc, k, v, torch.tensor([0, 3]))
    assert torch.equal(kc, kc0)
    lens = torch.tensor([0, 3], dtype=torch.int32)
    ref_k, ref_v = kc.clone(), vc.clone()
    rotary_metal.launch_kv_append(prepare_append(kc, vc, k, v, lens))
    reference.kv_cache_append(ref_k, ref_v, k, v, lens)
    assert torch.equal(kc, ref_k) and torch.equal(vc, ref_v)


@pytest.mark.parametrize("dtype", (torch.int32, torch.int64))
@pytest.mark.parametrize("op", ["apply_delay", "revert_delay"])
def test_delay(op, dtype):
    for layout in ("packed", "strided"):
        event, _, _ = check_case(delay_cases.make_case(op, (2, 13, 9), dtype, layout), "metal", device="cpu")
        assert event.variant == "elementwise"


def test_delay_round_trip_and_out():
    codes = torch.randint(0, 1000, (2, 20, 4), dtype=torch.int64)
    d = [0, 3, 5, 19]
    out = torch.empty(2, 4, 20, dtype=torch.int64).transpose(1, 2)
    with opforge.backend("metal"):
        delayed = opforge.apply_delay(codes, d, bos_id=-1, pad_id=-2, out=out)
        back = opforge.revert_delay(delayed, torch.tensor(d), pad_id=-2)
    assert delayed is out
    survive = (torch.arange(20).view(20, 1) + torch.tensor(d)) < 20
    assert torch.equal(back[:, survive], codes[:, survive]) and torch.all(back[:, ~survive] == -2)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rotary_kv_cache_append(dtype):
    check_case(rotary_cases.make_fused_case((2, 4, 2, 3, 7, 16), dtype), "metal", device="cpu")
    check_case(rotary_cases.make_fused_case((2, 3, 1, 2, 5, 16), dtype, r=8, interleaved=True, layout="transposed",
                                            positions=True), "metal", device="cpu")
