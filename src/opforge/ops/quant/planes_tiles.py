"""Which kernel runs a ``planes``-layout int4 problem, and the planes kernel's tiles: functions of
host-known sizes only (rows M, features N, inputs K), chosen from H100 measurements.

A tile is (BLOCK_N, num_warps, num_stages, programs per SM that K splits aim at, chunks per loop
step, scale ahead, one K = 128 dot, scale folded); ``planes_config`` puts BLOCK_M in front.

* Chunks per step: 128-code chunks each loop step reads (2: half the barriers per code, 128
  contiguous bytes of each row).
* Scale ahead: each group's scale loaded a chunk early (the pipeline copies the zero's word but
  leaves the scale's a plain load where the two layouts differ).
* One K = 128 dot: a chunk's 8 planes joined into one (BLOCK_N, 128) operand, one ``tl.dot``.
  Triton waits for an MMA whose sum is not carried over the loop; with 8 dots of K = 16 that
  was 8 waits per chunk (sm_90 PTX: ``wgmma.wait_group 0`` after each wgmma), with one dot of
  K = 128 it is one. Exact: the same MMAs on the same values.
* Scale folded: ``(code - zero) * scale`` rounded to x's dtype is the MMA operand and the sum is
  carried over the loop, so no wgmma waits inside it (pendings 7 in the PTX). The weight is then
  rounded to 16 bits as dequant+cuBLAS rounds it (H100 check: ‖out−ref‖/‖ref‖ 2.7e-3 against
  1.7e-3 unfolded, bf16 x; the tolerance is 1e-2). Only where it was measurably faster.

Measured (H100, CUDA graphs over L2-cold weights, bf16 x, g128, ``benchmarks/tools/int4_candidate.py``;
``results/h100/2026-11-27-029a7c4/fold_probe{,2,3}.json``), us before -> after:

* 1-8 rows (one row: the planes kernel from ``PLANES_MMA_MIN_NK``): four warps, 2 programs per
  SM, K = 128 dot on weights under 48M elements (1B qkv 5.8 -> 5.0, 1B o 4.9 -> 4.6, 1B down 9.3
  -> 7.7, 8B o 8.3 -> 7.2 at 2 rows; 8B qkv 9.9 -> 10.3); from 48M two warps with the K = 128
  dot (8B gate_up 34.2 -> 28.2, 8B head 117.6 -> 107.7, 8B down 17.4 -> 17.1). Same order at 4
  and 8 rows. One row takes the same tiles through a copy of the kernel whose M is not
  specialized (``planes._planes_one_row_kernel``): compiled with M == 1 as a constant, the K = 128
  tiles ran slower than at 2 rows (8B gate_up 35.0 vs 28.0 us, 8B head 121.8 vs 107.4;
  ``results/h100/2026-11-27-e5379f8/int4_small_rows.json``), so one row had kept a two-warp tile
  without the K = 128 dot (8B gate_up 34.5, 1B gate_up 11.4).
  Two warps at 2 programs per SM on every weight from 16M elements, faster in that probe (1B
  gate_up 10.5 -> 9.7, 8B down 17.2 -> 16.4 us), was slower in the ``quant_batch`` suite (11.0
  -> 12.0, 17.7 -> 18.6) and in the models (1B int4 at batch 8 8,590 -> 8,115 tokens/s):
  dropped (``results/h100/2026-11-28-b338125``).
  One row with K >= 4096 under 48M elements (8B qkv and o, 1B down): one warpgroup on 128
  features, K splits for 2 programs per SM (``one_row_sweep.py``,
  ``results/h100/2026-11-28-6488db1/one_row_sweep.json``: 8B qkv 10.3 -> 8.7 us, 8B o 6.9 -> 6.6,
  1B down 7.1 -> 7.0; no tile of the planes GEMV, 4-16 KB steps, 4-8 warps, beat the planes
  kernel on any of the six weights swept).
* 9-16 rows: the output heads (from 128M elements) two warps with the K = 128 dot (1B head 65.9
  -> 64.2, 8B head 128.5 -> 124.2; four warps 69.5 and 139.7); K >= 4096 up to 32M elements one
  warpgroup on 128 features with the K = 128 dot (8B qkv 11.2 -> 9.7, 8B o 8.4 -> 7.9, 1B down
  9.3 -> 8.9); the rest four warps on 64 features with the K = 128 dot (1B qkv 5.5 -> 5.1, 1B o
  5.1 -> 4.6, 1B gate_up 12.6 -> 11.4, 8B gate_up 38.3 -> 33.0, 8B down 22.0 -> 18.2).
* 17-32 rows: four warps on 64 features with the K = 128 dot everywhere (1B qkv 6.7 -> 5.8, 1B
  gate_up 18.1 -> 13.2, 1B down 10.4 -> 8.6, 1B head 77.0 -> 68.5, 8B qkv 13.3 -> 10.4, 8B o 9.9
  -> 8.1, 8B gate_up 42.4 -> 36.8, 8B down 27.2 -> 20.3, 8B head 163.2 -> 136.3). The same tile
  with the scale folded: within 0-8% of it, slower on 7 of 10.
* 9-32 rows, four warps on 64 features, from ``PLANES_UNSPLIT_MIN_N`` features (256+ tiles): no
  K split, one launch (``results/h100/2026-11-27-38e84fd/unsplit_probe.json``: 1B gate_up 11.3
  -> 10.6 at 16 rows, 13.5 -> 11.2 at 32; the wider weights split no K already). Fewer tiles keep
  their splits and the combine kernel (unsplit 1B down 9.0 -> 35.3, 8B qkv 10.5 -> 13.5 at 32
  rows; the split sum added in the kernel instead, ``fixup``: 5.9 -> 6.7 at 32 rows on 1B qkv).
* 33+ rows (64-row tiles): K = 128 dot everywhere; the scale folded on the 256-feature large
  tile (from 48M elements: 8B gate_up 46.6 -> 43.6, 8B down 30.8 -> 28.4, 8B head 181.2 ->
  175.5, 1B head 96.5 -> 89.4; unfolded 46.7, 31.9, 193.3, 96.4: that tile spills, 104 B
  unfolded, 40 B folded) and on two 32-row tiles of 128 features (up to 16M elements: 1B down
  14.8 -> 12.6, 8B o 14.2 -> 11.9); weights up to 8M elements (1B qkv, o) as 16-row two-warp
  tiles (9.6 -> 7.7, 7.4 -> 7.4); between, two warpgroups on 128 features, scale ahead (1B
  gate_up 17.7 -> 15.1, 8B qkv 19.1 -> 18.3; folded 21.8, 23.0). At 65+ rows (``quant_batch``,
  ``results/h100/2026-11-27-029a7c4/quant_batch.json``) the folded large tile kept its lead (96
  rows: 8B gate_up 95.1 -> 86.1, down 51.3 -> 46.2, 1B head 192.5 -> 175.3) but the folded 32-row
  tiles lost on 8B o (26.4 -> 33.0), so from 65 rows those run a dot per plane, unfolded, as before.
"""
from __future__ import annotations

