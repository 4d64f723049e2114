"""LayerNorm and RMSNorm modules with torch.nn's constructor arguments, parameters and state_dict keys."""
from __future__ import annotations

import numbers
from typing import Optional, Sequence, Union

import torch

from ..ops.norm import layer_norm, rms_norm

_Shape = Union[int, Sequence[int], torch.Size]


def _needs_autograd(x: torch.Tensor, *params: Optional[torch.Tensor]) -> bool:
    """True where a graph must be recorded: grad mode on and an input or parameter requires grad.
    opforge's kernels are forward-only, so the modules then run torch's own forward (training,
    fine-tuning); inference (``torch.no_grad()``, ``torch.inference_mode()``, frozen parameters)
    runs opforge."""
    if not torch.is_grad_enabled():
        return False
    return x.requires_grad or any(p is not None and p.requires_grad for p in params)


def _last_dim_only(normalized_shape: _Shape, cls: str) -> tuple[int, ...]:
    shape = (normalized_shape,) if isinstance(normalized_shape, numbers.Integral) else tuple(normalized_shape)
    if len(shape) != 1:
        raise ValueError(f"opforge.nn.{cls} normalizes the last dimension only: normalized_shape must "
                         f"have one element, got {shape}")
    return (int(shape[0]),)


class LayerNorm(torch.nn.LayerNorm):
    """Drop-in for ``torch.nn.LayerNorm`` over the last dimension, running ``opforge.layer_norm``.

    Same constructor, parameters (``weight``, ``bias``) and state_dict keys, so trained weights load.
    opforge is forward-only: where autograd must record a graph (grad mode on and a parameter or
    the input requires grad) the module runs ``torch.nn.LayerNorm``'s forward instead; under
    ``torch.no_grad()`` / ``torch.inference_mode()`` (or with frozen parameters) it runs opforge.

    Example:
        >>> import torch, opforge
        >>> ln = opforge.nn.LayerNorm(64)
        >>> ln.load_state_dict(torch.nn.LayerNorm(64).state_dict())
        <All keys matched successfully>
        >>> with torch.no_grad():
        ...     ln(torch.randn(2, 64)).shape
        torch.Size([2, 64])
    """

    def __init__(self, normalized_shape: _Shape, eps: float = 1e-5, elementwise_affine: bool = True,
                 bias: bool = True, device=None, dtype=None):
        super().__init__(_last_dim_only(normalized_shape, "LayerNorm"), eps, elementwise_affine, bias,
                         device=device, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if _needs_autograd(x, self.weight, self.bias):
            return super().forward(x)
        return layer_norm(x, self.weight, self.bias, self.eps)


class RMSNorm(torch.nn.RMSNorm):
    """Drop-in for ``torch.nn.RMSNorm`` over the last dimension, running ``opforge.rms_norm``.

    ``eps=None`` means ``torch.finfo(x.dtype).eps``, as in torch. Like ``LayerNorm``, it runs
    torch's forward where autograd must record a graph, opforge otherwise.

    Example:
        >>> import torch, opforge
        >>> norm = opforge.nn.RMSNorm(128, eps=1e-6)
        >>> with torch.inference_mode():
        ...     norm(torch.randn(3, 128)).shape
        torch.Size([3, 128])
    """

    def __init__(self, normalized_shape: _Shape, eps: Optional[float] = None, elementwise_affine: bool = True,
                 device=None, dtype=None):
        super().__init__(_last_dim_only(normalized_shape, "RMSNorm"), eps, elementwise_affine,
                         device=device, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if _needs_autograd(x, self.weight):
            return super().forward(x)
        eps = torch.finfo(x.dtype).eps if self.eps is None else self.eps
        return rms_norm(x, self.weight, eps)
