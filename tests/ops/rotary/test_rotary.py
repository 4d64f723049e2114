"""rotary_embedding on the triton (interpreter on CPU) and torch backends against the float64 oracle."""
import pytest
import torch

import opforge
from opforge.ops.rotary import cases, reference
from opforge.testing import DEVICE, TOLERANCE, check_case, max_rel_error

BACKENDS = ["triton", "torch"]
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("r", [0, 8, 6])
def test_matches_oracle(backend, dtype, interleaved, r):
    event, _, _ = check_case(cases.make_rotary_case((2, 3, 1, 4, 16), dtype, r=r, interleaved=interleaved), backend)
    assert event.variant == ("heads" if backend == "triton" else "reference")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("layout", ["packed", "transposed"])
@pytest.mark.parametrize("positions", ["2d", "1d"])
def test_layouts_and_position_shapes(backend, layout, positions):
    check_case(cases.make_rotary_case((2, 4, 2, 3, 32), torch.float16, r=16, layout=layout, positions=positions),
               backend)


def test_known_rotation_values():
    # position 1 of a table rotating pair 0 by 90 degrees and pair 1 by 180 degrees
    cos = torch.tensor([[1.0, 1.0], [0.0, -1.0]], device=DEVICE)
    sin = torch.tensor([[0.0, 0.0], [1.0, 0.0]], device=DEVICE)
    x = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0], device=DEVICE).view(1, 1, 1, 5)
    pos = torch.tensor([1], device=DEVICE)
    for backend in BACKENDS:
        with opforge.backend(backend):
            half, _ = opforge.rotary_embedding(x.clone(), x.clone(), cos, sin, pos)
            inter, _ = opforge.rotary_embedding(x.clone(), x.clone(), cos, sin, pos, interleaved=True)
        # rotate-half pairs (0, 2), (1, 3): (1, 3) -> (-3, 1); (2, 4) -> (-2, -4); feature 4 passes
        assert half.flatten().tolist() == [-3.0, -2.0, 1.0, -4.0, 5.0]
        # interleaved pairs (0, 1), (2, 3): (1, 2) -> (-2, 1); (3, 4) -> (-3, -4)
        assert inter.flatten().tolist() == [-2.0, 1.0, -3.0, -4.0, 5.0]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("r", [16, 8])
def test_inplace_writes_into_q_and_k_views(backend, r):
    q, k, cos, sin, pos = cases.make_rotary_inputs(2, 4, 2, 3, 16, r, torch.bfloat16, DEVICE, "transposed")
    q0, k0 = q.clone(), k.clone()
    q_ptr, k_ptr = q.data_ptr(), k.data_ptr()
    with opforge.backend(backend):
        qo, ko = opforge.rotary_embedding(q, k, cos, sin, pos, inplace=True)
    assert qo is q and ko is k and q.data_ptr() == q_ptr and k.data_ptr() == k_ptr
    ref_q, ref_k = cases.rotary_oracle((q0, k0, cos, sin, pos), {})
    assert max_rel_error((q, k), (ref_q, ref_k)) <= TOLERANCE[torch.bfloat16]
    assert torch.equal(q[..., r:], q0[..., r:])


@pytest.mark.parametrize("backend", BACKENDS)
def test_rotation_keeps_norms_and_position_zero_is_identity(backend):
    q, k, cos, sin, _ = cases.make_rotary_inputs(1, 2, 2, 5, 32, 32, torch.float32, DEVICE)
    with opforge.backend(backend):
        qo, ko = opforge.rotary_embedding(q, k, cos, sin, torch.zeros(5, dtype=torch.int64, device=DEVICE))
        q1, _ = opforge.rotary_embedding(q, k, cos, sin, torch.arange(5, device=DEVICE) + 3)
    assert torch.equal(qo, q) and torch.equal(ko, k)
    assert torch.allclose(q1.norm(dim=-1), q.norm(dim=-1), rtol=1e-5)