from .problem import LinearProblem

#: BLOCK_M of the planes kernel is the power of two >= M within 16..``PLANES_MAX_BLOCK_M``.
PLANES_MAX_BLOCK_M = 64
#: two warps (mma.sync), two chunks per step, one K = 128 dot: 1-8 rows from ``PLANES_LARGE_MIN_NK``,
#: 9-16 rows from ``PLANES_HEAD_MIN_NK``, 33+ rows up to ``PLANES_SMALL_MAX_NK`` (as 16-row tiles)
PLANES_TILE_TWO_WARPS = (64, 2, 3, 4, 2, False, True, False)
#: 1-8 rows under ``PLANES_LARGE_MIN_NK``: four warps on 64 features, K splits for 2 programs per SM
PLANES_TILE_FEW_ROWS = (64, 4, 4, 2, 1, False, True, False)
#: 9-32 rows (the other cases): four warps on 64 features, 4 stages
PLANES_TILE_FOUR_WARPS = (64, 4, 4, 4, 1, False, True, False)
#: ... from ``PLANES_UNSPLIT_MIN_N`` features: the same, no K split (1 program per SM aimed at)
PLANES_TILE_FOUR_WARPS_UNSPLIT = (64, 4, 4, 1, 1, False, True, False)
#: 9-16 rows with K >= ``PLANES_WIDE_MIN_K`` up to ``PLANES_WIDE_MAX_NK``: one warpgroup on 128 features
PLANES_TILE_WIDE = (128, 4, 4, 4, 1, False, True, False)
#: one row with K >= ``PLANES_WIDE_MIN_K`` under ``PLANES_LARGE_MIN_NK``: the same, K splits for 2
#: programs per SM (``results/h100/2026-11-28-6488db1/one_row_sweep.json``, us: 8B qkv 10.3 -> 8.7,
#: 8B o 6.9 -> 6.6, 1B down 7.1 -> 7.0)
PLANES_TILE_ONE_ROW_WIDE = (128, 4, 4, 2, 1, False, True, False)
#: 33+ rows up to ``PLANES_MIDDLE_MAX_NK``: two 32-row tiles of one warpgroup on 128 features, scale folded
PLANES_TILE_WIDE_FOLDED = (128, 4, 4, 4, 1, False, True, True)
#: 65+ rows up to ``PLANES_MIDDLE_MAX_NK``: the same 32-row tiles, a dot per plane, the scale unfolded
#: (``quant_batch`` at 96 / 128 rows, 8B o: 26.4 / 26.1 us, folded 33.0 / 33.0)
PLANES_TILE_WIDE_PER_PLANE = (128, 4, 4, 4, 1, False, False, False)
#: 33+ rows between: two warpgroups on 128 features, 3 stages, scale ahead, 2 programs per SM
PLANES_TILE_EIGHT_WARPS = (128, 8, 3, 2, 1, True, True, False)
#: 33+ rows from ``PLANES_LARGE_MIN_NK``: 256 features, 8 warps, no K split, scale folded
PLANES_TILE_LARGE = (256, 8, 3, 1, 1, False, True, True)

