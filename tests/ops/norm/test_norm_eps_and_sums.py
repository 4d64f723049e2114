"""A non-default eps where it matters, and the fused residual add held to its exact contract.

Rows whose mean square (or variance) is far below eps are normalized mostly by eps, so an eps
added in the wrong place, or not passed to the kernel, changes them by percents; rows whose mean
square is large hide such a bug, so each check has both. The add+norm ops normalize the sum as
stored in the input's dtype: in float16/bfloat16 the checks below are per element, to within one
unit in the last place, where a norm-wise 2e-3 or 1e-2 tolerance would absorb a kernel that
normalized the unrounded float32 sum.
"""
import pytest
import torch

import opforge
from opforge.ops.norm import reference
from opforge.ops.norm.problem import OPS
from opforge.testing import DEVICE, rel_error

EPS = 1e-3
ROW_SCALES = (1e-3, 1e-2, 1.0, 30.0)        # mean squares 1e-6 .. 900 around eps = 1e-3
# One row length per variant of each backend: Triton multirow/row/looped at 77/2000/40000,
# Metal multirow/row/looped at 77/2000/5003; the torch path has one.
LENGTHS = {"torch": (77, 2000), "triton": (77, 2000, 40000), "metal": (77, 2000, 5003)}


def _rows(n: int, dtype: torch.dtype, offset: float = 0.0) -> torch.Tensor:
    scale = torch.tensor(ROW_SCALES, device=DEVICE)[:, None]
    return (offset + torch.randn(len(ROW_SCALES), n, device=DEVICE) * scale).to(dtype)


def _affine(op: str, n: int, dtype: torch.dtype = torch.float32) -> dict:
    kwargs = {"weight": (1 + 0.5 * torch.randn(n, device=DEVICE)).to(dtype)}
    if "layer" in op:
        kwargs["bias"] = (0.5 * torch.randn(n, device=DEVICE)).to(dtype)
    return kwargs


def _run(op: str, backend: str, args: tuple, kwargs: dict):
    with opforge.backend(backend), opforge.trace() as t:
        out = getattr(opforge, op)(*args, **kwargs)
    assert len(t) == 1 and t[0].backend == backend, list(t)
    return out


@pytest.mark.parametrize("op", OPS)
def test_a_non_default_eps_is_applied_as_documented(op, every_backend):
    for n in LENGTHS[every_backend]:
        x = _rows(n, torch.float32)
        kwargs = dict(_affine(op, n), eps=EPS)
        args = (x, _rows(n, torch.float32)) if op.startswith("add_") else (x,)
        out = _run(op, every_backend, args, kwargs)
        y = out[0] if op.startswith("add_") else out
        total = args[0].double() + args[1].double() if op.startswith("add_") else x.double()
        norm = reference.layer_norm if "layer" in op else reference.rms_norm
        ref = norm(total, **{k: v.double() if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()})
        for row, scale in enumerate(ROW_SCALES):
            err = rel_error(y[row], ref[row])
            assert err < 1e-5, f"{op} {every_backend} n={n} row scale {scale}: rel err {err:.2e}"
        # the same rows under the default eps differ: eps really reached the kernel
        default = reference.layer_norm if "layer" in op else reference.rms_norm
        assert rel_error(default(total, **{k: v.double() for k, v in kwargs.items() if k != "eps"})[0], ref[0]) > 0.1


_MANTISSA = {torch.float16: 10, torch.bfloat16: 7, torch.float32: 23}


def _half_ulps_beyond(got: torch.Tensor, want: torch.Tensor, magnitude: torch.Tensor, slack: float) -> float:
    """The largest |got - want| in half-units in the last place of ``got``'s dtype at ``want``,
    after forgiving ``slack * magnitude`` (the float32 arithmetic's own error on terms of that size)."""
    exponent = torch.floor(torch.log2(want.abs().clamp_min(torch.finfo(got.dtype).tiny)))
    half_ulp = torch.exp2(exponent - _MANTISSA[got.dtype] - 1)
    return float((((got.double() - want).abs() - slack * magnitude).clamp_min(0) / half_ulp).max())


@pytest.mark.parametrize("op", ["add_rms_norm", "add_layer_norm"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_add_norm_normalizes_the_stored_sum_rounded_once(op, dtype, every_backend):
    """The stored sum is x + residual rounded once to the dtype, and y is the norm of that stored
    sum rounded once: per element within half a unit in the last place, beyond the float32
    arithmetic's own error (1e-5 of the terms' size). Triton's interpreter truncates to
    bfloat16 instead of rounding: one unit there."""
    truncates = every_backend == "triton" and DEVICE == "cpu" and dtype == torch.bfloat16
    rounding = 2.0 if truncates else 1.0               # in half-units in the last place
    for n in LENGTHS[every_backend]:
        x, residual = _rows(n, dtype), _rows(n, dtype)
        kwargs = _affine(op, n)                       # float32 weights: y's only rounding is its own
        y, stored = _run(op, every_backend, (x, residual), kwargs)
        exact_sum = x.double() + residual.double()
        assert _half_ulps_beyond(stored, exact_sum, exact_sum.abs(), 1e-7) <= rounding, (op, n)
        norm = reference.layer_norm if "layer" in op else reference.rms_norm
        w = kwargs["weight"].double()
        b = kwargs["bias"].double() if "bias" in kwargs else torch.zeros_like(w)
        unit = norm(stored.double())
        want = unit * w + b
        # the row's statistics in float32 move every element of the row by about the same amount in
        # units of its spread (unit is O(1)): 1e-2 |w| (x 1e-5 slack) forgives that where unit*w and
        # b are both near 0 (seen: 1.2e-8 at n = 40000, unit 4e-4, b 6e-4), far below a misrounded sum
        err = _half_ulps_beyond(y, want, (unit * w).abs() + b.abs() + 1e-2 * w.abs(), 1e-5)
        assert err <= rounding, f"{op} {every_backend} n={n} {dtype}: {err:.2f} half-ulps from the norm of the stored sum"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_add_layer_norm_of_clustered_rows_uses_the_rounded_sum(dtype, every_backend):
    """Rows 100 + N(0, 1) in half precision: the rounding of the sum is a sizeable part of each
    row's spread, so normalizing the unrounded sum would be off by percents."""
    n = 300
    x = (100 + torch.randn(2, n, device=DEVICE)).to(dtype)
    residual = (0.37 * torch.randn(2, n, device=DEVICE)).to(dtype)
    y, stored = _run("add_layer_norm", every_backend, (x, residual), {})
    want = reference.layer_norm(stored.double())
    assert rel_error(y, want) < {torch.float16: 2e-3, torch.bfloat16: 1e-2}[dtype]
    unrounded = reference.layer_norm(x.double() + residual.double())
    assert rel_error(want, unrounded) > 0.01          # the check above can tell the two apart
