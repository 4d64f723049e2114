"""``linear(..., activation="swiglu")``: a gate|up projection and SwiGLU, on every path, against
float64 (``silu(h1) * h2`` of the two halves of ``x @ w.T + bias``)."""
import pytest
import torch

import opforge
from opforge.ops.quant import dense_gemv as dg, repack
from opforge.testing import DEVICE, TOLERANCE, rel_error

F_, K = 40, 256          # 40 features: gate and up rows 80, not a multiple of the tiles


def oracle(x, w, bias=None):
    wd = w.dequantize(torch.float64) if isinstance(w, opforge.QuantizedWeight) else w.double()
    h = x.double() @ wd.T
    if bias is not None:
        h = h + bias.double()
    return torch.nn.functional.silu(h[..., :F_]) * h[..., F_:]


def traced(backend, *args, **kwargs):
    with opforge.backend(backend), opforge.trace() as t:
        y = opforge.linear(*args, **kwargs)
    return y, [(e.op, e.backend, e.variant) for e in t]


@pytest.mark.parametrize("layout", ["rows", "planes"])
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("m", [1, 3, 20])
def test_quantized_paths(bits, layout, m):
    """The quantized kernels write the product, then ``swiglu`` runs (its own traced op)."""
    if layout == "planes" and bits == 8:
        pytest.skip("the planes layout holds int4 codes only")
    dtype = torch.bfloat16 if m % 2 else torch.float16
    qw = opforge.quantize_weight(torch.randn(2 * F_, K, device=DEVICE) * 0.05, bits, 128)
    if layout == "planes":
        qw = repack(qw, "planes")
    x = torch.randn(m, K, device=DEVICE, dtype=dtype)
    bias = torch.randn(2 * F_, device=DEVICE, dtype=dtype)
    y, events = traced("triton", x, qw, bias, activation="swiglu")
    assert y.shape == (m, F_) and y.dtype == dtype
    # the product is rounded to 16 bits before swiglu rounds again (the interpreter's bf16 stores
    # truncate): twice the one-rounding tolerance
    assert rel_error(y, oracle(x, qw, bias)) < 2 * TOLERANCE[dtype]
    assert sorted(e[0] for e in events) == ["linear", "swiglu"]      # nested: swiglu is recorded first
    assert all(e[1] == "triton" for e in events)


@pytest.mark.parametrize("config", [(4, 64, 1, 1), (16, 128, 4, 8)])
def test_dense_gemv_applies_swiglu(config):
    """(16, 128, 4, 8) would split K: with SwiGLU it runs unsplit (a program needs whole sums)."""
    w = torch.randn(2 * F_, K + 24, device=DEVICE, dtype=torch.bfloat16)[:, :K]
    x = torch.randn(1, K, device=DEVICE, dtype=torch.bfloat16)
    bias = torch.randn(2 * F_, device=DEVICE, dtype=torch.bfloat16)
    out = dg.dense_gemv(x, w, bias, config=config, swiglu=True)
    assert out.shape == (1, F_)
    assert rel_error(out, oracle(x, w, bias)) < TOLERANCE[torch.bfloat16]
    with pytest.raises(ValueError, match="one row of x and an even N"):
        dg.dense_gemv(x.expand(2, K).contiguous(), w, swiglu=True)


@pytest.mark.parametrize("m", [1, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_torch_path_and_dense_weights(m, dtype):
    w = torch.randn(2 * F_, K, device=DEVICE, dtype=dtype)
    x = torch.randn(m, 1, K, device=DEVICE, dtype=dtype)
    y = opforge.linear(x, w, activation="swiglu")
    assert y.shape == (m, 1, F_)
    assert rel_error(y, oracle(x, w)) < TOLERANCE[dtype]
    qw = opforge.quantize_weight(w.float(), 4, 64)
    with opforge.backend("torch"):
        y = opforge.linear(x, qw, activation="swiglu")
    assert rel_error(y, oracle(x, qw)) < TOLERANCE[dtype]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="linear sends dense one-row calls to the GEMV on CUDA only")
def test_linear_fuses_swiglu_into_the_dense_gemv_for_one_row():
    w = torch.randn(2 * 2048, 1024, device="cuda", dtype=torch.bfloat16) * 0.05
    x = torch.randn(1, 1, 1024, device="cuda", dtype=torch.bfloat16)
    with opforge.trace() as t:
        y = opforge.linear(x, w, activation="swiglu")
        y4 = opforge.linear(x.expand(4, 1, 1024), w, activation="swiglu")
    assert [(e.op, e.backend, e.variant) for e in t][0] == ("linear", "triton", "dense_gemv")
    assert sorted(e.op for e in t[1:]) == ["linear", "swiglu"]                 # cuBLAS, then swiglu
    h = x.double() @ w.double().T
    want = torch.nn.functional.silu(h[..., :2048]) * h[..., 2048:]
    assert rel_error(y, want) < TOLERANCE[torch.bfloat16]
    assert rel_error(y4, want.expand(4, 1, 2048)) < 2 * TOLERANCE[torch.bfloat16]


def test_bad_activations_raise_before_anything_runs():
    qw = opforge.quantize_weight(torch.randn(2 * F_ + 1, K, device=DEVICE), 8, 128)
    x = torch.randn(2, K, device=DEVICE, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="an even N"):
        opforge.linear(x, qw, activation="swiglu")
    with pytest.raises(ValueError, match="activation must be None or one of swiglu"):
        opforge.linear(x, torch.randn(8, K, device=DEVICE, dtype=torch.bfloat16), activation="gelu")
