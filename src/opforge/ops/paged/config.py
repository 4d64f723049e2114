"""Tile and split choices of the paged kernels: functions of host-known sizes only.

The tiles start from those of the contiguous attention kernels (``ops/attention/config.py``),
whose loops these kernels share except for where a key's row lives, and the split rule is that of
``decode_attention`` dividing the tokens in the cache. Decode of 16-bit caches aims at more
programs and, where few slices run, wider key tiles (``decode_tiles``), measured on the H100; the
rest is not tuned for pages.
"""
from __future__ import annotations

import functools

from ...runtime.triton.launch import cdiv, next_power_of_2
# the paged kernels' loops are the contiguous kernels' but for where a key's row lives: same tiles
from ..attention.config import MAX_ROW_BLOCK, decode_config, head_block, prefill_config  # noqa: F401

MAX_SPLITS = 128             # decode: at most this many slices of one sequence
PROGRAMS_PER_SM = 1          # decode: split programs aimed for per SM (the contiguous kernel's rule)
APPEND_TILE = 4096           # append: elements of one program's (heads x D) tile
# Decode of float16/bfloat16 caches, D <= 128, one 16-row query block (the group's rows: one new
# token of a GQA group up to 16): the measured case (H100, bf16, block 16, shuffled pools,
# benchmarks/tools/paged_decode_sweep.py, results/h100/2026-11-27-9441900/; us per call):
# - Slices for 2 programs per SM, not 1: a program gathers its keys row by row (each row of a
#   block sits Hkv * D apart), so more programs keep more rows in flight. One sequence: 4096
#   positions D 64 11.8 -> 10.7, 8192 D 128 27.0 -> 23.4, 32768 D 128 77.6 -> 60.1 (the contiguous
#   kernel: 55.2); 8 sequences of 512 D 64 11.2 -> 10.2, of 8192 D 128 133.1 -> 105.6; 512 positions
#   of one sequence unchanged (6.0). 4 programs per SM: slower than 2 at every shape but one.
# - Where that leaves at most WIDE_KEYS_MAX_SPLITS slices (16+ sequences of 8 key/value heads):
#   128 keys per tile, 4 warps, 2 stages, slices for one program per SM. 32 sequences of 512
#   positions D 64 21.0 -> 18.1 (64-key tiles, one slice), D 128 32.5 -> 29.8; of 4096 D 64
#   122.4 -> 104.4. Two slices of those tiles: 22.3, 39.5, 120.7.
DECODE_16BIT_PROGRAMS_PER_SM = 2
WIDE_KEYS_TILE = (128, 4, 2)
WIDE_KEYS_MAX_SPLITS = 2


def decode_splits(batch: int, kv_heads: int, row_blocks: int, capacity: int, sms: int, block_n: int,
                  programs_per_sm: int = PROGRAMS_PER_SM) -> int:
    """Slices per sequence: enough split programs for ``programs_per_sm`` per SM, at most one slice
    per ``block_n`` positions of a table row's capacity. Each program divides its sequence's
    actual length (read on the device) by this count; slices past a short sequence's end are empty.

    Example:
        >>> decode_splits(1, 8, 1, 32768, 132, 64), decode_splits(64, 8, 1, 32768, 132, 64)
        (16, 1)
        >>> decode_splits(1, 8, 1, 32768, 132, 64, programs_per_sm=2)
        33
    """
    want = (programs_per_sm * sms) // max(batch * kv_heads * row_blocks, 1)
    return max(1, min(want, MAX_SPLITS, cdiv(capacity, block_n)))


@functools.lru_cache(maxsize=1024)   # asked on every eager decode step, as decode_config is
def decode_tiles(d: int, itemsize: int, rows: int, batch: int, kv_heads: int, capacity: int, sms: int,
                 interpreted: bool = False) -> tuple[int, int, int, int, int]:
    """(BLOCK_R, BLOCK_N, warps, stages, slices per sequence) of the decode kernel for ``batch``
    sequences rounded up to a power of two. The contiguous kernel's tiles and split rule, except
    for 16-bit caches with D <= 128 and at most 16 query rows per key/value head: slices for
    ``DECODE_16BIT_PROGRAMS_PER_SM``, and where those are at most ``WIDE_KEYS_MAX_SPLITS``, 128-key
    tiles (``WIDE_KEYS_TILE``) with slices for one program per SM.

    Example:
        >>> decode_tiles(64, 2, 4, 32, 8, 4096, 132), decode_tiles(64, 2, 4, 8, 8, 4096, 132)
        ((16, 128, 4, 2, 1), (16, 64, 4, 3, 4))
        >>> decode_tiles(64, 2, 4, 1, 8, 4096, 132), decode_tiles(64, 4, 4, 1, 8, 4096, 132)
        ((16, 64, 4, 3, 33), (16, 32, 8, 2, 16))
        >>> decode_tiles(64, 2, 4 * 16, 32, 8, 1024, 132)    # 16 new tokens of a group of 4
        (64, 64, 4, 3, 1)
    """
    br, bn, warps, stages = decode_config(d, itemsize, rows, interpreted)
    row_blocks = cdiv(rows, br)
    # the batch rounded up to a power of two: a decode step padded to a CUDA graph's batch size
    # (powers of two, then the engine's largest) picks the unpadded step's slices and tiles, so
    # both sum each sequence's keys in the same order and give the same bits
    batch = next_power_of_2(max(batch, 1))
    if interpreted or itemsize != 2 or head_block(d) > 128 or br > 16:
        return br, bn, warps, stages, decode_splits(batch, kv_heads, row_blocks, capacity, sms, bn)
    splits = decode_splits(batch, kv_heads, row_blocks, capacity, sms, bn, DECODE_16BIT_PROGRAMS_PER_SM)
    if splits > WIDE_KEYS_MAX_SPLITS:
        return br, bn, warps, stages, splits
    bn, warps, stages = WIDE_KEYS_TILE
    return br, bn, warps, stages, decode_splits(batch, kv_heads, row_blocks, capacity, sms, bn)


def append_heads(kv_heads: int, d: int) -> int:
    """Heads per append program: a (heads x D) tile of about ``APPEND_TILE`` elements.

    Example:
        >>> append_heads(8, 128), append_heads(32, 128)
        (8, 32)
    """
    return max(1, min(next_power_of_2(kv_heads), APPEND_TILE // head_block(d)))
