"""torch.compile support for ``linear``: a custom op cannot take a ``QuantizedWeight``.

While compiling, ``route_linear`` sends a quantized weight to ``opforge::quantized_linear``,
an op over its plain tensors and ints (packed codes, transposed scales, zeros or None, bits,
group size, N, K, the codes' layout), which rebuilds the ``QuantizedWeight`` and runs ``linear``; a dense weight
is ``torch.nn.functional.linear``.
"""
from __future__ import annotations

from typing import Any, Optional

import torch
import torch.nn.functional as F

from ...runtime.compile_support import library_op
from .problem import check_activation
from .weight import QuantizedWeight


#: The family's public functions, handed over by the package once they exist (``bind``): the
#: custom ops run their ``.eager`` form.
_public: dict[str, Any] = {}


def bind(**functions: Any) -> None:
    """Give this module the family's public functions (the package calls it after defining them)."""
    _public.update(functions)


def _quantized_linear(x: torch.Tensor, packed: torch.Tensor, scales_t: torch.Tensor, zeros_t: Optional[torch.Tensor],
                      bits: int, group_size: int, n: int, k: int, bias: Optional[torch.Tensor],
                      layout: str = "rows") -> torch.Tensor:
    w = QuantizedWeight(packed, scales_t, zeros_t, bits, group_size, (n, k), layout)
    return _public["linear"].eager(x, w, bias)


def _fake_quantized_linear(x, packed, scales_t, zeros_t, bits, group_size, n, k, bias, layout="rows"):
    return x.new_empty(x.shape[:-1] + (n,))


quantized_linear_op = library_op("quantized_linear", _quantized_linear, _fake_quantized_linear)


def route_linear(x, w, bias=None, *, activation=None):
    """While compiling: the product through the custom op (quantized) or ``F.linear``, then
    SwiGLU (``activation="swiglu"``) as torch operations on its halves."""
    swiglu = check_activation(activation, w.shape[0])   # the eager call's checks and messages
    if isinstance(w, QuantizedWeight):
        out = quantized_linear_op(x, w.packed, w.scales_t, w.zeros_t, w.bits, w.group_size,
                                  w.shape[0], w.shape[1], bias, w.layout)
    else:
        out = F.linear(x, w, bias)
    if not swiglu:
        return out
    f = out.shape[-1] // 2
    return (F.silu(out[..., :f].float()) * out[..., f:].float()).to(out.dtype)
