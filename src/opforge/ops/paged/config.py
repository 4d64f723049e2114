"""Tile and split choices of the paged kernels: functions of host-known sizes only.

None of these is measured on a GPU yet: the tiles are those of the contiguous attention kernels
(``ops/attention/config.py``), whose loops these kernels share except for where a key's
row lives, and the split rule is that of ``decode_attention`` dividing the tokens in the cache.
"""
from __future__ import annotations


from ...runtime.triton.launch import cdiv, next_power_of_2
# the paged kernels' loops are the contiguous kernels' but for where a key's row lives: same tiles
from ..attention.config import MAX_ROW_BLOCK, decode_config, head_block, prefill_config  # noqa: F401

MAX_SPLITS = 128             # decode: at most this many slices of one sequence
PROGRAMS_PER_SM = 1          # decode: split programs aimed for per SM
APPEND_TILE = 4096           # append: elements of one program's (heads x D) tile


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
