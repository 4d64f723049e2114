"""Checks that an op's outputs can be written safely: no output overlaps itself, and no output
shares memory with another argument of the call.

A stride-0 (expanded) output writes one element from several indices, so its value depends on
the order programs run in; an output that aliases another output or an input is overwritten or
read after being written. Both are refused with ``AliasedOutputError`` before anything is written.
"""
from __future__ import annotations

from typing import Optional

import torch


class AliasedOutputError(ValueError):
    """An output tensor overlaps itself or shares memory with another argument of the call.

    Example:
        >>> import torch
        >>> check_no_self_overlap("out", torch.zeros(3).expand(2, 3))
        Traceback (most recent call last):
            ...
        opforge.runtime.overlap.AliasedOutputError: out overlaps itself: shape (2, 3) with strides (0, 1) writes some elements from several indices; pass a tensor with distinct elements (e.g. .contiguous())
    """


def _dims(t: torch.Tensor) -> list[tuple[int, int]]:
    """(size, |stride|) of the dimensions that index more than one element, innermost first."""
    return sorted(((n, abs(s)) for n, s in zip(t.shape, t.stride()) if n > 1), key=lambda d: d[1])


def overlaps_itself(t: torch.Tensor) -> bool:
    """True unless ``t``'s indices reach distinct elements, as proven by each stride (sorted)
    exceeding the span of the dimensions inside it; a layout that passes no such proof counts
    as overlapping.

    Example:
        >>> overlaps_itself(torch.zeros(4, 6)[:, ::2]), overlaps_itself(torch.zeros(3, 1).expand(3, 5))
        (False, True)
    """
    if t.numel() <= 1:
        return False
    span = 0
    for n, s in _dims(t):
        if s <= span:
            return True
        span += (n - 1) * s
    return False


def check_no_self_overlap(name: str, t: torch.Tensor) -> None:
    """Raise ``AliasedOutputError`` if the output ``t`` overlaps itself (see ``overlaps_itself``)."""
    if overlaps_itself(t):
        raise AliasedOutputError(
            f"{name} overlaps itself: shape {tuple(t.shape)} with strides {tuple(t.stride())} writes some "
            "elements from several indices; pass a tensor with distinct elements (e.g. .contiguous())")


def _byte_span(t: torch.Tensor) -> tuple[int, int]:
    lo = hi = t.data_ptr()
    for n, s in zip(t.shape, t.stride()):
        if s > 0:
            hi += (n - 1) * s * t.element_size()
        else:
            lo += (n - 1) * s * t.element_size()
    return lo, hi + t.element_size()


def _reachable(delta: int, dims: list[tuple[int, int]]) -> bool:
    """Whether ``delta`` (elements) is a difference of two indices' offsets of a tensor with
    ``dims`` (innermost first, nested strides: each exceeds the span of the ones inside it, so at
    each dimension only the two coefficients around ``delta / stride`` can leave a remainder the
    inner dimensions reach)."""
    if not dims:
        return delta == 0
    n, s = dims[-1]
    inner = dims[:-1]
    reach = sum((m - 1) * t for m, t in inner)
    for c in {delta // s, -(-delta // s)}:
        if abs(c) <= n - 1 and abs(delta - c * s) <= reach and _reachable(delta - c * s, inner):
            return True
    return False


def share_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    """True if an element of ``a`` may be an element of ``b``: their byte spans intersect, unless
    both are views of one layout (same shape, strides and dtype, no self-overlap) at offsets no
    index difference reaches (k and v interleaved in one (..., 2, D) buffer, say).

    Example:
        >>> kv = torch.zeros(2, 5, 2, 8)
        >>> share_memory(kv[:, :, 0], kv[:, :, 1]), share_memory(kv[:, :, 0], kv[:, 1:, 0])
        (False, True)
    """
    if a.numel() == 0 or b.numel() == 0 or a.device != b.device:
        return False
    (a0, a1), (b0, b1) = _byte_span(a), _byte_span(b)
    if a1 <= b0 or b1 <= a0:
        return False
    if (a.shape, a.stride(), a.dtype) != (b.shape, b.stride(), b.dtype) or overlaps_itself(a):
        return True
    delta, size = b.data_ptr() - a.data_ptr(), a.element_size()
    return delta % size == 0 and _reachable(delta // size, _dims(a))


def check_disjoint(name: str, t: torch.Tensor, other_name: str, other: Optional[torch.Tensor]) -> None:
    """Raise ``AliasedOutputError`` if the output ``t`` shares memory with ``other`` (see
    ``share_memory``); ``other`` None passes."""
    if other is not None and share_memory(t, other):
        what = "is" if other.data_ptr() == t.data_ptr() and other.shape == t.shape else "shares memory with"
        raise AliasedOutputError(f"{name} {what} {other_name}: the call writes {name}, so they must not "
                                 "share memory")


def _storage(t: torch.Tensor) -> int:
    return -1 if t.is_meta else t.untyped_storage().data_ptr()


def check_writes(written: "list[tuple[str, torch.Tensor]]", read: "list[tuple[str, Optional[torch.Tensor]]]") -> None:
    """Raise ``AliasedOutputError`` if a written tensor shares memory with another written one or
    with a read one (``None`` entries are skipped). Tensors of different storages are told apart
    by one lookup each; only those of one storage are compared element-wise (``share_memory``).

    Example:
        >>> kc = torch.zeros(2, 1, 4, 8)
        >>> check_writes([("k_cache", kc), ("v_cache", torch.zeros(2, 1, 4, 8))], [("k", torch.ones(2, 1, 1, 8))])
        >>> check_writes([("k_cache", kc), ("v_cache", kc)], [])
        Traceback (most recent call last):
            ...
        opforge.runtime.overlap.AliasedOutputError: v_cache is k_cache: the call writes v_cache, so they must not share memory
    """
    tensors = [(name, t, True) for name, t in written] + [(name, t, False) for name, t in read if t is not None]
    storages = [_storage(t) for _, t, _ in tensors]
    for i, (name, t, writes) in enumerate(tensors):
        if not writes:
            continue
        for j in range(i):
            if storages[j] == storages[i] and storages[i] != -1:
                check_disjoint(name, t, tensors[j][0], tensors[j][1])
        for j in range(i + 1, len(tensors)):
            if storages[j] == storages[i] and storages[i] != -1 and not tensors[j][2]:
                check_disjoint(name, t, tensors[j][0], tensors[j][1])
