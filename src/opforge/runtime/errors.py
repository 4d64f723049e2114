"""Errors raised by opforge and the cheap input checks every op family shares."""
from __future__ import annotations

import math
import numbers
from typing import Iterable, Optional, Sequence

import torch

HALF_AND_SINGLE = (torch.float32, torch.float16, torch.bfloat16)
FLOAT_DTYPES = HALF_AND_SINGLE + (torch.float64,)


class NoKernelError(RuntimeError):
    """No kernel of the wanted backend can run these inputs, and a fallback is not allowed.

    Raised in strict mode where the torch path would otherwise stand in for an accelerated
    kernel, and whenever a forced backend (``opforge.backend("triton")``) cannot serve a call.

    Attributes:
        op: the op's name, e.g. ``"layer_norm"``.
        reason: why no kernel was usable, e.g. ``"triton: float64 not supported"``.
    """

    def __init__(self, op: str, reason: str):
        self.op = op
        self.reason = reason
        super().__init__(f"{op}: no kernel can run these inputs ({reason})")


def check_float_tensor(name: str, t: object, allow_float64: bool = True) -> torch.Tensor:
    """Raise ``TypeError`` unless ``t`` is a floating-point tensor opforge computes on."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in FLOAT_DTYPES or (t.dtype == torch.float64 and not allow_float64):
        raise TypeError(
            f"{name} must be float32, float16 or bfloat16"
            f"{' (or float64 on the torch path)' if allow_float64 else ''}, got {t.dtype}"
        )
    return t


def check_optional_vector(name: str, t: Optional[torch.Tensor], n: int, device: torch.device) -> None:
    """Check an optional per-feature parameter (weight, bias): shape ``(n,)``, float, same device."""
    if t is None:
        return
    check_float_tensor(name, t)
    if tuple(t.shape) != (n,):
        raise ValueError(f"{name} must have shape ({n},) to match the last dimension of x, got {tuple(t.shape)}")
    check_same_device(name, t, device)


def check_same_device(name: str, t: torch.Tensor, device: torch.device) -> None:
    """Raise ``ValueError`` if ``t`` lives on another device than ``device``."""
    if t.device != device:
        raise ValueError(f"{name} is on {t.device} but x is on {device}: all tensors must be on one device")


def check_same_shape(name: str, t: torch.Tensor, shape: Sequence[int]) -> None:
    """Raise ``ValueError`` unless ``t`` has exactly ``shape``."""
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name} must have x's shape {tuple(shape)}, got {tuple(t.shape)}")


def check_eps(eps: object) -> float:
    """Return ``eps`` as a float; raise ``ValueError`` if negative, NaN or infinite."""
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) and not isinstance(eps, numbers.Real):
        raise TypeError(f"eps must be a real number, got {type(eps).__name__}")
    eps = float(eps)
    if not math.isfinite(eps) or eps < 0:
        raise ValueError(f"eps must be a finite number >= 0, got {eps}")
    return eps


def kernel_dtype_reason(backend: str, dtype: torch.dtype, name: str = "x") -> Optional[str]:
    """Why ``backend``'s kernels cannot take a tensor of ``dtype`` (they take half and single
    precision; float64 stays on the torch path), or None if they can."""
    if dtype in HALF_AND_SINGLE:
        return None
    return (f"{name} is {str(dtype).replace('torch.', '')}; {backend} kernels take float32, float16 or "
            "bfloat16 (float64 runs on the torch path)")


def first_reason(reasons: Iterable[str]) -> str:
    """Join rejection reasons into one line for an error message."""
    return "; ".join(reasons) or "no variant registered"


def check_attention_scale(scale: object, head_dim: int) -> float:
    """An attention op's softmax scale: ``1/sqrt(head_dim)`` for None, else a finite real number
    (``TypeError`` / ``ValueError`` naming ``scale`` otherwise).

    Example:
        >>> check_attention_scale(None, 64), check_attention_scale(2, 64)
        (0.125, 2.0)
    """
    if scale is None:
        return 1.0 / math.sqrt(head_dim) if head_dim else 1.0
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise TypeError(f"scale must be a real number or None, got {type(scale).__name__}")
    scale = float(scale)
    if not math.isfinite(scale):
        raise ValueError(f"scale must be finite, got {scale}")
    return scale
