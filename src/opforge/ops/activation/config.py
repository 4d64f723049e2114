"""Block sizes of the activation kernel: a function of the row length and element size only."""
from __future__ import annotations

import functools

from ...runtime.triton.launch import next_power_of_2

BLOCK = {2: 4096, 4: 2048}     # per element size: elements per program (8 KiB)
MIN_BLOCK = 16


@functools.lru_cache(maxsize=None)
def block_config(n: int, elem_size: int) -> tuple[int, int]:
    """(BLOCK, num_warps) for rows of ``n`` elements (``n`` = numel for a flat tensor).

    Example:
        >>> block_config(16384, 2), block_config(100, 4)
        ((4096, 8), (128, 1))
    """
    block = max(MIN_BLOCK, min(BLOCK[elem_size], next_power_of_2(n)))
    return block, max(1, min(8, block // 512))
