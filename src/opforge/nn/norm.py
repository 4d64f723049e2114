"""LayerNorm and RMSNorm modules with torch.nn's constructor arguments, parameters and state_dict keys."""
from __future__ import annotations

import numbers
from typing import Optional, Sequence, Union

import torch

from ..ops.norm import layer_norm, rms_norm

_Shape = Union[int, Sequence[int], torch.Size]


def _last_dim_only(normalized_shape: _Shape, cls: str) -> tuple[int, ...]:
    shape = (normalized_shape,) if isinstance(normalized_shape, numbers.Integral) else tuple(normalized_shape)
    if len(shape) != 1:
        raise ValueError(f"opforge.nn.{cls} normalizes the last dimension only: normalized_shape must "
                         f"have one element, got {shape}")
    return (int(shape[0]),)


class LayerNorm(torch.nn.LayerNorm):
    """Drop-in for ``torch.nn.LayerNorm`` over the last dimension, running ``opforge.layer_norm``.

    Same constructor, parameters (``weight``, ``bias``) and state_dict keys, so trained weights load.

    Example:
        >>> import torch, opforge
        >>> ln = opforge.nn.LayerNorm(64)
        >>> ln.load_state_dict(torch.nn.LayerNorm(64).state_dict())
        <All keys matched successfully>
        >>> ln(torch.randn(2, 64)).shape
        torch.Size([2, 64])
    """

    def __init__(self, normalized_shape: _Shape, eps: float = 1e-5, elementwise_affine: bool = True,
                 bias: bool = True, device=None, dtype=None):
        super().__init__(_last_dim_only(normalized_shape, "LayerNorm"), eps, elementwise_affine, bias,
                         device=device, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return layer_norm(x, self.weight, self.bias, self.eps)


class RMSNorm(torch.nn.RMSNorm):
    """Drop-in for ``torch.nn.RMSNorm`` over the last dimension, running ``opforge.rms_norm``.

    ``eps=None`` means ``torch.finfo(x.dtype).eps``, as in torch.

    Example:
        >>> import torch, opforge
        >>> norm = opforge.nn.RMSNorm(128, eps=1e-6)
        >>> norm(torch.randn(3, 128)).shape
        torch.Size([3, 128])
    """

    def __init__(self, normalized_shape: _Shape, eps: Optional[float] = None, elementwise_affine: bool = True,
                 device=None, dtype=None):
        super().__init__(_last_dim_only(normalized_shape, "RMSNorm"), eps, elementwise_affine,
                         device=device, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        eps = torch.finfo(x.dtype).eps if self.eps is None else self.eps
        return rms_norm(x, self.weight, eps)
