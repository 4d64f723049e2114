"""The torch path for the normalizations: the fallback everywhere and, in float64, the test oracle.

Half-precision inputs are computed in float32; float64 inputs stay in float64, which is what
makes these functions the oracle: call them on ``.double()`` tensors.
"""
from __future__ import annotations

from typing import Optional

import torch


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


def run(op: str, x: torch.Tensor, residual: Optional[torch.Tensor], weight: Optional[torch.Tensor],
        bias: Optional[torch.Tensor], eps: float):
    """Run ``op`` by name with the family's common argument list."""
    if op == "layer_norm":
        return layer_norm(x, weight, bias, eps)
    if op == "rms_norm":
        return rms_norm(x, weight, eps)
    if op == "add_layer_norm":
        return add_layer_norm(x, residual, weight, bias, eps)
    if op == "add_rms_norm":
        return add_rms_norm(x, residual, weight, eps)
    raise KeyError(op)