PLANES_SMALL_MAX_NK = 8 * 2 ** 20      # 1B qkv and o
PLANES_MIDDLE_MAX_NK = 16 * 2 ** 20    # 1B down, 8B o
PLANES_LARGE_MIN_NK = 48 * 2 ** 20     # 8B gate_up and down, the output heads
PLANES_HEAD_MIN_NK = 128 * 2 ** 20     # the output heads (vocabulary x hidden)
PLANES_WIDE_MIN_K = 4096
PLANES_WIDE_MAX_NK = 32 * 2 ** 20
PLANES_UNSPLIT_MIN_N = 16384           # 1B gate_up and wider (256+ tiles of 64 features)
#: A planes weight runs the decode variant's GEMV (it reads the planes layout, groups of >= 128)
#: up to this many rows; from 2 rows the planes kernel with 16 padded rows is faster (M=2 1B
#: gate_up 12.9 vs 20.3 us, 8B down 19.9 vs 34.6; M=4 13.3 vs 25.8, 20.4 vs 43.8) ...
PLANES_GEMV_MAX_M = 1
#: ... and at one row too on weights of at least this many elements N*K: the planes kernel pads
#: x to 16 rows, and with two warps and two chunks per step it beat the GEMV reading the planes
#: layout at one row (us: 1B gate_up 13.1 -> 11.9, 1B down 10.3 -> 9.4, 8B qkv 11.8 -> 9.8,
#: gate_up 38.0 -> 34.4, down 22.3 -> 17.2, 8B o 8.3 both; the 1B head 59.4). Below it (1B qkv
#: 5.6 both, 1B o 4.2 vs 4.7) the GEMV stays.
PLANES_MMA_MIN_NK = 16 * 2 ** 20
#: Weights from this many elements (8B gate_up and down, the output heads) prefetch the first lines
#: of each program's rows to L2 before the PDL wait (``config.PREFETCH_BYTES``). A graph of
#: rms_norm -> linear pairs (``prefetch_probe.py``, H100, us with / without, 1 and 8 rows): 8B
#: gate_up 29.5 / 31.5, down 18.5 / 19.2; smaller weights lost (8B qkv 10.7 / 10.3, o 9.5 / 8.6),
#: and with every weight prefetching the 1B int4 model lost 2-4% at batch 1-32. From this size
#: only: 8B int4-head decode at batch 1 369.7 -> 382.7 tokens/s, the 1B within 3%
#: (``results/h100/2026-11-28-31c2149``).
PLANES_PREFETCH_MIN_NK = PLANES_LARGE_MIN_NK
#: The planes kernel reads its codes and x through tensor descriptors (Hopper's TMA copies, sm_90+;
#: ``planes_tma``) from this many rows, on weights of ``PLANES_LARGE_MIN_NK``+ elements only.
PLANES_TMA_MIN_M = 9
#: Weights of at most ``PLANES_SMALL_MAX_NK`` elements run dequant+cuBLAS from this many rows
#: (unmeasured for 16-row tiles beyond 64 rows), as every weight from ``problem.DEQUANT_GEMM_MIN_M`` rows.
PLANES_DEQUANT_SMALL_MIN_M = 65


