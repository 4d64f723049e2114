"""Tile and split choices of the paged kernels: functions of host-known sizes only.

None of these is measured on a GPU yet: the tiles are those of the contiguous attention kernels
(``ops/attention/config.py``), whose loops these kernels share except for where a key's
row lives, and the split rule is that of ``decode_attention`` dividing the tokens in the cache.
"""
from __future__ import annotations

import functools

from ...runtime.triton.launch import cdiv, next_power_of_2

MAX_SPLITS = 128             # decode: at most this many slices of one sequence
PROGRAMS_PER_SM = 1          # decode: split programs aimed for per SM
MAX_ROW_BLOCK = 64           # decode: packed query rows (group x max_query_len) per program
APPEND_TILE = 4096           # append: elements of one program's (heads x D) tile


def head_block(d: int) -> int:
    """The D block: a power of two >= max(D, 16) (``tl.dot`` needs 16)."""
    return max(16, next_power_of_2(d))


@functools.lru_cache(maxsize=None)
def decode_config(d: int, itemsize: int, rows: int, interpreted: bool = False) -> tuple[int, int, int, int]:
    """(BLOCK_R, BLOCK_N, num_warps, num_stages) of the split kernel; BLOCK_R packs the
    ``group x max_query_len`` query rows of one key/value head.

    Example:
        >>> decode_config(128, 2, 4)
        (16, 64, 4, 3)
    """
    block_d = head_block(d)
    cap = 16 if itemsize == 4 else 32 if block_d > 128 else MAX_ROW_BLOCK
    block_r = max(16, min(cap, next_power_of_2(rows)))
    if interpreted:
        return block_r, 16, 1, 1
    if itemsize == 4:
        return block_r, 32, 8, 2
    if block_d > 128:
        return block_r, 32, 4, 2
    return block_r, 64, 4, 3


@functools.lru_cache(maxsize=None)
def prefill_config(d: int, itemsize: int, interpreted: bool = False) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) of the prefill kernel.

    Example:
        >>> prefill_config(128, 2)
        (128, 128, 8, 3)
    """
    if interpreted:
        return 16, 16, 1, 1
    block_d = head_block(d)
    if itemsize == 4:
        return (32, 32, 8, 2) if block_d <= 64 else (32, 16, 8, 2) if block_d <= 128 else (16, 16, 8, 1)
    if block_d <= 64:
        return 128, 64, 4, 3
    if block_d <= 128:
        return 128, 128, 8, 3
    return 64, 32, 8, 2


def decode_splits(batch: int, kv_heads: int, row_blocks: int, capacity: int, sms: int, block_n: int) -> int:
    """Slices per sequence: enough split programs for ``PROGRAMS_PER_SM`` per SM, at most one slice
    per ``block_n`` positions of a table row's capacity. Each program divides its sequence's
    actual length (read on the device) by this count; slices past a short sequence's end are empty.

    Example:
        >>> decode_splits(1, 8, 1, 32768, 132, 64), decode_splits(64, 8, 1, 32768, 132, 64)
        (16, 1)
    """
    want = (PROGRAMS_PER_SM * sms) // max(batch * kv_heads * row_blocks, 1)
    return max(1, min(want, MAX_SPLITS, cdiv(capacity, block_n)))


def append_heads(kv_heads: int, d: int) -> int:
    """Heads per append program: a (heads x D) tile of about ``APPEND_TILE`` elements.

    Example:
        >>> append_heads(8, 128), append_heads(32, 128)
        (8, 32)
    """
    return max(1, min(next_power_of_2(kv_heads), APPEND_TILE // head_block(d)))
