"""What every generated kernel of a fused function needs: its outputs and its name.

Example:
    >>> safe_name("<lambda>")
    'lambda'
"""
from __future__ import annotations

import re

import torch

from ..runtime import alloc


def empty(shape: torch.Size, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """An output: NaN-poisoned in tests (``alloc.empty``) when floating, plain otherwise."""
    if dtype.is_floating_point:
        return alloc.empty(shape, dtype, device)
    return torch.empty(shape, dtype=dtype, device=device)


def safe_name(name: str) -> str:
    """A Python identifier made from a function's name (``<lambda>`` -> ``lambda``)."""
    cleaned = re.sub(r"\W", "_", name).strip("_") or "fn"
    return cleaned if not cleaned[0].isdigit() else f"f_{cleaned}"
