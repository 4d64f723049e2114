"""Tile, warp and split choices of the softmax kernels: functions of host-known sizes only.

The Triton kernels (``triton_kernels.py``) take their variants' row limits and launch shapes
from here; the measurements behind them are in ``benchmarks/NOTES.md`` (softmax).
"""
from __future__ import annotations

import functools

from ...runtime.triton.launch import cdiv, next_power_of_2
# narrow rows and whole rows in registers: the norms' limits and tile rule, measured the same way
from ..norm.config import MULTIROW_MAX_N, ROW_MAX_N, multirow_config  # noqa: F401

LOOP_CHUNK_BYTES = (16384, 32768)    # bytes per step of the looped walk: rows up to 64K elements, wider
                                      # (H100 sweep, bf16: 85% at 1024x65536, 88% at 4096x131072)
LOOP_CTAS_PER_SM = 64                 # looped grid: up to this many programs per SM, so in practice one
                                      # program per row (the sweep beat a persistent 1-per-SM grid)
SPLIT_CHUNK = 2048                    # elements per step of a split segment
SPLIT_PROGRAMS_PER_SM = 4             # how many segment programs the split variant aims for
MAX_SPLITS = 1024


@functools.lru_cache(maxsize=None)
def row_config(n: int) -> tuple[int, int, int]:
    """(BLOCK_M=1, BLOCK_N, num_warps) for one row per program held in registers.

    Example:
        >>> row_config(4096)
        (1, 4096, 8)
    """
    block_n = next_power_of_2(n)
    warps = 4 if block_n <= 2048 else 8 if block_n <= 8192 else 16 if block_n <= 16384 else 32
    return 1, block_n, warps


@functools.lru_cache(maxsize=None)
def looped_config(elem_size: int, n: int) -> tuple[int, int]:
    """(CHUNK, num_warps) for the looped variant: 16 KiB steps for rows up to 65536 elements,
    32 KiB beyond; 16 warps (a step shorter than 8192 elements: one warp per 512 of them, see
    ``launch_looped``). H100, 1024x65536 (``results/h100/2026-11-27-c62943e``): 16 warps on 8192-element
    steps 87.5 / 87.6% of copy (bf16 / fp16) where 8 warps gave 85.8 / 77.3%.

    Example:
        >>> looped_config(2, 65536), looped_config(2, 131072)
        ((8192, 16), (16384, 16))
    """
    return LOOP_CHUNK_BYTES[n > 65536] // elem_size, 16


def split_config(rows: int, n: int, sms: int, chunk: int = SPLIT_CHUNK) -> tuple[int, int]:
    """(splits, seg): segments per row and their length (a multiple of ``chunk``).

    Example:
        >>> split_config(1, 1 << 20, 132)
        (512, 2048)
    """
    want = max(1, -(-SPLIT_PROGRAMS_PER_SM * sms // rows))
    splits = max(1, min(want, MAX_SPLITS, cdiv(n, chunk)))
    seg = cdiv(cdiv(n, splits), chunk) * chunk
    return cdiv(n, seg), seg
