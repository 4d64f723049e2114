"""Viewing a (..., N) tensor as rows without copying it.

A kernel addresses row ``r`` at ``(r // inner) * stride_outer + (r % inner) * stride_inner``.
Two strides cover packed tensors, ``big[:, :N]`` slices and ``big[::2]`` of a 3-D tensor; a
layout that needs more, or a last dimension that is not contiguous, is copied (and traced so).
"""
from __future__ import annotations

from typing import NamedTuple

import torch


class Rows(NamedTuple):
    tensor: torch.Tensor        # the tensor the kernel reads (x itself, or a packed copy of it)
    inner: int
    stride_outer: int
    stride_inner: int
    copied: str                 # why a copy was made, or "" when x is read in place


def as_rows(x: torch.Tensor, name: str = "x") -> Rows:
    """Describe ``x`` (..., N) as rows addressed by two strides, copying only when that is impossible."""
    n = x.shape[-1]
    if x.is_contiguous():
        rows = x.numel() // n if n else 0
        return Rows(x, max(rows, 1), 0, n, "")
    if x.stride(-1) != 1 and n > 1:
        return _packed(x, f"{name} copied: its last dimension is not contiguous")
    dims = [(size, stride) for size, stride in zip(x.shape[:-1], x.stride()[:-1]) if size != 1]
    merged: list[list[int]] = []
    for size, stride in reversed(dims):
        if merged and stride == merged[-1][1] * merged[-1][0]:
            merged[-1][0] *= size
        else:
            merged.append([size, stride])
    if not merged:
        return Rows(x, 1, 0, n, "")
    if len(merged) == 1:
        return Rows(x, merged[0][0], 0, merged[0][1], "")
    if len(merged) == 2:
        (inner, s_inner), (_, s_outer) = merged
        return Rows(x, inner, s_outer, s_inner, "")
    return _packed(x, f"{name} copied: its rows are not addressable with two strides")


def _packed(x: torch.Tensor, why: str) -> Rows:
    packed = x.contiguous()
    n = x.shape[-1]
    return Rows(packed, max(packed.numel() // max(n, 1), 1), 0, n, why)
