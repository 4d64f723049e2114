"""Tile and split choices of the paged kernels: functions of host-known sizes only.

The tiles start from those of the contiguous attention kernels (``ops/attention/config.py``),
whose loops these kernels share except for where a key's row lives, and the split rule is that of
``decode_attention`` dividing the tokens in the cache. Decode with few slices per sequence takes
wider key tiles (``decode_tiles``), measured on the H100; the rest is not tuned for pages.
"""
from __future__ import annotations


from ...runtime.triton.launch import cdiv, next_power_of_2
# the paged kernels' loops are the contiguous kernels' but for where a key's row lives: same tiles
from ..attention.config import MAX_ROW_BLOCK, decode_config, head_block, prefill_config  # noqa: F401

MAX_SPLITS = 128             # decode: at most this many slices of one sequence
PROGRAMS_PER_SM = 1          # decode: split programs aimed for per SM
APPEND_TILE = 4096           # append: elements of one program's (heads x D) tile
# decode, float16/bfloat16, D <= 128, one 16-row query block (the group's rows: one new token of
# a GQA group up to 16), where the split rule leaves at most WIDE_KEYS_MAX_SPLITS slices per sequence (8+ sequences of 8 key/value heads on 132 SMs): 128 keys per tile, 4 warps, 2
# stages. A program gathers its keys row by row (each row of a block sits Hkv * D apart), so it
# needs more rows in flight than the contiguous kernel's 64-key tiles give. H100, bf16, block 16,
# shuffled pools, 512 positions (us, the default before -> this): 32 sequences D 64 21.0 -> 18.1,
# D 128 32.5 -> 29.8; 8 sequences D 64 12.2 -> 11.1; 32 sequences of 4096 D 64 122.4 -> 103.5.
# With more slices (one sequence: 16) the 64-key tiles stay faster (6.0 vs 8.4 us at the best
# two-slice wide tile). benchmarks/tools/paged_decode_sweep.py
WIDE_KEYS_TILE = (128, 4, 2)
WIDE_KEYS_MAX_SPLITS = 2


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


def decode_tiles(d: int, itemsize: int, rows: int, batch: int, kv_heads: int, capacity: int, sms: int,
                 interpreted: bool = False) -> tuple[int, int, int, int, int]:
    """(BLOCK_R, BLOCK_N, warps, stages, slices per sequence) of the decode kernel: the
    contiguous kernel's tiles and ``decode_splits``, or 128-key tiles (``WIDE_KEYS_TILE``) for
    16-bit caches with D <= 128 and at most 16 query rows per key/value head, where that rule
    leaves at most ``WIDE_KEYS_MAX_SPLITS`` slices (measured only there).

    Example:
        >>> decode_tiles(64, 2, 4, 32, 8, 1024, 132), decode_tiles(64, 2, 4, 1, 8, 1024, 132)
        ((16, 128, 4, 2, 1), (16, 64, 4, 3, 16))
        >>> decode_tiles(64, 2, 4 * 16, 32, 8, 1024, 132)    # 16 new tokens of a group of 4
        (64, 64, 4, 3, 1)
    """
    br, bn, warps, stages = decode_config(d, itemsize, rows, interpreted)
    row_blocks = cdiv(rows, br)
    splits = decode_splits(batch, kv_heads, row_blocks, capacity, sms, bn)
    if interpreted or itemsize != 2 or head_block(d) > 128 or br > 16 or splits > WIDE_KEYS_MAX_SPLITS:
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