def test_out_of_range_positions_raise_on_cpu_before_writing():
    q, k, cos, sin, pos = cases.make_rotary_inputs(1, 2, 1, 3, 8, 8, torch.float32, "cpu", max_positions=10)
    q0 = q.clone()
    for bad in (10, -1):
        pos[0, 1] = bad
        with pytest.raises(IndexError, match=f"positions must be in \\[0, 10\\).*got {bad}"):
            opforge.rotary_embedding(q, k, cos, sin, pos, inplace=True)
    assert torch.equal(q, q0)


def test_out_of_range_position_kernel_writes_zeros():
    """The GPU contract (no check): rotated features of an out-of-range token are 0, no OOB read."""
    from opforge.ops.rotary import triton_kernels
    from opforge.ops.rotary.problem import RotaryCall, prepare_rotary

    q, k, cos, sin, pos = cases.make_rotary_inputs(1, 2, 1, 3, 8, 4, torch.float32, DEVICE, max_positions=10)
    call = prepare_rotary(q, k, cos, sin, pos)
    bad = pos.clone()
    bad[0, 1] = 10
    call = RotaryCall(call.problem, q, k, cos, sin, bad, False)
    qo, ko = triton_kernels.launch_rotary(call)
    assert torch.all(qo[0, :, 1, :4] == 0) and torch.equal(qo[0, :, 1, 4:], q[0, :, 1, 4:])
    ref = reference.rotate(q.double(), cos.double(), sin.double(), bad)
    assert max_rel_error(qo, ref) <= 1e-6


@pytest.mark.parametrize("backend", BACKENDS)
def test_errors_name_the_argument(backend):
    q, k, cos, sin, pos = cases.make_rotary_inputs(2, 4, 2, 3, 16, 16, torch.float16, DEVICE)
    f = opforge.rotary_embedding
    with opforge.backend(backend):
        with pytest.raises(TypeError, match="k must have q's dtype"):
            f(q, k.float(), cos, sin, pos)
        with pytest.raises(TypeError, match="q must be float32"):
            f(q.int(), k, cos, sin, pos)
        with pytest.raises(ValueError, match="q must be 4-d"):
            f(q[0], k, cos, sin, pos)
        with pytest.raises(ValueError, match="k must be \\(B=2, Hkv, S=3, D=16\\)"):
            f(q, k[..., :8], cos, sin, pos)
        with pytest.raises(TypeError, match="cos must be a float32 table"):
            f(q, k, cos.half(), sin, pos)
        with pytest.raises(ValueError, match="sin must have cos's shape"):
            f(q, k, cos, sin[:, :4], pos)
        big = torch.zeros(64, 10, device=DEVICE)
        with pytest.raises(ValueError, match="rotary dim R = 2 \\* cos.shape\\[1\\] = 20 exceeds the head dim D = 16"):
            f(q, k, big, big, pos)
        with pytest.raises(TypeError, match="positions must be int32 or int64"):
            f(q, k, cos, sin, pos.float())
        with pytest.raises(ValueError, match="positions must have shape \\(B, S\\)"):
            f(q, k, cos, sin, pos[:, :2])
        with pytest.raises(ValueError, match="q must have a contiguous last dimension"):
            f(q.transpose(2, 3), k.transpose(2, 3), cos[:, :1], sin[:, :1], pos)


def test_odd_rotary_dim_is_impossible_and_empty_inputs():
    # R = 2 * cos.shape[1] is even by construction; an empty table column count is refused
    q, k, cos, sin, pos = cases.make_rotary_inputs(1, 2, 1, 3, 8, 8, torch.float32, "cpu")
    with pytest.raises(ValueError, match="at least one column"):
        opforge.rotary_embedding(q, k, cos[:, :0], sin[:, :0], pos)
    e = torch.empty(1, 2, 0, 8)
    qo, ko = opforge.rotary_embedding(e, e[:, :1], cos, sin, torch.empty(0, dtype=torch.int64))
    assert qo.shape == e.shape and ko.shape == (1, 1, 0, 8)


