"""Bad input, empty and 0-d input, trace, explain, strict mode and fallback for softmax / log_softmax."""
import re

import pytest
import torch

import opforge
from opforge.ops.softmax import log_softmax, reference, softmax
from opforge.ops.softmax.problem import FEW_ROWS
from opforge.testing import DEVICE, max_rel_error

BACKENDS = ["triton", "torch"]
FNS = {"softmax": softmax, "log_softmax": log_softmax}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", FNS)
def test_bad_input_errors_name_the_argument(backend, op):
    fn = FNS[op]
    x = torch.randn(4, 16, device=DEVICE)
    with opforge.backend(backend):
        for bad_dtype in (torch.int64, torch.int32, torch.bool, torch.uint8):
            with pytest.raises(TypeError, match="x must be float32, float16 or bfloat16"):
                fn(torch.ones(4, 16, dtype=bad_dtype, device=DEVICE))
        with pytest.raises(TypeError, match="x must be a torch.Tensor"):
            fn([1.0, 2.0])
        with pytest.raises(IndexError, match=re.escape("dim must be in [-2, 1] for a 2-d x, got 2")):
            fn(x, dim=2)
        with pytest.raises(IndexError, match="dim must be in"):
            fn(x, dim=-3)
        with pytest.raises(TypeError, match="dim must be an int, got float"):
            fn(x, dim=1.0)
        with pytest.raises(TypeError, match="dim must be an int, got bool"):
            fn(x, dim=True)
        with pytest.raises(TypeError, match="dim must be an int, got NoneType"):
            fn(x, dim=None)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", FNS)
@pytest.mark.parametrize("shape,dim", [((0, 3, 32), -1), ((4, 0), -1), ((4, 0), 0), ((0,), 0)])
def test_empty_input_returns_empty(backend, op, shape, dim):
    x = torch.randn(shape, device=DEVICE)
    with opforge.backend(backend):
        out = FNS[op](x, dim=dim)
    assert out.shape == x.shape and out.dtype == x.dtype
    assert out.shape == getattr(torch, op)(x, dim=dim).shape


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", FNS)
def test_zero_dim_tensor_like_torch(backend, op):
    x = torch.tensor(3.5, device=DEVICE)
    with opforge.backend(backend):
        for dim in (0, -1):
            out = FNS[op](x, dim=dim)
            assert out.shape == () and torch.equal(out, getattr(torch, op)(x, dim=dim))
        with pytest.raises(IndexError, match="dim must be in"):
            FNS[op](x, dim=1)


def test_one_dim_input():
    x = torch.randn(300, device=DEVICE, dtype=torch.float16)
    with opforge.backend("triton"):
        y = softmax(x, dim=0)
    assert max_rel_error(y, reference.softmax(x.double())) < 2e-3


def test_inputs_are_not_modified():
    x = torch.randn(3, 64, device=DEVICE)
    x0 = x.clone()
    with opforge.backend("triton"):
        softmax(x)
        log_softmax(x, dim=0)
    assert torch.equal(x, x0)


def test_result_of_other_dim_has_x_shape_and_values():
    x = torch.randn(6, 5, 7, device=DEVICE)
    with opforge.backend("triton"):
        y = softmax(x, dim=1)
    assert y.shape == x.shape
    assert torch.allclose(y.sum(dim=1), torch.ones(6, 7, device=DEVICE), atol=1e-6)
    assert max_rel_error(y, torch.softmax(x.double(), dim=1)) < 1e-6


def test_trace_records_each_call():
    x = torch.randn(2, 3, 96, device=DEVICE, dtype=torch.bfloat16)
    with opforge.backend("triton"), opforge.trace() as t:
        softmax(x)
        log_softmax(x, dim=1)
    assert [e.op for e in t] == ["softmax", "log_softmax"]
    e = t[0]
    assert (e.backend, e.variant, e.device, e.dtype, e.shape, e.note) == \
        ("triton", "multirow", str(x.device), "bfloat16", (2, 3, 96), "")
    assert "dim 1" in t[1].note and "copied" in t[1].note
    assert "softmax" in str(t) and "2x3x96" in str(t)


def test_explain_names_choice_and_rejections():
    x = torch.randn(2, 40000, device=DEVICE, dtype=torch.float32)
    with opforge.backend("triton"):
        e = opforge.explain("softmax", x)
    assert e.chosen.qualified_name == "triton.split"
    reasons = {v.qualified_name: r for v, r in e.rejected}
    assert reasons["triton.multirow"] == "N=40000 > 1024"
    assert "spill registers" in reasons["triton.row"]
    assert "comes first" in reasons["triton.looped"]
    assert "another backend is forced" in reasons["torch.reference"]
    with opforge.backend("triton"):
        many = opforge.explain("log_softmax", torch.randn(FEW_ROWS + 1, 40000, device=DEVICE), dim=-1)
    assert many.chosen.qualified_name == "triton.looped"
    assert "keep the GPU busy" in dict((v.qualified_name, r) for v, r in many.rejected)["triton.split"]


def test_explain_on_cpu_prefers_torch_without_fallback():
    e = opforge.explain("softmax", torch.randn(2, 64))
    assert e.chosen.qualified_name == "torch.reference"
    assert e.note == ""


def test_float64_on_triton_backend_is_refused_clearly():
    x = torch.randn(4, 16, dtype=torch.float64, device=DEVICE)
    with opforge.backend("triton"), pytest.raises(opforge.NoKernelError, match="float64 runs on the torch path"):
        softmax(x)


def test_row_counts_beyond_int32_are_refused_by_triton():
    from opforge.ops.softmax import triton_kernels as tk
    from opforge.ops.softmax.problem import MAX_ROWS, SoftmaxProblem

    huge = SoftmaxProblem("softmax", torch.float32, 1, MAX_ROWS + 1, "cuda")
    fine = SoftmaxProblem("softmax", torch.float32, 1, MAX_ROWS, "cuda")
    assert huge.key != fine.key
    for supports in (tk.supports_multirow, tk.supports_row, tk.supports_split, tk.supports_looped):
        assert "rows below" in supports(huge)
    assert tk.supports_multirow(fine) is None
