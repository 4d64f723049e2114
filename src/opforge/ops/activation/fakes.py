"""Fake implementations for torch.compile: an activation's result has x's layout if x is dense,
else it is packed (as the kernels and the torch path give)."""
from __future__ import annotations

import torch

from .problem import is_dense


def _like(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x) if is_dense(x) else x.new_empty(x.shape)


def gelu(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    return _like(x)


def silu(x: torch.Tensor) -> torch.Tensor:
    return _like(x)


relu = silu


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return _like(gate)


def geglu(gate: torch.Tensor, up: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    return _like(gate)
