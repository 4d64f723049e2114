"""Bad input (errors name the argument, nothing is written), empty input, trace, explain, strict mode
and fallback for attention and decode_attention."""
import re
import warnings

import pytest
import torch

import opforge
from opforge.ops.attention import check_cache_seqlens
from opforge.ops.attention.problem import CHECK_SEQLENS_ENV
from opforge.testing import DEVICE, ON_GPU

BACKENDS = ["triton", "torch"]


def qkv(b=2, hq=4, hkv=2, sq=3, sk=5, d=64, dtype=torch.float32):
    return (torch.randn(b, hq, sq, d, device=DEVICE, dtype=dtype), torch.randn(b, hkv, sk, d, device=DEVICE, dtype=dtype),
            torch.randn(b, hkv, sk, d, device=DEVICE, dtype=dtype))


def lens(*values, dtype=torch.int32):
    return torch.tensor(values, dtype=dtype, device=DEVICE)


@pytest.mark.parametrize("backend", BACKENDS)
def test_prefill_errors_name_the_argument(backend):
    q, k, v = qkv()
    bad = [
        (dict(q=q, k=k[:1], v=v), ValueError, "k has batch 1 but q has batch 2"),
        (dict(q=q, k=k, v=v[:1]), ValueError, "v has batch 1 but q has batch 2"),
        (dict(q=q[:, :3], k=k, v=v), ValueError, "q has 3 heads, which is not a multiple of the 2 heads of k and v"),
        (dict(q=q, k=k[..., :32], v=v), ValueError, "k has head_dim 32 but q has head_dim 64"),
        (dict(q=q, k=k, v=v[..., :32]), ValueError, "v has head_dim 32 but q has head_dim 64"),
        (dict(q=q, k=k.half(), v=v), TypeError, "k is torch.float16 but q is torch.float32"),
        (dict(q=q, k=k, v=v.bfloat16()), TypeError, "v is torch.bfloat16 but q is torch.float32"),
        (dict(q=q, k=k, v=v[:, :, :4]), ValueError, "v has sequence length 4 but k has 5"),
        (dict(q=q, k=k, v=v[:, :1]), ValueError, "v has 1 heads but k has 2"),
        (dict(q=q.int(), k=k, v=v), TypeError, "q must be float32, float16 or bfloat16"),
        (dict(q=q[0], k=k, v=v), ValueError, "q must be 4-d"),
        (dict(q=[1.0], k=k, v=v), TypeError, "q must be a torch.Tensor"),
        (dict(q=q, k=k, v=v, causal=1), TypeError, "causal must be a bool"),
        (dict(q=q, k=k, v=v, scale="x"), TypeError, "scale must be a real number"),
        (dict(q=q, k=k, v=v, scale=float("nan")), ValueError, "scale must be finite"),
    ]
    with opforge.backend(backend):
        for kwargs, exc, msg in bad:
            args = (kwargs.pop("q"), kwargs.pop("k"), kwargs.pop("v"))
            with pytest.raises(exc, match=re.escape(msg)):
                opforge.attention(*args, **kwargs)


@pytest.mark.skipif(not ON_GPU, reason="needs a second device type")
def test_prefill_device_mismatch():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="k is on cpu but q is on cuda"):
        opforge.attention(q, k.cpu(), v)


def test_device_mismatch_on_cpu_via_meta():
    q, k, v = (torch.randn(1, 2, 3, 16) for _ in range(3))
    with pytest.raises(ValueError, match="v is on meta but q is on cpu"):
        opforge.attention(q, k, v.to("meta"))
    with pytest.raises(ValueError, match="cache_seqlens is on meta but q is on cpu"):
        opforge.decode_attention(q[:, :, :1], k, v, torch.ones(1, dtype=torch.int32, device="meta"))
    with pytest.raises(ValueError, match="k_cache is on meta but q is on cpu"):
        opforge.decode_attention(q[:, :, :1], k.to("meta"), v, torch.ones(1, dtype=torch.int32))


@pytest.mark.parametrize("backend", BACKENDS)
def test_decode_errors_name_the_argument(backend):
    q, kc, vc = qkv(sq=1, sk=8)
    ok = lens(8, 3)
    bad = [
        ((q, kc[:1], vc, ok), ValueError, "k_cache has batch 1 but q has batch 2"),
        ((q[:, :3], kc, vc, ok), ValueError, "q has 3 heads, which is not a multiple of the 2 heads of k_cache"),
        ((q, kc, vc[..., :32], ok), ValueError, "v_cache has head_dim 32 but q has head_dim 64"),
        ((q, kc, vc.half(), ok), TypeError, "v_cache is torch.float16 but q is torch.float32"),
        ((q, kc, vc[:, :, :4], ok), ValueError, "v_cache has sequence length 4 but k_cache has 8"),
        ((torch.randn(2, 4, 17, 64, device=DEVICE), kc, vc, ok), ValueError, "q has 17 queries per sequence"),
        ((q, kc, vc, ok.float()), TypeError, "cache_seqlens must be int32 or int64, got torch.float32"),
        ((q, kc, vc, ok.short()), TypeError, "cache_seqlens must be int32 or int64"),
        ((q, kc, vc, lens(8, 3, 1)), ValueError, "cache_seqlens must have shape (2,)"),
        ((q, kc, vc, ok[None]), ValueError, "cache_seqlens must have shape (2,)"),
        ((q, kc, vc, [8, 3]), TypeError, "cache_seqlens must be a torch.Tensor"),
    ]
    if DEVICE == "cpu":  # values are checked on CPU tensors (on CUDA only with OPFORGE_CHECK_SEQLENS=1)
        bad += [((q, kc, vc, lens(9, 3)), ValueError, "cache_seqlens must lie in [0, S_max=8]; got values in [3, 9]"),
                ((q, kc, vc, lens(-1, 3, dtype=torch.int64)), ValueError, "cache_seqlens must lie in [0, S_max=8]")]
    with opforge.backend(backend):
        for args, exc, msg in bad:
            with pytest.raises(exc, match=re.escape(msg)):
                opforge.decode_attention(*args)