def planes_config(p: LinearProblem) -> tuple[int, int, int, int, int, int, bool, bool, bool]:
    """(BLOCK_M,) + the tile of the planes kernel for ``p``, by rows and the weight's size N*K
    (the module's docstring has the measurements behind each rule).

    Example:
        >>> import torch
        >>> def tiles(m, n, k):
        ...     return planes_config(LinearProblem(torch.bfloat16, m, n, k, 4, 128, False, False, "cuda", "planes"))
        >>> tiles(1, 28672, 4096) == tiles(8, 28672, 4096)
        True
        >>> tiles(1, 4096, 4096), tiles(1, 16384, 2048)
        ((16, 128, 4, 4, 2, 1, False, True, False), (16, 64, 4, 4, 2, 1, False, True, False))
        >>> tiles(4, 4096, 4096), tiles(4, 28672, 4096)
        ((16, 64, 4, 4, 2, 1, False, True, False), (16, 64, 2, 3, 4, 2, False, True, False))
        >>> tiles(16, 128256, 4096), tiles(16, 4096, 4096), tiles(16, 28672, 4096)
        ((16, 64, 2, 3, 4, 2, False, True, False), (16, 128, 4, 4, 4, 1, False, True, False), (16, 64, 4, 4, 1, 1, False, True, False))
        >>> tiles(24, 128256, 4096), tiles(24, 3072, 2048)
        ((32, 64, 4, 4, 1, 1, False, True, False), (32, 64, 4, 4, 4, 1, False, True, False))
        >>> tiles(64, 2048, 2048), tiles(64, 4096, 4096), tiles(64, 6144, 4096), tiles(100, 28672, 4096)
        ((16, 64, 2, 3, 4, 2, False, True, False), (32, 128, 4, 4, 4, 1, False, True, True), (64, 128, 8, 3, 2, 1, True, True, False), (64, 256, 8, 3, 1, 1, False, True, True))
        >>> tiles(100, 4096, 4096)
        (32, 128, 4, 4, 4, 1, False, False, False)
    """
    nk = p.n * p.k
    if p.m == 1 and p.k >= PLANES_WIDE_MIN_K and nk < PLANES_LARGE_MIN_NK:
        return (16,) + PLANES_TILE_ONE_ROW_WIDE
    if p.m <= 8:
        return (16,) + (PLANES_TILE_TWO_WARPS if nk >= PLANES_LARGE_MIN_NK else PLANES_TILE_FEW_ROWS)
    if p.m <= 16:
        if nk >= PLANES_HEAD_MIN_NK:
            return (16,) + PLANES_TILE_TWO_WARPS
        if p.k >= PLANES_WIDE_MIN_K and nk <= PLANES_WIDE_MAX_NK:
            return (16,) + PLANES_TILE_WIDE
        return (16,) + _four_warps(p)
    if p.m <= 32:
        return (32,) + _four_warps(p)
    if nk <= PLANES_SMALL_MAX_NK:
        return (16,) + PLANES_TILE_TWO_WARPS
    if nk <= PLANES_MIDDLE_MAX_NK:
        return (32,) + (PLANES_TILE_WIDE_FOLDED if p.m <= PLANES_MAX_BLOCK_M else PLANES_TILE_WIDE_PER_PLANE)
    if nk >= PLANES_LARGE_MIN_NK:
        return (PLANES_MAX_BLOCK_M,) + PLANES_TILE_LARGE
    return (PLANES_MAX_BLOCK_M,) + PLANES_TILE_EIGHT_WARPS


