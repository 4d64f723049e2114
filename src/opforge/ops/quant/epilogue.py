"""SwiGLU after a ``linear`` (``activation="swiglu"``) where the kernel that runs does not fuse it.

The dense one-row GEMV (``dense_gemv``) applies it to its float32 sums; every other variant,
the quantized kernels included (fused into their one-row GEMV it measured slower on an H100),
writes the full (M, 2F) product and ends with ``finish``, which runs the activation family's
public op (its own kernel on CUDA and Metal, traced as such).
"""
from __future__ import annotations

import torch

from ..activation import swiglu
from .problem import LinearCall


def swiglu_halves(h: torch.Tensor) -> torch.Tensor:
    """``silu(h[..., :F]) * h[..., F:]`` for h (..., 2F).

    Example:
        >>> h = torch.randn(3, 8)
        >>> torch.allclose(swiglu_halves(h), torch.nn.functional.silu(h[:, :4]) * h[:, 4:], atol=1e-6)
        True
    """
    f = h.shape[-1] // 2
    return swiglu(h[..., :f], h[..., f:])


def finish(out: torch.Tensor, call: LinearCall) -> torch.Tensor:
    """A variant's (M, N) product as ``call.out_shape``, after SwiGLU if the call asks for it.

    Example:
        >>> from opforge.ops.quant.problem import prepare
        >>> x, w = torch.randn(2, 3, 4), torch.randn(8, 4)
        >>> call = prepare(x, w, None, "swiglu")
        >>> finish(call.x @ w.T, call).shape
        torch.Size([2, 3, 4])
    """
    return (swiglu_halves(out) if call.problem.swiglu else out).view(call.out_shape)
