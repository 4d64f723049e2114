"""Launch heuristics of the quantized ``linear`` Triton kernels: tiles, K splits, kernel forms.

Each choice here is a pure function of the problem (M, N, K, bits, group) and the device's SM
count, with the H100 measurement that chose it beside it; ``triton_kernels`` holds the kernels
and their launch, and ``problem`` the thresholds between variants.

Example:
    >>> import torch
    >>> from opforge.ops.quant.problem import LinearProblem
    >>> tile_config(LinearProblem(torch.bfloat16, 16, 4096, 4096, 4, 128, False, False, "cuda"))
    (16, 64, 128, True, 4, 3)
"""
from __future__ import annotations

import functools
from typing import Optional

import torch

from ...runtime.backends import triton_interpreting
from ...runtime.triton.launch import cdiv
from .problem import LinearProblem

PROGRAMS_PER_SM = 4           # split K until about this many programs per SM are in flight
MAX_SPLIT = 32
#: The FMA (GEMV) kernel takes up to this many rows of x per program (BLOCK_M) ...
GEMV_MAX_M = 16
#: ... and runs by default up to this many (int4; int8: 2). Past 4 rows its 3-D tiles spill on
#: sm_90 (ptxas, benchmarks/tools/quant_ptx.py) and the tl.dot kernel with 16 padded rows takes over.
GEMV_ROWS = 4
#: Reduce K splits inside the kernel (the last split of a tile adds the partials, one launch)
#: instead of a second combine kernel, per kernel. H100 tile sweep at 980a81d (int4 g128; single
#: launch configs): on for the int4 GEMV kernel (int8's measured slower end to end): 4096x4096 M=1
#: 18.0 -> 13.1 us, M=4 25.6 -> 24.2; 28672x8192 M=1 90.2 -> 89.2, M=4 220.1 -> 210.9; bitwise equal to the combine
#: kernel; off for the dot kernel (M=8/16: -5% at 4096x4096, +1-2% at 28672x8192). Its tile
#: counters are per device and stream (``_counters``).
SPLIT_FIXUP_GEMV = True
SPLIT_FIXUP_DOT = False
#: Wide-K GEMV tiles for M = 1 (``wide_k_config``): each program step loads 8 KB of packed
#: words at once, as 8 rows of 1 KB (2048 int4 / 1024 int8 codes) or, for N >= ``WIDE_K_WIDE_N``,
#: 16 rows of 512 B, so a decode-sized weight is read in one or a few steps with every load in
#: flight, instead of 8 KB steps of 128 codes over up to 16 K splits. H100 sweep (at b634a74,
#: CUDA graphs over L2-cold weights, ``results/h100/2026-11-23-b634a74/breakdown_run1.json``): 1B qkv/o/gate_up/down
#: 4.6/4.0/12.5/9.2 us vs 6.8/6.1/13.4/10.2 with the 128x128 tiles (torch's tinygemm 4.1/3.8/12.0/8.3).
WIDE_K_STEP_BYTES = 8192
WIDE_K_WIDE_N = 16384
WIDE_K_PROGRAMS_PER_SM = 4
#: The dot kernel with the weight as the MMA's first operand (SWAP) for M up to ``SWAP_MAX_M``,
#: on tiles of 64 features x 128 codes (int4 and int8). H100 sweep (at f515a1a, CUDA graphs over
#: L2-cold weights, the nine 1B/8B projection shapes, speed as a multiple of bf16 cuBLAS): int4
#: M=16 0.44-0.77x -> 0.74-1.38x, int8 M=16 0.73-1.31x -> 0.88-1.87x; int4 M=32 0.23-0.38x ->
#: 0.54-1.15x (results/h100/2026-11-23-f515a1a/results.md).
SWAP_MAX_M = 64
#: The swapped dot kernel always unpacks int4 codes through ``tl.join`` (JOIN, ``_load_codes``).
#: H100 sweep at f515a1a: M=16 8B gate_up 73.5 -> 63.0 us, 1B lm_head 139.8 ->
#: 113.9, 1B gate_up 23.2 -> 20.7; M=64 8B o 26.4 -> 23.1; the 1B model's batch-8 int4 step
#: 1351 -> 1264 us.
#:
#: int4, M ``UNSWAPPED_JOIN_MIN_M``..``SWAP_MAX_M``, N*K of at least ``UNSWAPPED_JOIN_MIN_NK``:
#: the dot kernel NOT swapped, with JOIN, on (64, 128, 128) tiles (``_unswapped_join``). H100 sweep (at fed7445, results/h100/2026-11-23-fed7445/run1, M=64, bf16 x,
#: g128) vs the swapped tiles: 128256x2048 160.8 vs 188.1 us, 28672x4096 94.7 vs 102.4,
#: 4096x14336 48.1 vs 57.8; smaller weights lose (16384x2048 32.2 vs 28.1, 4096x4096 36.4 vs
#: 23.3). At M=32 the swapped tiles are best or within noise everywhere.
UNSWAPPED_JOIN_MIN_M = 33
UNSWAPPED_JOIN_MIN_NK = 48 * 2 ** 20


