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


#: Layer norm's shift in the one-row program from this row width (BLOCK_N) on, without a
#: residual: the row's first value instead of its mean, so the sums no longer wait for a reduction
#: of the whole row. % of copy bf16 / fp16, H100: layer_norm 2048x32768 85 / 84 -> 89.8 / 91.1
#: (``results/h100/2026-11-27-171515d``; one program per SM there: nothing hides an exchange); H200
#: (``results/h200/2026-11-27-2904e06``) 66 / 65 -> 72 / 75. Measured for the rules below on the
#: H100 with every variant shifted (``results/h100/2026-11-27-17514de``). Not below
#: it: at 4096x16384 the shift's registers allow one program per SM instead of two (92 -> 74-76);
#: not on narrow rows (multirow, 88-90 -> 87-88), not with a residual (add_layer_norm 2048x32768
#: 93-94 -> 90-91), not in the looped variant (no gain at 1024x65536).
FIRST_VALUE_SHIFT_MIN_N = 32768


def first_value_shift(block_n: int, has_residual: bool) -> bool:
    """Whether layer norm's one-row program shifts by the row's first value (else by the mean).

    Example:
        >>> first_value_shift(32768, False), first_value_shift(16384, False), first_value_shift(32768, True)
        (True, False, False)
    """
    return block_n >= FIRST_VALUE_SHIFT_MIN_N and not has_residual


def paired_sums(block_m: int, block_n: int) -> bool:
    """Whether layer norm's tile program sums d and d^2 in one reduction of pairs: on tiles of several
    rows and on one-row programs from ``FIRST_VALUE_SHIFT_MIN_N``, where one exchange fewer per row
    shows (H100 32768x1024 88 -> 89%, 2048x32768 85 -> 86%); one-row programs below it keep two sums
    (4096x16384: H100 92 -> 91%, H200 bf16 78 -> 73-74%). The looped variant always pairs (1024x65536
    79-80 -> 80-81.5%).

    Example:
        >>> paired_sums(16, 128), paired_sums(1, 16384), paired_sums(1, 32768)
        (True, False, True)
    """
    return block_m > 1 or block_n >= FIRST_VALUE_SHIFT_MIN_N


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
