"""Output allocation, with an optional poison fill so tests catch elements a kernel never writes.

    with opforge.runtime.alloc.poisoned_outputs():
        y = opforge.layer_norm(x)     # y started as all-NaN; any unwritten element stays NaN
"""
from __future__ import annotations

import contextlib
from typing import Iterator, Sequence

import torch

_poison = False


def empty(shape: Sequence[int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``torch.empty``, NaN-filled while ``poisoned_outputs()`` is active."""
    out = torch.empty(shape, dtype=dtype, device=device)
    if _poison:
        out.fill_(float("nan") if dtype.is_floating_point else torch.iinfo(dtype).min)  # ints: their minimum
    return out


def empty_packed_like(x: torch.Tensor) -> torch.Tensor:
    """A packed tensor of x's shape, dtype and device (``empty_like`` is the cheapest call for that)."""
    out = torch.empty_like(x) if x.is_contiguous() else torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if _poison:
        out.fill_(float("nan") if x.dtype.is_floating_point else torch.iinfo(x.dtype).min)
    return out


@contextlib.contextmanager
def poisoned_outputs(enabled: bool = True) -> Iterator[None]:
    """Fill every opforge output with NaN before the kernel runs (a testing aid; costs a write)."""
    global _poison
    previous, _poison = _poison, enabled
    try:
        yield
    finally:
        _poison = previous