@functools.lru_cache(maxsize=16)
def _sm_count(device_index) -> int:
    if triton_interpreting() or device_index is None:
        return 1   # the interpreter runs programs one by one: keep grids small
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def tile_config(p: LinearProblem) -> tuple[int, int, int, bool, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K, use_dot, num_warps, num_stages) for a problem.

    M <= 4 (int8: 2; the GEMV kernel, no dot, BLOCK_M the next power of two): 8 KB of packed
    words per program step, int4 128 features x 128 codes (the g128 group: one scale per row and
    step), int8 64 x 128. M up to 16: 16 padded rows, tl.dot, 64 features, BLOCK_K the group (at
    most 128). M 17..64: 32- or 64-row tiles of 64 features (weight-bound still: many programs
    from N alone), BLOCK_K = min(group, 64). More rows: 64- or 128-row tiles, 128 features unless
    N is small, BLOCK_K = min(group, 64).

    int4 takes the best of the H100 tile sweep at 980a81d (4096x4096 and 28672x8192, int4 g128;
    benchmarks/NOTES.md): M 5..16 128 features, M 33..64 BLOCK_K up to 128. int8 keeps the default tiles (not swept). One row
    (int4 and int8) takes ``wide_k_config`` (the sweep at b634a74). Past the GEMV's rows and up to
    ``SWAP_MAX_M`` the swapped dot
    kernel's tiles: BLOCK_M the power of two >= M (16 at least), 64 features, BLOCK_K the group up
    to 128 (the sweep at f515a1a); except int4 at M 33..64 with N*K >= ``UNSWAPPED_JOIN_MIN_NK``:
    (64, 128, BLOCK_K the group up to 128), not swapped, JOIN (at fed7445: M=64 28672x4096 94.7
    vs 102.4 us).

    Example:
        >>> from opforge.ops.quant.problem import LinearProblem
        >>> tile_config(LinearProblem(torch.bfloat16, 4, 4096, 4096, 4, 128, False, False, "cuda"))
        (4, 128, 128, False, 4, 3)
    """
    g = p.k if p.group >= p.k else p.group
    if p.m == 1 and _gemv_ok(p):
        wide = wide_k_config(p)
        if wide is not None:
            return wide
    if p.m <= GEMV_ROWS and _gemv_ok(p):
        block_m = _pow2_ge(p.m)
        # int4 128 features (4 rows per thread; 255 registers, no spills at 4 rows of x), int8 64
        return block_m, 128 if p.bits == 4 else 64, 128, False, 4, 3
    if _unswapped_join(p):
        return 64, 128, min(_pow2_le(g), 128), True, 4, 3
    if _swapped(p):
        return max(16, _pow2_ge(p.m)), 64, min(_pow2_le(g), 128), True, 4, 3
    int4 = p.bits == 4
    if p.m <= 16:
        # int4 128 features: 4096x4096 M=16 31.5 -> 25.6 us, 28672x8192 328.9 -> 240.8 us (H100 sweep)
        return 16, 128 if int4 else 64, min(_pow2_le(g), 128), True, 4, 3
    if p.m <= 64:   # still weight-bound: narrow tiles, so N alone gives many programs
        # int4 64 rows, BLOCK_K up to 128: M=64 34.1 -> 30.8 us, 233.9 -> 221.3 us (H100 sweep)
        wide_k = int4 and p.m > 32
        return 32 if p.m <= 32 else 64, 64, min(_pow2_le(g), 128 if wide_k else 64), True, 4, 3
    block_m = 64 if p.m < 256 else 128
    block_n = 128 if p.n >= 128 else 64
    return block_m, block_n, min(_pow2_le(g), 64), True, 8 if block_m == 128 else 4, 3


def _swapped(p: LinearProblem) -> bool:
    """Whether the dot kernel runs in its SWAP form for this problem (see ``SWAP_MAX_M``)."""
    return p.m <= SWAP_MAX_M and not (p.m <= GEMV_ROWS and _gemv_ok(p)) \
        and not _unswapped_join(p)


def _unswapped_join(p: LinearProblem) -> bool:
    """Whether the dot kernel runs NOT swapped, with JOIN, on (64, 128, 128) tiles for this
    problem (see ``UNSWAPPED_JOIN_MIN_NK``)."""
    return p.bits == 4 and UNSWAPPED_JOIN_MIN_M <= p.m <= SWAP_MAX_M \
        and p.n * p.k >= UNSWAPPED_JOIN_MIN_NK


def wide_k_config(p: LinearProblem) -> Optional[tuple[int, int, int, bool, int, int]]:
    """The wide-K GEMV tile for one row of x (see ``WIDE_K_STEP_BYTES``), or None where the group does not
    divide the K tile: rows of 1 KB of packed codes (512 B from N = ``WIDE_K_WIDE_N``; K itself
    if shorter, rounded down to a power of two), ``WIDE_K_STEP_BYTES`` per step, 4 warps.

    Example:
        >>> wide_k_config(LinearProblem(torch.bfloat16, 1, 2048, 8192, 4, 128, False, False, "cuda"))
        (1, 8, 2048, False, 4, 1)
        >>> wide_k_config(LinearProblem(torch.bfloat16, 1, 16384, 2048, 8, -1, True, False, "cuda"))
        (1, 16, 512, False, 4, 1)
    """
    row_bytes = 1024 if p.n < WIDE_K_WIDE_N else 512
    block_k = min(row_bytes * 8 // p.bits, _pow2_le(p.k))
    per_row = p.group >= p.k or p.group <= 0
    if not per_row and block_k % p.group:
        return None
    block_n = max(8, min(64, WIDE_K_STEP_BYTES // (block_k * p.bits // 8)))
    return 1, block_n, block_k, False, 4, 1


def _programs_per_sm(config: tuple) -> int:
    """K splits aim at this many programs per SM: fewer for wide-K GEMV tiles (their steps are
    few and large; each split adds a partial write and a fixup)."""
    wide = not config[3] and config[2] > 128
    return WIDE_K_PROGRAMS_PER_SM if wide else PROGRAMS_PER_SM


def _gemv_ok(p: LinearProblem) -> bool:
    """The GEMV kernel reads int32 words: int8 rows need K % 4 == 0 (int4 always has K % 8 == 0);
    int8 runs it up to 2 rows (its tiles hold twice the words of int4's)."""
    return p.bits == 4 or (p.k % 4 == 0 and p.m <= 2)


def code_mode(bits: int, dtype: torch.dtype) -> tuple[int, int]:
    """How the dot path turns codes into x's dtype (see ``_codes_as_float``), and the offset that
    leaves on them: int4 and bf16 x: bf16 128 + code; fp16 x: fp16 1024 + code; int8 and bf16 x
    (128 + code needs 9 significant bits): float32, then rounded to bf16 (exact)."""
    if dtype == torch.float16:
        return 2, 1024
    return (1, 128) if bits == 4 else (3, 0)


def _pow2_ge(v: int) -> int:
    return 1 << (v - 1).bit_length()


def _pow2_le(v: int) -> int:
    return 1 << (v.bit_length() - 1)


#: Weight bytes a planes-kernel launch with programmatic dependent launch asks L2 for before it
#: waits on the previous kernel (``pdl.prefetch_to_l2``; ``planes_tiles.PLANES_PREFETCH_MIN_NK``):
#: the first lines of each resident program's rows. 16 and 32 MB were slower on the 8B int4 model
#: (``results/h100/2026-11-28-17c4553``).
PREFETCH_BYTES = 8 * 2 ** 20


def prefetch_lines(programs: int, device: torch.device, programs_per_sm: int, rows: int, row_bytes: int) -> int:
    """128-byte lines of each of its ``rows`` weight rows (``row_bytes`` each in its K range) that a
    program prefetches before its PDL wait: a power of two, the programs resident at once
    (``programs_per_sm`` per SM) asking for about ``PREFETCH_BYTES`` in all; 0 for none."""
    resident = min(programs, programs_per_sm * _sm_count(device.index if device.type == "cuda" else None))
    return lines_within(PREFETCH_BYTES, resident * rows, row_bytes)


def lines_within(budget: int, rows: int, row_bytes: int) -> int:
    """The power of two of 128-byte lines per row that ``rows`` rows of ``row_bytes`` can each
    prefetch within ``budget`` bytes (at most a row's lines), or 0.

    Example:
        >>> lines_within(8 * 2 ** 20, 448 * 64, 2048)     # 8B gate_up at one row: 448 programs of 64 rows
        2
        >>> lines_within(8 * 2 ** 20, 528 * 64, 2048), lines_within(2 ** 20, 528 * 64, 2048)   # the 8B head
        (1, 0)
    """
    lines = min(cdiv(row_bytes, 128), budget // (rows * 128))
    return 0 if lines < 1 else _pow2_le(lines)


def _split(tiles: int, k: int, block_k: int, device: torch.device, programs_per_sm: int,
           max_split: int = MAX_SPLIT) -> tuple[int, int]:
    """(splits, K per split): split K while the tiles alone give fewer than ``programs_per_sm``
    programs per SM, each split a whole number of K tiles, at most ``max_split``."""
    k_steps = cdiv(k, block_k)
    want = programs_per_sm * _sm_count(device.index if device.type == "cuda" else None)
    split = max(1, min(max_split, k_steps, want // tiles)) if tiles < want else 1
    k_per_split = cdiv(k_steps, split) * block_k
    return cdiv(k, k_per_split), k_per_split


def split_fixup(config: tuple, bits: int = 4) -> bool:
    """Whether a ``tile_config`` tuple reduces K splits in the kernel by default, per kernel:
    ``SPLIT_FIXUP_GEMV`` for the int4 GEMV kernel, ``SPLIT_FIXUP_DOT`` with dot (int8's GEMV
    measured slower with it, at 629522a).

    Example:
        >>> gemv, dot = (1, 128, 128, False, 4, 3), (16, 64, 128, True, 4, 3)
        >>> split_fixup(gemv), split_fixup(dot), split_fixup(gemv, bits=8)
        (True, False, False)
    """
    if config[3]:
        return SPLIT_FIXUP_DOT
    return SPLIT_FIXUP_GEMV and bits == 4
