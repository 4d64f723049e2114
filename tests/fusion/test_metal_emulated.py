"""The generated MSL through the Metal emulator (tests/metal_emu), on CPU tensors: the kernels a
Mac runs, checked against the float64 oracle like the hand-written Metal kernels."""
import pytest
import torch
import torch.nn.functional as F

import opforge
from opforge.fusion import erf, exp, fuse, log, maximum, minimum, rsqrt, sigmoid, sqrt, tanh, where
from opforge.runtime.metal import library as metal_runtime

from fusion_helpers import check


@pytest.fixture(autouse=True)
def emulate(monkeypatch):
    reason = metal_runtime.emulator_unavailable_reason()
    if reason:
        pytest.skip(reason)
    monkeypatch.setenv("OPFORGE_METAL_EMULATE", "1")


def bias_gelu_residual(x, b, r, scale: float):
    return F.gelu(x + b) * scale + r


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_bias_gelu_residual(dtype):
    f = fuse(bias_gelu_residual)
    args = (torch.randn(9, 70).to(dtype), torch.randn(70).to(dtype), torch.randn(9, 70).to(dtype), 0.5)
    check(f, bias_gelu_residual, args, "metal")
    with opforge.trace() as t, opforge.backend("metal"):
        f(*args)
    assert t[0].backend == "metal" and "kernel void" in f.source("cpu")


def test_math_special_values_and_erf_tanh_range():
    x = torch.cat([torch.linspace(-12, 12, 601), torch.logspace(-8, 1, 100), -torch.logspace(-8, 1, 100),
                   torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0])])
    g = lambda x: (erf(x), tanh(x), sigmoid(x), exp(x * 0.1), log(abs(x)), sqrt(abs(x)), rsqrt(abs(x)),
                   minimum(x, 0.25), maximum(x, float("nan")), x ** 2, where(x > 0, x, -float("inf")))
    eager = lambda x: (torch.erf(x), torch.tanh(x), torch.sigmoid(x), torch.exp(x * 0.1), torch.log(x.abs()),
                       x.abs().sqrt(), x.abs().rsqrt(), torch.clamp(x, max=0.25),
                       torch.maximum(x, torch.full_like(x, float("nan"))), x ** 2,
                       torch.where(x > 0, x, -float("inf")))
    out = check(fuse(g), eager, (x,), "metal", factor=3)
    finite = torch.isfinite(x)
    for o, ref in zip(out[:2], (torch.erf(x.double()), torch.tanh(x.double()))):
        rel = ((o.double() - ref).abs() / ref.abs().clamp_min(1e-30))[finite].max().item()
        assert rel < 2e-6


def test_layouts_numbers_and_integer_outputs():
    def g(x, y, z, host, n, flag):
        h = x * y + z * host
        return h, where(flag, h, -h) * n, h > 0, (x * 4).int(), (h > 0) & ~(y < 0)
    x = torch.randn(8, 6).t()                 # strided
    y = torch.randn(6, 1)                     # a column
    z = torch.randn(8)                        # a row
    args = (x, y, z, torch.tensor(2.5), 3, False)
    out = check(fuse(g), g, args, "metal")
    assert out[2].dtype == torch.bool and out[3].dtype == torch.int32
