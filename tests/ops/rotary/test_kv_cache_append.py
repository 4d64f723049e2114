"""kv_cache_append on the triton (interpreter on CPU) and torch backends."""
import pytest
import torch

import opforge
from opforge.ops.rotary import cases
from opforge.testing import DEVICE, check_case

BACKENDS = ["triton", "torch"]
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(3, 2, 1, 7, 16), (2, 3, 4, 9, 24)])
def test_matches_oracle_and_ends_at_cache_end(backend, dtype, shape):
    check_case(cases.make_append_case(shape, dtype), backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_strided_views(backend):
    check_case(cases.make_append_case((2, 3, 2, 6, 16), torch.bfloat16, layout="transposed"), backend)


def _inputs(b=2, h=2, s_new=3, s_max=8, d=8):
    kc = torch.randn(b, h, s_max, d, device=DEVICE)
    vc = torch.randn(b, h, s_max, d, device=DEVICE)
    k = torch.randn(b, h, s_new, d, device=DEVICE)
    v = torch.randn(b, h, s_new, d, device=DEVICE)
    return kc, vc, k, v


@pytest.mark.parametrize("backend", BACKENDS)
def test_only_the_new_positions_change(backend):
    kc, vc, k, v = _inputs()
    kc0, vc0 = kc.clone(), vc.clone()
    lens = torch.tensor([2, 5], dtype=torch.int64, device=DEVICE)
    with opforge.backend(backend):
        assert opforge.kv_cache_append(kc, vc, k, v, lens) is None
    for b, start in enumerate((2, 5)):
        assert torch.equal(kc[b, :, start:start + 3], k[b]) and torch.equal(vc[b, :, start:start + 3], v[b])
        keep = [i for i in range(8) if not start <= i < start + 3]
        assert torch.equal(kc[b, :, keep], kc0[b, :, keep]) and torch.equal(vc[b, :, keep], vc0[b, :, keep])
    assert lens.tolist() == [2, 5]   # the caller advances it


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("bad", [6, -1])
def test_one_past_the_end_raises_and_writes_nothing(backend, bad):
    kc, vc, k, v = _inputs()
    kc0, vc0 = kc.clone(), vc.clone()
    lens = torch.tensor([0, bad], dtype=torch.int32, device=DEVICE)
    with opforge.backend(backend), pytest.raises(IndexError, match=f"sequence 1 would write positions {bad}\\.\\."):
        opforge.kv_cache_append(kc, vc, k, v, lens)
    assert torch.equal(kc, kc0) and torch.equal(vc, vc0)


def test_unchecked_kernel_skips_out_of_range_positions():
    """With the host check off (the CUDA-graph path), positions past S_max are simply not written."""
    from opforge.ops.rotary import reference, triton_kernels
    from opforge.ops.rotary.problem import prepare_append

    kc, vc, k, v = _inputs()
    kc_ref, vc_ref = kc.clone(), vc.clone()
    lens = torch.tensor([6, 1], dtype=torch.int32, device=DEVICE)
    triton_kernels.launch_kv_append(prepare_append(kc, vc, k, v, lens))
    reference.kv_cache_append(kc_ref, vc_ref, k, v, lens)
    assert torch.equal(kc, kc_ref) and torch.equal(vc, vc_ref)
    assert torch.equal(kc[0, :, 6:], k[0, :, :2]) and torch.equal(kc[1, :, 1:4], k[1])


def test_errors_name_the_argument():
    kc, vc, k, v = _inputs()
    lens = torch.zeros(2, dtype=torch.int32, device=DEVICE)
    f = opforge.kv_cache_append
    with pytest.raises(TypeError, match="v_cache must have k_cache's dtype"):
        f(kc, vc.half(), k, v, lens)
    with pytest.raises(TypeError, match="k must have k_cache's dtype"):
        f(kc, vc, k.half(), v, lens)
    with pytest.raises(ValueError, match="k must be \\(B=2, Hkv=2, S_new, D=8\\)"):
        f(kc, vc, k[..., :4], v, lens)
    with pytest.raises(ValueError, match="v must have k's shape"):
        f(kc, vc, k, v[:, :, :2], lens)
    with pytest.raises(ValueError, match="v_cache must have k_cache's shape"):
        f(kc, vc[:, :, :7], k, v, lens)
    with pytest.raises(TypeError, match="cache_seqlens must be int32 or int64"):
        f(kc, vc, k, v, lens.float())
    with pytest.raises(ValueError, match="cache_seqlens must have shape \\(B,\\) = \\(2,\\)"):
        f(kc, vc, k, v, lens[:1])
    with pytest.raises(TypeError, match="k_cache must be float32"):
        f(kc.int(), vc.int(), k.int(), v.int(), lens)
    with pytest.raises(ValueError, match="k_cache must be 4-d"):
        f(kc[0], vc, k, v, lens)


def test_empty_append_is_a_no_op_and_trace():
    kc, vc, k, v = _inputs()
    kc0 = kc.clone()
    opforge.kv_cache_append(kc, vc, k[:, :, :0], v[:, :, :0], torch.tensor([8, 8], device=DEVICE))
    assert torch.equal(kc, kc0)
    with opforge.trace() as t:
        opforge.kv_cache_append(kc, vc, k, v, torch.tensor([0, 1], device=DEVICE))
    assert len(t) == 1 and t[0].op == "kv_cache_append"
    assert "k/v cache float32 D=8" in str(opforge.explain("kv_cache_append", kc, vc, k, v,
                                                             torch.tensor([0, 1], device=DEVICE), check=False))


@pytest.mark.skipif(DEVICE != "cuda", reason="needs CUDA")
def test_cuda_graph_capture_skips_the_check_and_masks():
    kc, vc, k, v = _inputs(s_max=4)
    lens = torch.tensor([0, 2], dtype=torch.int32, device=DEVICE)
    opforge.kv_cache_append(kc, vc, k[:, :, :1], v[:, :, :1], lens)   # warm up (compile) outside the graph
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        opforge.kv_cache_append(kc, vc, k, v, lens)
    lens.copy_(torch.tensor([1, 2], dtype=torch.int32))
    kc0 = kc.clone()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(kc[0, :, 1:4], k[0]) and torch.equal(kc[1, :, 2:4], k[1, :, :2])
    assert torch.equal(kc[1, :, :2], kc0[1, :, :2])


@pytest.mark.parametrize("backend", BACKENDS)
def test_repeated_signature_still_checks_the_range(backend):
    """The short path of a validated signature keeps the range check (check=True / CPU tensors)."""
    kc, vc, k, v = _inputs()
    lens = torch.tensor([0, 5], dtype=torch.int32, device=DEVICE)
    with opforge.backend(backend):
        opforge.kv_cache_append(kc, vc, k, v, lens)
        k2, v2 = torch.randn_like(k), torch.randn_like(v)
        opforge.kv_cache_append(kc, vc, k2, v2, lens)
        assert torch.equal(kc[0, :, :3], k2[0]) and torch.equal(vc[1, :, 5:], v2[1])
        lens[1] = 6
        kc0 = kc.clone()
        with pytest.raises(IndexError, match="sequence 1 would write positions 6"):
            opforge.kv_cache_append(kc, vc, k, v, lens, check=True)
        assert torch.equal(kc, kc0)
        with pytest.raises(TypeError, match="cache_seqlens must be int32 or int64"):
            opforge.kv_cache_append(kc, vc, k, v, lens.float())