def test_check_cache_seqlens_on_request(monkeypatch):
    with pytest.raises(ValueError, match=re.escape("got values in [-2, 5]")):
        check_cache_seqlens(torch.tensor([5, -2]), 8)
    check_cache_seqlens(torch.tensor([0, 8]), 8)
    if ON_GPU:
        q, kc, vc = qkv(sq=1, sk=8)
        opforge.decode_attention(q, kc, vc, lens(9, 3))       # not read on the host: clamped in the kernel
        monkeypatch.setenv(CHECK_SEQLENS_ENV, "1")
        with pytest.raises(ValueError, match="cache_seqlens must lie in"):
            opforge.decode_attention(q, kc, vc, lens(9, 3))


def test_errors_write_nothing():
    q, k, v = qkv()
    before = [t.clone() for t in (q, k, v)]
    with pytest.raises(ValueError):
        opforge.attention(q, k, v[:, :, :4])
    with pytest.raises(ValueError):
        opforge.decode_attention(q[:, :, :1], k, v, lens(5, 5, 5))
    assert all(torch.equal(a, b) for a, b in zip(before, (q, k, v)))


@pytest.mark.parametrize("backend", BACKENDS)
def test_empty_inputs(backend):
    with opforge.backend(backend):
        q, k, v = qkv(sq=0)
        assert opforge.attention(q, k, v).shape == (2, 4, 0, 64)
        q, k, v = qkv(b=0)
        assert opforge.attention(q, k, v, causal=True).shape == (0, 4, 3, 64)
        q, k, v = qkv(sk=0)
        out = opforge.attention(q, k, v)   # no keys: every row sees nothing -> zeros
        assert torch.equal(out, torch.zeros_like(out))
        q, kc, vc = qkv(sq=1, sk=0)
        out = opforge.decode_attention(q, kc, vc, lens(0, 0))
        assert torch.equal(out, torch.zeros_like(out))


@pytest.mark.skipif(DEVICE != "cpu", reason="interpreter run")
def test_trace_and_explain_name_the_kernel():
    q, k, v = qkv(dtype=torch.float16)
    with opforge.backend("triton"), opforge.trace() as t:
        opforge.attention(q, k, v, causal=True)
        opforge.decode_attention(q[:, :, :1], k, v, lens(5, 2))
    assert [(e.op, e.backend, e.variant) for e in t] == [("attention", "triton", "prefill"),
                                                         ("decode_attention", "triton", "split_kv")]
    text = str(opforge.explain("attention", q, k, v, causal=True))
    assert "attention on q float16 (B=2, Hq=4, Sq=3, D=64)" in text and "causal" in text
    with opforge.backend("triton"):
        text = str(opforge.explain("decode_attention", q[:, :, :1], k, v, lens(5, 2)))
    assert "chosen: triton.split_kv" in text


def test_large_head_dim_has_no_triton_kernel():
    q, k, v = qkv(d=288, sq=2, sk=3)
    with opforge.backend("triton"):
        with pytest.raises(opforge.NoKernelError, match="head_dim 288 > 256"):
            opforge.attention(q, k, v)
    if ON_GPU:  # the default selection falls back with a warning, strict mode raises
        with pytest.warns(opforge.FallbackWarning), opforge.trace() as t:
            opforge.attention(q, k, v)
        assert t[0].backend == "torch" and "fallback" in t[0].note
        with opforge.strict(), pytest.raises(opforge.NoKernelError):
            opforge.attention(q, k, v)
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            out = opforge.attention(q, k, v)   # CPU: the torch path is native, no warning
        assert out.shape == q.shape


def test_float64_runs_on_the_torch_path():
    q, k, v = qkv(dtype=torch.float64)
    with opforge.trace() as t:
        out = opforge.attention(q, k, v, causal=True)
    assert out.dtype == torch.float64 and t[0].backend == "torch"
    with opforge.backend("triton"), pytest.raises(opforge.NoKernelError, match="q is float64"):
        opforge.attention(q, k, v)
