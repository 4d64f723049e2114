"""The torch path for the normalizations: the fallback everywhere and, in float64, the test oracle.

Two forms of each op:

* the careful composites (``layer_norm``, ``rms_norm``, ``add_*``) compute in float32 (float64
  for float64 inputs) with a mean subtracted twice; on ``.double()`` tensors they are the oracle;
* ``fast_run`` calls PyTorch's fused ``F.layer_norm`` / ``F.rms_norm`` (float32 accumulation
  inside, one rounding of the output), several times fewer launches than the composite. In
  float32 (and for rows of one value) the layer norms subtract the row mean first:
  ``F.layer_norm`` alone loses digits on rows whose mean is large against their spread (3.5e-4
  relative error at mean 1e4, unit spread; a float16 row of one value 1% off its bias).

``run`` picks the careful form for float64 inputs and the fast one otherwise; both agree to
the input dtype's rounding (tests/ops/norm/test_norm_torch_path.py).
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _affine(y: torch.Tensor, weight: Optional[torch.Tensor], bias: Optional[torch.Tensor]) -> torch.Tensor:
    if weight is not None:
        y = y * weight.to(y.dtype)
    if bias is not None:
        y = y + bias.to(y.dtype)
    return y


def layer_norm(x: torch.Tensor, weight: Optional[torch.Tensor] = None, bias: Optional[torch.Tensor] = None,
               eps: float = 1e-5) -> torch.Tensor:
    """(x - mean) / sqrt(var + eps) * weight + bias over the last dim; variance taken around the mean."""
    xf = x.to(_compute_dtype(x))
    centered = xf - xf.mean(dim=-1, keepdim=True)
    # Subtracting a rounded mean is exact for clustered rows; removing what is left of the
    # mean then undoes that rounding (1e4 + randn in float32 stays accurate).
    centered = centered - centered.mean(dim=-1, keepdim=True)
    var = (centered * centered).mean(dim=-1, keepdim=True)
    return _affine(centered * torch.rsqrt(var + eps), weight, bias).to(x.dtype)


def rms_norm(x: torch.Tensor, weight: Optional[torch.Tensor] = None, eps: float = 1e-6) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) * weight over the last dim."""
    xf = x.to(_compute_dtype(x))
    y = xf * torch.rsqrt((xf * xf).mean(dim=-1, keepdim=True) + eps)
    return _affine(y, weight, None).to(x.dtype)


def residual_sum(x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """x + residual, rounded once to x's dtype (what the fused kernels store and then normalize)."""
    return (x.to(_compute_dtype(x)) + residual.to(_compute_dtype(x))).to(x.dtype)


def add_layer_norm(x: torch.Tensor, residual: torch.Tensor, weight: Optional[torch.Tensor] = None,
                   bias: Optional[torch.Tensor] = None, eps: float = 1e-5) -> tuple[torch.Tensor, torch.Tensor]:
    """(layer_norm(x + residual), x + residual)."""
    total = residual_sum(x, residual)
    return layer_norm(total, weight, bias, eps), total


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: Optional[torch.Tensor] = None,
                 eps: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual), x + residual)."""
    total = residual_sum(x, residual)
    return rms_norm(total, weight, eps), total


def _fast_norm(is_rms: bool, x: torch.Tensor, weight: Optional[torch.Tensor], bias: Optional[torch.Tensor],
               eps: float) -> torch.Tensor:
    """F.rms_norm / F.layer_norm over the last dim; parameters of another dtype than x (float32
    with half x) are applied in float32 and the result rounded once to x's dtype."""
    shape = (x.shape[-1],)
    dtype = x.dtype
    if (weight is not None and weight.dtype != dtype) or (bias is not None and bias.dtype != dtype):
        xf = x.float()
        w = None if weight is None else weight.float()
        if is_rms:
            return F.rms_norm(xf, shape, w, eps).to(dtype)
        return F.layer_norm(xf - xf.mean(dim=-1, keepdim=True), shape, w, None if bias is None else bias.float(),
                            eps).to(dtype)
    if is_rms:
        return F.rms_norm(x, shape, weight, eps)
    # F.layer_norm alone loses digits on rows whose mean is large against their spread (it folds
    # the mean into a shift of x * rstd): float32 3.5e-4 at mean 1e4, unit spread, so float32 rows
    # are centred first. In float16 / bfloat16 the output's rounding hides that, except where the
    # spread is 0: a row of one value came out up to 1% off its bias, so those rows are centred
    # too (x - x: exactly 0, NaN kept). Centring every half row would double the CPU path's time.
    if dtype == torch.float32 or shape[0] == 1:
        x = x - x.mean(dim=-1, keepdim=True)
    return F.layer_norm(x, shape, weight, bias, eps)


