"""The norms' torch path: PyTorch's fused F.rms_norm / F.layer_norm for float32 and half inputs,
the careful composite for float64 (the oracle), and the CPU launch plans that go straight to the
fused functions."""
import pytest
import torch
import torch.nn.functional as F

import opforge
from opforge.ops.norm import reference
from opforge.ops.norm.problem import OPS, PLANS
from opforge.runtime import plans
from opforge.testing import TOLERANCE, max_rel_error


def args(op, dtype, rows=3, n=96, weight_dtype=None, offset=0.0):
    x = (torch.randn(rows, n) + offset).to(dtype)
    residual = torch.randn(rows, n).to(dtype) if op.startswith("add_") else None
    wd = weight_dtype or dtype
    weight = (1 + 0.5 * torch.randn(n)).to(wd)
    bias = (0.5 * torch.randn(n)).to(wd) if "layer" in op else None
    return x, residual, weight, bias, 1e-5


def upcast(values):
    return tuple(v.double() if isinstance(v, torch.Tensor) else v for v in values)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("weight_dtype", [None, torch.float32])
def test_fast_form_matches_the_careful_oracle(op, dtype, weight_dtype):
    a = args(op, dtype, weight_dtype=weight_dtype)
    out = reference.fast_run(op, *a)
    ref = reference.careful_run(op, *upcast(a))
    assert max_rel_error(out, ref) <= TOLERANCE[dtype]
    for o in (out if isinstance(out, tuple) else (out,)):
        assert o.dtype == dtype and o.shape == a[0].shape


@pytest.mark.parametrize("op", OPS)
def test_run_picks_the_careful_form_for_float64_and_the_fused_one_otherwise(op):
    a64 = args(op, torch.float64)
    assert max_rel_error(reference.run(op, *a64), reference.careful_run(op, *a64)) == 0.0
    a32 = args(op, torch.float32)
    x = a32[0] + a32[1] if op.startswith("add_") else a32[0]
    if "layer" in op:   # float32: the row mean subtracted first (see the next test)
        expect = F.layer_norm(x - x.mean(-1, keepdim=True), (x.shape[-1],), a32[2], a32[3], a32[4])
    else:
        expect = F.rms_norm(x, (x.shape[-1],), a32[2], a32[4])
    out = reference.run(op, *a32)
    assert torch.equal(out[0] if isinstance(out, tuple) else out, expect)


@pytest.mark.parametrize("op", ["layer_norm", "add_layer_norm"])
@pytest.mark.parametrize("offset", [1e3, 1e4])
def test_both_forms_keep_every_digit_of_rows_with_a_large_mean(op, offset):
    # F.layer_norm alone loses ~3e-4 here in float32; the fast form centres the rows first, the
    # careful one subtracts the mean twice (as the kernels do).
    x, residual, weight, bias, eps = a = args(op, torch.float32, rows=2, n=1500, offset=offset)
    # the oracle normalizes the sum as stored (rounded to float32), as the op's contract says
    total = x if residual is None else x + residual
    ref = reference.layer_norm(total.double(), weight.double(), bias.double(), eps)
    for out in (reference.careful_run(op, *a), reference.fast_run(op, *a)):
        assert max_rel_error(out if residual is None else out[0], ref) < 1e-6


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_repeated_cpu_call_runs_the_torch_plan(op, dtype):
    if not plans.enabled():
        pytest.skip("launch plans are off (OPFORGE_PLANS=0)")
    fn = getattr(opforge, op)
    x, residual, weight, bias, eps = args(op, dtype, rows=1, n=576)
    call = (lambda: fn(x, residual, weight, bias, eps)) if op == "add_layer_norm" else \
        (lambda: fn(x, residual, weight, eps)) if op == "add_rms_norm" else \
        (lambda: fn(x, weight, bias, eps)) if op == "layer_norm" else (lambda: fn(x, weight, eps))
    PLANS.clear()
    first = call()
    assert len(PLANS) == 1
    second = call()
    assert max_rel_error(second, first) == 0.0
    ref = reference.careful_run(op, *upcast((x, residual, weight, bias, eps)))
    assert max_rel_error(second, ref) <= TOLERANCE[dtype]
    with opforge.trace() as t:                                  # traced calls take the general path
        call()
    assert len(t) == 1 and t[0].backend == "torch"


def test_the_torch_plan_refuses_a_bad_eps_and_the_general_path_names_it():
    x, w = torch.randn(2, 64), torch.ones(64)
    opforge.rms_norm(x, w, 1e-6)
    opforge.rms_norm(x, w, 1e-6)
    with pytest.raises(ValueError, match="eps"):
        opforge.rms_norm(x, w, -1.0)


def test_no_plan_for_float64():
    PLANS.clear()
    opforge.rms_norm(torch.randn(2, 64, dtype=torch.float64))
    assert len(PLANS) == 0
