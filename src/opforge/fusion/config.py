"""Block sizes of generated kernels: a pure function of the iteration space and element size.

A program handles ``TILE_BYTES`` bytes of its widest input (4 KiB: 16 bytes per thread, four
times, with 4 warps), enough loads in flight to stream at full bandwidth on an H100 while
keeping registers light. Plans cache the result; change these and call
``opforge.fusion.clear_caches()`` to try others (``opforge bench --suite fusion`` measures the result).

Example:
    >>> flat_config(1 << 20, 2)
    (2048, 4)
    >>> tiled_config(16384, 4096, 2)
    (1, 2048, 4)
"""
from __future__ import annotations

from .layout import next_power_of_2

TILE_BYTES = 4096
NUM_WARPS = 4
MIN_BLOCK = 32


def flat_config(numel: int, itemsize: int) -> tuple[int, int]:
    """(BLOCK, num_warps) for a flat kernel over ``numel`` elements."""
    block = max(MIN_BLOCK, min(TILE_BYTES // itemsize, next_power_of_2(numel)))
    return block, NUM_WARPS if block >= 1024 else max(1, block // 256)


def tiled_config(rows: int, cols: int, itemsize: int) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps) for a tiled kernel over ``rows`` x ``cols``."""
    tile = TILE_BYTES // itemsize
    block_n = max(1, min(tile, next_power_of_2(cols)))
    block_m = max(1, min(next_power_of_2(rows), tile // block_n))
    elements = block_m * block_n
    return block_m, block_n, NUM_WARPS if elements >= 1024 else max(1, elements // 256)
