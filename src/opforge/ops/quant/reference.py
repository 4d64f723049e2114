"""The torch path of ``linear``: dequantize, then ``F.linear``; in float64 it is the oracle."""
from __future__ import annotations

from typing import Optional, Union

import torch
import torch.nn.functional as F

from .weight import QuantizedWeight


def run(x: torch.Tensor, w: Union[QuantizedWeight, torch.Tensor], bias: Optional[torch.Tensor],
        swiglu: bool = False) -> torch.Tensor:
    """``x @ dequantize(w).T + bias`` in float32 (float64 for float64 x), cast to x's dtype; with
    ``swiglu`` the product's halves h1, h2 become ``silu(h1) * h2`` before the one cast.

    Example:
        >>> from opforge.ops.quant.weight import quantize_weight
        >>> qw = quantize_weight(torch.randn(8, 64), 8, 32)
        >>> x = torch.randn(2, 64, dtype=torch.float64)
        >>> torch.allclose(run(x, qw, None), x @ qw.dequantize(torch.float64).T)
        True
    """
    compute = torch.float64 if x.dtype == torch.float64 else torch.float32
    weight = w.dequantize(compute) if isinstance(w, QuantizedWeight) else w.to(compute)
    b = None if bias is None else bias.to(compute)
    out = F.linear(x.to(compute), weight, b)
    if swiglu:
        f = out.shape[-1] // 2
        out = F.silu(out[..., :f]) * out[..., f:]
    return out.to(x.dtype)