def test_trace_and_explain():
    q, k, cos, sin, pos = cases.make_rotary_inputs(1, 2, 1, 3, 8, 4, torch.float16, DEVICE)
    with opforge.trace() as t:
        opforge.rotary_embedding(q, k, cos, sin, pos)
    assert len(t) == 1 and t[0].op == "rotary_embedding" and t[0].shape == tuple(q.shape)
    text = str(opforge.explain("rotary_embedding", q, k, cos, sin, pos, interleaved=True))
    assert "R=4 interleaved" in text and "chosen:" in text


def test_strict_mode_raises_for_float64_on_triton():
    q, k, cos, sin, pos = cases.make_rotary_inputs(1, 2, 1, 3, 8, 8, torch.float64, DEVICE)
    with opforge.backend("triton"), pytest.raises(opforge.NoKernelError, match="float64"):
        opforge.rotary_embedding(q, k, cos, sin, pos)


@pytest.mark.skipif(DEVICE != "cuda", reason="needs CUDA")
def test_decode_and_prefill_sizes_on_gpu():
    for shape in [(64, 32, 8, 1, 128), (1, 32, 8, 512, 128)]:
        for dt in DTYPES:
            check_case(cases.make_rotary_case(shape, dt), "triton")
            check_case(cases.make_rotary_case(shape, dt, r=64, interleaved=True, layout="transposed"), "triton")


def test_device_mismatch_names_the_argument():
    q, k, cos, sin, pos = cases.make_rotary_inputs(1, 2, 1, 3, 8, 8, torch.float32, "cpu")
    with pytest.raises(ValueError, match="k is on meta but q is on cpu"):
        opforge.rotary_embedding(q, k.to("meta"), cos, sin, pos)
    with pytest.raises(ValueError, match="cos is on meta"):
        opforge.rotary_embedding(q, k, cos.to("meta"), sin, pos)
    with pytest.raises(ValueError, match="positions is on meta"):
        opforge.rotary_embedding(q, k, cos, sin, pos.to("meta"))
    kc = torch.zeros(1, 1, 5, 8)
    with pytest.raises(ValueError, match="v_cache is on meta but k_cache is on cpu"):
        opforge.kv_cache_append(kc, kc.to("meta"), k, k, torch.zeros(1, dtype=torch.int32))
    with pytest.raises(ValueError, match="cache_seqlens is on meta"):
        opforge.kv_cache_append(kc, kc, k, k, torch.zeros(1, dtype=torch.int32, device="meta"))


@pytest.mark.parametrize("backend", BACKENDS)
def test_repeated_signature_skips_validation_but_not_the_checks(backend):
    """A second call with a validated signature takes the short path: same results, CPU value
    checks and flag types still enforced, and a new signature is validated again."""
    import opforge.ops.rotary as rotary
    from opforge.ops.rotary.problem import rotary_signature

    for _ in range(2):
        q, k, cos, sin, pos = cases.make_rotary_inputs(2, 4, 2, 3, 16, 8, torch.float16, DEVICE, max_positions=10)
        with opforge.backend(backend):
            got = opforge.rotary_embedding(q, k, cos, sin, pos, interleaved=True)
        want = cases.rotary_oracle((q, k, cos, sin, pos), {"interleaved": True})
        assert max_rel_error(got, want) <= TOLERANCE[torch.float16]
    assert rotary_signature(q, k, cos, sin, pos, True, False) in rotary._valid_rotary
    with pytest.raises(TypeError, match="interleaved and inplace must be bools"):
        opforge.rotary_embedding(q, k, cos, sin, pos, interleaved=1)
    with pytest.raises(TypeError, match="positions must be int32 or int64"):
        opforge.rotary_embedding(q, k, cos, sin, pos.float(), interleaved=True)
    if DEVICE == "cpu":   # positions are value-checked on CPU tensors only
        pos[0, 0] = 10
        with pytest.raises(IndexError, match="positions must be in \\[0, 10\\)"):
            opforge.rotary_embedding(q, k, cos, sin, pos, interleaved=True)
