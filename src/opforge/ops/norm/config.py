"""Row limits and launch shapes of the norm kernels: functions of host-known sizes only.

The Triton kernels (``triton_kernels.py``) take their variants' row limits and tiles from here;
the H100 runs behind them are in ``benchmarks/NOTES.md`` (norms).
"""
from __future__ import annotations

import functools

from ...runtime.triton.launch import next_power_of_2

MULTIROW_MAX_N = 1024
TILE_BYTES = 4096                 # input bytes a multirow program holds (BLOCK_M * BLOCK_N * itemsize)
ROW_MAX_N = {2: 32768, 4: 32768}  # per element size: widest row kept whole in registers
LOOP_CHUNK = 32768


@functools.lru_cache(maxsize=None)
def multirow_config(n: int, itemsize: int) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps) for a tile of narrow rows: 4 KiB of input, 4 warps (H100-tuned).

    Example:
        >>> multirow_config(1000, 2)
        (2, 1024, 4)
    """
    block_n = next_power_of_2(n)
    return max(1, min(128, TILE_BYTES // itemsize // block_n)), block_n, 4


@functools.lru_cache(maxsize=None)
def row_config(n: int, itemsize: int, is_rms: bool) -> tuple[int, int, int]:
    """(BLOCK_M=1, BLOCK_N, num_warps) for one row per program held in registers (H100-tuned).

    Example:
        >>> row_config(32768, 4, True), row_config(32768, 2, True)
        ((1, 32768, 16), (1, 32768, 32))
    """
    block_n = next_power_of_2(n)
    warps = 4 if block_n <= 2048 else 8 if block_n <= 8192 else 16 if block_n <= 16384 else 32
    if block_n == 32768 and itemsize == 4 and is_rms:
        warps = 16  # one float32 array per thread: more programs per SM beat more threads per row
    return 1, block_n, warps


@functools.lru_cache(maxsize=None)
def looped_config(n: int) -> tuple[int, int]:
    """(CHUNK, num_warps) for the looped variant.

    Example:
        >>> looped_config(65536)
        (32768, 32)
    """
    chunk = min(LOOP_CHUNK, next_power_of_2(n))
    return chunk, max(4, min(32, chunk // 512))
