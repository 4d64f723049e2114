"""The torch path for softmax and log_softmax: the fallback everywhere and, in float64, the test oracle.

Half-precision inputs are computed in float32; float64 inputs stay in float64, which is what
makes these functions the oracle: call them on ``.double()`` tensors. Both subtract the row's
maximum before exponentiating, so huge logits do not overflow; an all ``-inf`` row gives NaN,
as ``torch.softmax`` does.
"""
from __future__ import annotations

from typing import Callable

import torch


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """``exp(x - max) / sum(exp(x - max))`` along ``dim``, in float32 (float64 for float64 x).

    Example:
        >>> import torch
        >>> softmax(torch.tensor([0.0, 0.0])).tolist()
        [0.5, 0.5]
    """
    xf = x.to(_compute_dtype(x))
    shifted = xf - xf.amax(dim=dim, keepdim=True)
    e = torch.exp(shifted)
    return (e / e.sum(dim=dim, keepdim=True)).to(x.dtype)


def log_softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """``(x - max) - log(sum(exp(x - max)))`` along ``dim``, in float32 (float64 for float64 x).

    Example:
        >>> import torch
        >>> round(log_softmax(torch.tensor([0.0, 0.0]))[0].item(), 6)
        -0.693147
    """
    xf = x.to(_compute_dtype(x))
    shifted = xf - xf.amax(dim=dim, keepdim=True)
    return (shifted - torch.log(torch.exp(shifted).sum(dim=dim, keepdim=True))).to(x.dtype)


def fast_function(op: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """PyTorch's own ``torch.softmax`` / ``torch.log_softmax`` over the last dim, as ``f(x)``: the
    torch path for float32 and half inputs (float32 inside, one rounding; see ``run``).

    Example:
        >>> x = torch.randn(3, 10)
        >>> torch.allclose(fast_function("log_softmax")(x), log_softmax(x), atol=1e-6)
        True
    """
    if op == "softmax":
        return lambda x, f=torch.softmax: f(x, -1)
    if op == "log_softmax":
        return lambda x, f=torch.log_softmax: f(x, -1)
    raise KeyError(op)


def run(op: str, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Run ``op`` by name: the careful forms above for float64 inputs (the oracle), PyTorch's
    own functions otherwise."""
    if x.dtype != torch.float64:
        return torch.softmax(x, dim) if op == "softmax" else torch.log_softmax(x, dim)
    return careful_run(op, x, dim)


def careful_run(op: str, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Run ``op`` (``"softmax"`` or ``"log_softmax"``) by name through the careful forms."""
    if op == "softmax":
        return softmax(x, dim)
    if op == "log_softmax":
        return log_softmax(x, dim)
    raise KeyError(op)
