"""Type promotion as torch does it, and the dtypes fused kernels compute in.

Torch ranks the operands of an op in three tiers: dimensioned tensors, zero-dimensional tensors
and Python numbers ("wrapped numbers"). The result's category (bool < integer < floating) is the
highest category among all operands; within it, the highest tier that reaches that category
decides the dtype. So ``bf16_tensor * 2.0`` stays bfloat16, ``int32_tensor * 2.5`` is float32,
and ``bf16_tensor + f32_zero_dim_tensor`` is bfloat16.

Example:
    >>> import torch
    >>> result_dtype([(torch.bfloat16, DIM), (torch.float32, WRAPPED)])
    torch.bfloat16
"""
from __future__ import annotations

import functools
from typing import Iterable, Optional

import torch

WRAPPED, ZERO_DIM, DIM = 0, 1, 2
"""Operand tiers: a Python number, a zero-dimensional tensor, a tensor with dimensions."""

FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
INTEGERS = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)
SUPPORTED = FLOATS + INTEGERS + (torch.bool,)
HALVES = (torch.float16, torch.bfloat16)


def is_float(dtype: torch.dtype) -> bool:
    """True for the floating dtypes fused functions accept."""
    return dtype in FLOATS


def is_integer(dtype: torch.dtype) -> bool:
    """True for integer dtypes (bool is not one)."""
    return dtype in INTEGERS


def python_dtype(value: object) -> torch.dtype:
    """The dtype torch gives a Python number: bool, int64, or the default float dtype.

    Example:
        >>> python_dtype(2.5), python_dtype(3), python_dtype(True)
        (torch.float32, torch.int64, torch.bool)
    """
    if isinstance(value, bool):
        return torch.bool
    if isinstance(value, int):
        return torch.int64
    if isinstance(value, float):
        return torch.get_default_dtype()
    raise TypeError(f"not a Python number: {value!r}")


@functools.lru_cache(maxsize=None)
def promote(a: Optional[torch.dtype], b: Optional[torch.dtype]) -> Optional[torch.dtype]:
    """``torch.promote_types`` that lets either side be absent."""
    if a is None:
        return b
    if b is None:
        return a
    return torch.promote_types(a, b)


def _combine(higher: Optional[torch.dtype], lower: Optional[torch.dtype]) -> Optional[torch.dtype]:
    """Merge the result of a higher tier with a lower one (torch's category rule)."""
    if higher is None:
        return lower
    if lower is None or is_float(higher):
        return higher
    if higher == torch.bool or is_float(lower):
        return promote(higher, lower)
    return higher


def result_dtype(operands: Iterable[tuple[torch.dtype, int]]) -> torch.dtype:
    """The dtype torch gives an op on operands given as ``(dtype, tier)`` pairs.

    Example:
        >>> result_dtype([(torch.int32, DIM), (torch.float32, WRAPPED)])
        torch.float32
        >>> result_dtype([(torch.float16, DIM), (torch.float64, ZERO_DIM)])
        torch.float16
    """
    slots: list[Optional[torch.dtype]] = [None, None, None]
    for dtype, tier in operands:
        slots[tier] = promote(slots[tier], dtype)
    result = _combine(slots[DIM], _combine(slots[ZERO_DIM], slots[WRAPPED]))
    if result is None:
        raise ValueError("an op needs at least one operand")
    return result


def compute_dtype(dtype: torch.dtype, tier: int, backend: str) -> torch.dtype:
    """The dtype a value is held in while a fused kernel computes.

    Half types compute in float32. On the torch path Python floats stay float64 (they are
    doubles); Triton passes float scalars as float32.

    Example:
        >>> compute_dtype(torch.bfloat16, DIM, "triton")
        torch.float32
    """
    if dtype in HALVES:
        return torch.float32
    if tier == WRAPPED and is_float(dtype) and backend == "torch":
        return torch.float64
    return dtype


def short_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``'bfloat16'``."""
    return str(dtype).replace("torch.", "")
