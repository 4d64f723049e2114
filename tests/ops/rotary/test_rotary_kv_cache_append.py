"""rotary_kv_cache_append (the fused rotate-and-append) on the triton and torch backends."""
import pytest
import torch

import opforge
from opforge.ops.rotary import cases
from opforge.testing import DEVICE, TOLERANCE, check_case, max_rel_error

BACKENDS = ["triton", "torch"]
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("r", [0, 8])
def test_matches_oracle(backend, dtype, interleaved, r):
    check_case(cases.make_fused_case((2, 4, 2, 3, 7, 16), dtype, r=r, interleaved=interleaved), backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("layout", ["packed", "transposed"])
def test_explicit_positions_and_views(backend, layout):
    check_case(cases.make_fused_case((3, 2, 1, 2, 5, 24), torch.float16, r=12, layout=layout, positions=True),
               backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_same_as_the_two_calls(backend):
    q, k, cos, sin, _ = cases.make_rotary_inputs(2, 4, 2, 3, 16, 8, torch.bfloat16, DEVICE, "transposed")
    v = torch.randn_like(k)
    kc, vc = torch.randn(2, 2, 10, 16, dtype=torch.bfloat16, device=DEVICE), \
        torch.randn(2, 2, 10, 16, dtype=torch.bfloat16, device=DEVICE)
    kc2, vc2 = kc.clone(), vc.clone()
    lens = torch.tensor([4, 7], device=DEVICE)
    q0, k0 = q.clone(), k.clone()
    with opforge.backend(backend):
        q_rot = opforge.rotary_kv_cache_append(q, k, v, kc, vc, lens, cos, sin, interleaved=True, inplace=True)
        pos = lens.view(2, 1) + torch.arange(3, device=DEVICE)
        q2, k2 = opforge.rotary_embedding(q0, k0, cos, sin, pos, interleaved=True)
        opforge.kv_cache_append(kc2, vc2, k2, v, lens)
    assert q_rot is q and torch.equal(k, k0), "q is rotated in place, k is never modified"
    assert max_rel_error((q, kc, vc), (q2.double(), kc2.double(), vc2.double())) <= TOLERANCE[torch.bfloat16]


@pytest.mark.parametrize("backend", BACKENDS)
def test_one_past_the_end_raises_and_writes_nothing(backend):
    case = cases.make_fused_case((2, 2, 1, 3, 6, 8), torch.float32)
    args, _ = case.make(DEVICE)
    q, k, v, kc, vc, lens, cos, sin, kc0, vc0 = args
    lens[1] = 4
    q0 = q.clone()
    with opforge.backend(backend), pytest.raises(IndexError, match="sequence 1 would write positions 4..6"):
        opforge.rotary_kv_cache_append(q, k, v, kc, vc, lens, cos, sin, inplace=True)
    assert torch.equal(kc, kc0) and torch.equal(vc, vc0) and torch.equal(q, q0)


def test_unchecked_kernel_skips_out_of_range_cache_positions():
    from opforge.ops.rotary import reference, triton_kernels
    from opforge.ops.rotary.problem import prepare_fused

    case = cases.make_fused_case((2, 2, 1, 3, 6, 8), torch.float32, positions=True)
    args, kwargs = case.make(DEVICE)
    q, k, v, kc, vc, lens, cos, sin, kc0, vc0 = args
    lens[0] = 4           # positions 4, 5 fit, 6 does not
    q_rot = triton_kernels.launch_fused(prepare_fused(q, k, v, kc, vc, lens, cos, sin, kwargs["positions"]))
    ref_k, ref_v = kc0.clone(), vc0.clone()
    ref_q = reference.rotary_kv_cache_append(q, k, v, ref_k, ref_v, lens, cos, sin, kwargs["positions"])
    assert torch.allclose(q_rot, ref_q, atol=1e-6) and torch.allclose(kc, ref_k, atol=1e-6) and torch.equal(vc, ref_v)


def test_errors_and_explain():
    case = cases.make_fused_case((2, 2, 1, 3, 6, 8), torch.float16)
    args, _ = case.make(DEVICE)
    q, k, v, kc, vc, lens, cos, sin, _, _ = args
    f = opforge.rotary_kv_cache_append
    with pytest.raises(TypeError, match="k_cache must be float32"):
        f(q, k, v, kc.int(), vc, lens, cos, sin)
    with pytest.raises(TypeError, match="v must have k_cache's dtype"):
        f(q, k, v.float(), kc, vc, lens, cos, sin)
    with pytest.raises(ValueError, match="v must have k's shape"):
        f(q, k, v[:, :, :2], kc, vc, lens, cos, sin)
    with pytest.raises(ValueError, match="positions must have shape"):
        f(q, k, v, kc, vc, lens, cos, sin, positions=torch.zeros(5, dtype=torch.int64, device=DEVICE))
    with pytest.raises(TypeError, match="k must have q's dtype"):
        f(q.float(), k, v, kc, vc, lens, cos, sin)
    short = cos[:4]
    with pytest.raises(IndexError, match="positions must be in \\[0, 4\\)"):
        f(q, k, v, kc, vc, torch.tensor([0, 3], device=DEVICE), short, sin[:4])
    text = str(opforge.explain("rotary_kv_cache_append", q, k, v, kc, vc, lens, cos, sin))
    assert "q/k/v into k/v cache float16 D=8 R=8" in text
    with opforge.trace() as t:
        f(q, k, v, kc, vc, lens, cos, sin)
    assert len(t) == 1 and t[0].op == "rotary_kv_cache_append"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("positions", [False, True])
def test_repeated_signature_matches_the_oracle_and_checks(backend, positions):
    """Second and third calls of one signature take the short path: still exact, still range-checked."""
    case = cases.make_fused_case((2, 4, 2, 1, 6, 16), torch.float16, r=8, positions=positions)
    for _ in range(2):
        check_case(case, backend)
    args, kwargs = case.make(DEVICE)
    q, k, v, kc, vc, lens, cos, sin, kc0, vc0 = args
    lens[1] = 6
    with opforge.backend(backend), pytest.raises(IndexError, match="sequence 1 would write positions 6"):
        opforge.rotary_kv_cache_append(q, k, v, kc, vc, lens, cos, sin, **kwargs)
    assert torch.equal(kc, kc0) and torch.equal(vc, vc0)