def planes_tma(p: LinearProblem) -> tuple[bool, bool]:
    """(codes, x) of the planes kernel through tensor descriptors on a GPU with TMA, by rows and
    weight, as measured (H100, CUDA graphs over L2-cold weights, time with descriptors / with
    pointers, ``planes_tma_probe.py``, ``results/h100/2026-11-28-fc5be0b/``):

    * the output heads (``PLANES_HEAD_MIN_NK``+) from ``PLANES_TMA_MIN_M`` rows: 16 rows 0.86-0.88,
      32 0.89-0.91, 64 0.80-0.83, 96 0.84-0.92, 128 0.84-0.93;
    * weights of ``PLANES_LARGE_MIN_NK``+ elements with ``PLANES_UNSPLIT_MIN_N``+ features (8B gate_up):
      9-32 rows (16 rows 0.85-0.88, 32 0.87-0.88; 64 rows lost, 1.11-1.13);
    * the other ``PLANES_LARGE_MIN_NK``+ weights (8B down, K split): 17-64 rows (32 rows 0.93,
      64 0.95-0.96; 16 rows lost, 1.05-1.06, and 96-128 rows 1.50).

    Below ``PLANES_TMA_MIN_M`` rows the codes' copies were slower on every large weight (8B gate_up
    at 2-8 rows 1.18-1.27), and on weights under ``PLANES_LARGE_MIN_NK`` elements at every row count
    (1B qkv / o 1.08-1.23, 1B gate_up 1.02-1.07, 8B qkv / o 1.04-1.17): pointers there. Both
    operands or neither: descriptors for x alone were not timed.

    Example:
        >>> import torch
        >>> def tma(m, n, k):
        ...     return planes_tma(LinearProblem(torch.bfloat16, m, n, k, 4, 128, False, False, "cuda", "planes"))
        >>> tma(16, 28672, 4096), tma(64, 28672, 4096), tma(16, 4096, 14336), tma(64, 4096, 14336)
        ((True, True), (False, False), (False, False), (True, True))
        >>> tma(8, 128256, 4096), tma(128, 128256, 2048), tma(32, 16384, 2048)
        ((False, False), (True, True), (False, False))
    """
    nk = p.n * p.k
    if p.m < PLANES_TMA_MIN_M or nk < PLANES_LARGE_MIN_NK:
        on = False
    elif nk >= PLANES_HEAD_MIN_NK:
        on = True
    elif p.n >= PLANES_UNSPLIT_MIN_N:
        on = p.m <= 32
    else:
        on = 17 <= p.m <= PLANES_MAX_BLOCK_M
    return on, on


def _four_warps(p: LinearProblem) -> tuple:
    return PLANES_TILE_FOUR_WARPS_UNSPLIT if p.n >= PLANES_UNSPLIT_MIN_N else PLANES_TILE_FOUR_WARPS


def planes_gemv(p: LinearProblem) -> bool:
    """Whether the GEMV kernel runs a planes-layout problem (``PLANES_GEMV_MAX_M`` rows, N*K under
    ``PLANES_MMA_MIN_NK``; groups of at least one 128-code chunk, so a GEMV tile covers whole groups
    in either layout)."""
    return (p.m <= PLANES_GEMV_MAX_M and p.n * p.k < PLANES_MMA_MIN_NK
            and (p.group >= 128 or p.group >= p.k))


def planes_dequant(p: LinearProblem) -> bool:
    """Whether dequant+cuBLAS runs a planes-layout problem: ``p.large``, or small weights from
    ``PLANES_DEQUANT_SMALL_MIN_M`` rows (``PLANES_SMALL_MAX_NK``)."""
    return p.large or (p.m >= PLANES_DEQUANT_SMALL_MIN_M and p.n * p.k <= PLANES_SMALL_MAX_NK)