def fast_run(op: str, x: torch.Tensor, residual: Optional[torch.Tensor], weight: Optional[torch.Tensor],
             bias: Optional[torch.Tensor], eps: float):
    """``op`` by name through PyTorch's fused norms (for float32 and half inputs; see ``run``).

    The residual sum ``x + residual`` is one add in x's dtype: the exact sum rounded once, as
    ``residual_sum`` gives.

    Example:
        >>> x = torch.randn(2, 64)
        >>> torch.allclose(fast_run("rms_norm", x, None, None, None, 1e-6), rms_norm(x), atol=1e-6)
        True
    """
    is_rms = op[-8:] == "rms_norm"
    if op[0] == "a":  # add_*
        total = x + residual
        return _fast_norm(is_rms, total, weight, bias, eps), total
    return _fast_norm(is_rms, x, weight, bias, eps)


def fast_function(op: str, n: int, params_match: bool) -> Callable[..., Any]:
    """``fast_run`` for one op and N, as ``f(x, residual, weight, bias, eps)``: with parameters
    of x's dtype (``params_match``) it calls PyTorch's fused norm with nothing in between.

    Example:
        >>> x = torch.randn(2, 64)
        >>> f = fast_function("add_rms_norm", 64, True)
        >>> torch.equal(f(x, x, None, None, 1e-6)[1], x + x)
        True
    """
    if not params_match:
        return lambda x, residual, weight, bias, eps: fast_run(op, x, residual, weight, bias, eps)
    shape = (n,)
    rms = torch.rms_norm
    if op == "rms_norm":
        return lambda x, residual, weight, bias, eps: rms(x, shape, weight, eps)
    if op == "layer_norm":
        return lambda x, residual, weight, bias, eps: _fast_norm(False, x, weight, bias, eps)
    if op == "add_rms_norm":
        def add_rms(x, residual, weight, bias, eps):
            total = x + residual
            return rms(total, shape, weight, eps), total
        return add_rms

    def add_layer(x, residual, weight, bias, eps):
        total = x + residual
        return _fast_norm(False, total, weight, bias, eps), total
    return add_layer


def run(op: str, x: torch.Tensor, residual: Optional[torch.Tensor], weight: Optional[torch.Tensor],
        bias: Optional[torch.Tensor], eps: float):
    """Run ``op`` by name with the family's common argument list: the careful composite for
    float64 inputs (the oracle), ``fast_run`` otherwise."""
    if x.dtype != torch.float64:
        return fast_run(op, x, residual, weight, bias, eps)
    return careful_run(op, x, residual, weight, bias, eps)


def careful_run(op: str, x: torch.Tensor, residual: Optional[torch.Tensor], weight: Optional[torch.Tensor],
                bias: Optional[torch.Tensor], eps: float):
    """Run ``op`` by name through the careful composites, in any dtype."""
    if op == "layer_norm":
        return layer_norm(x, weight, bias, eps)
    if op == "rms_norm":
        return rms_norm(x, weight, eps)
    if op == "add_layer_norm":
        return add_layer_norm(x, residual, weight, bias, eps)
    if op == "add_rms_norm":
        return add_rms_norm(x, residual, weight, eps)
    raise KeyError(op)
