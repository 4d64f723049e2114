"""The ``planes`` Triton variant of ``linear``: int4 weights repacked into the planes layout
(``weight.repack``), on tensor cores, M = 2..255 (more than 64 rows run several M tiles).
The other kernels read the planes layout where they run better: the decode variant's GEMV at
one row with groups of >= 128 (``planes_gemv``), dequant+cuBLAS (its dequantize kernel) on small
weights from 65 rows and on every weight from 256 (``planes_dequant``).

What bounds the rows-layout dot kernel (``triton_kernels._qmm_kernel``, SWAP+JOIN; H100, CUDA
graphs over L2-cold weights, at fed7445): M=16 8B gate_up 69 us for 62 MB of packed weight
(0.9 TB/s of ~3), bf16 84 us; 4 vs 3 pipeline stages and 8 vs 4 warps changed nothing, so it is
not bytes in flight. Its sm_90 TTGIR, per 128-code step of a 64-feature tile: the codes are
unpacked in a blocked layout (``tl.join``) and stored to shared memory (16 KB), a barrier, then
``ldmatrix`` back into the MMA's operand layout; the sum of x over the group (for the zero) is a
reduction and another layout conversion through shared memory; scales and zeros are plain global
loads each step waits on (DRAM latency, L2-cold); ~5 issued instructions per code in all.

What this variant changes, each checked in the sm_90 TTGIR/PTX (``int4_candidate.py --ptx``):

* Layout: per 128-code chunk of a row, nibble ``i`` of word ``c`` is column ``16i + c``, so
  nibble ``i`` of a (64, 16) word tile is the (64, 16) block of columns ``16i .. 16i+15``: one
  K step of the MMA. The unpack is elementwise, so Triton loads the word tile from shared memory
  straight into the MMA's A-operand registers (no local_alloc in the K loop).
* Unpack: two codes per ``prmt`` + ``lop3`` (+ a shift for odd nibbles) and one packed ``sub``
  of the zero (``_plane_minus_zero``): ~2 instructions per code where the plain ops take ~3.5.
* Zero before the MMA, exactly: ``(2**7 + code) - (2**7 + zero)`` in x's 16-bit dtype is an
  integer of at most 5 bits (integer zeros in [0, 16)); no sum of x. The scale multiplies each
  group's float32 MMA sum: as in the other kernels no dequantized weight is rounded to 16 bits.
* Scale and zero in one int32 word per group and row (``weight.group_words``, same 4 bytes as
  the two 16-bit values), a 2-D tile that the software pipeline copies ahead with the codes.

Tiles (``planes_config``): the weight is the MMA's first operand (out^T = W x^T); BLOCK_M the
power of two >= M (16..64); ``PLANES_TILES`` by BLOCK_M (two warps, mma.sync, two chunks per
loop step at 16 rows); K split as the other dot kernels, partials added by the combine kernel
(or, ``fixup``, by the last split in the kernel).
"""
from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from ...runtime import alloc
from ...runtime.backends import triton_interpreting
from ...runtime.triton import pdl
from ...runtime.triton.launch import TritonLauncher, cdiv
from . import epilogue
from .config import MAX_SPLIT, PROGRAMS_PER_SM, _pow2_ge, _split, code_mode
from .kernel_parts import _codes_as_float, _combine, _counters, _store
from .problem import LinearCall, LinearProblem
from .weight import PLANE_CHUNK

#: BLOCK_M of the planes kernel is the power of two >= M within 16..``PLANES_MAX_BLOCK_M``.
PLANES_MAX_BLOCK_M = 64
#: (BLOCK_N, num_warps, num_stages, programs per SM that K splits aim at, chunks per loop step,
#: scale ahead) by BLOCK_M (``planes_config``). Chunks per step: 128-code chunks each loop step
#: reads (``CHUNKS``: half the barriers per code at 2, 128 contiguous bytes of each row). Scale
#: ahead: each group's scale loaded a chunk early (``SCALE_AHEAD``; the pipeline copies the
#: zero's word but leaves the scale's a plain load where the two layouts differ).
#: 16 rows (H100, CUDA graphs over L2-cold weights, bf16 x, g128, ``results/h100/2026-11-27-
#: 1797308/int4_forms.json``): two warps on 64 features, two chunks per step, 3 stages. Two warps
#: run mma.sync; four run wgmma, and Triton waits for each wgmma before the next here (sm_90 PTX:
#: the MMA sum is scaled per group, so no accumulator is carried over the loop). Against the
#: earlier one warpgroup x 64 features x 4 stages: 1B lm_head 81.5 -> 65.5 us, 1B gate_up 14.1 ->
#: 12.3, 8B down 24.4 -> 21.7, 8B gate_up 41.2 -> 38.2, 8B o 10.7 -> 9.5. Two warps with one chunk
#: per step or 4 warps with two: each alone 0-14% (one warpgroup with two chunks: 8B gate_up
#: 46.5 us, slower).
#: 32 rows: one warpgroup on 64 features, 4 stages (two warps: 1.0-1.4x slower; wider tiles
#: below). 64 rows: two warpgroups on 128 features (x re-read half as often per weight byte as on
#: 64), 3 stages, scale ahead (1B gate_up 21.5 -> 17.9 us, 8B qkv 20.0 -> 19.1), splits for 2
#: programs per SM.
PLANES_TILES = {16: (64, 2, 3, 4, 2, False), 32: (64, 4, 4, 4, 1, False), 64: (128, 8, 3, 2, 1, True)}
#: 9-16 rows where K >= 4096 on weights of at most ``PLANES_TILES_16_WIDE_MAX_NK`` elements (1B
#: down, 8B qkv and o): one warpgroup on 128 features, 4 stages (same run: 10.8 -> 9.3, 12.5 ->
#: 11.2, 9.5 -> 8.4 us; a second run 9.2, 11.2, 8.4): the few feature tiles there split K many
#: ways, and 128 features halve the x each split re-reads. At 8 rows the same tile lost (1B down
#: 9.6 -> 14.5 us, 8B o 8.4 -> 10.0, ``int4_forms2.json``), so up to 8 rows keep two warps.
PLANES_TILES_WIDE = (128, 4, 4, 4, 1, False)     # one warpgroup on 128 features, 4 stages
PLANES_TILES_16_WIDE_MIN_M = 9
PLANES_TILES_16_WIDE_MIN_K = 4096
PLANES_TILES_16_WIDE_MAX_NK = 32 * 2 ** 20
#: 17-32 rows on weights of at least ``PLANES_TILES_32_WIDE_MIN_NK`` elements: one warpgroup on
#: 128 features (``int4_forms2.json``: 1B lm_head 100.7 -> 77.1 us, 8B qkv 15.3 -> 13.1, 8B o
#: 11.0 -> 9.8, 1B down 11.3 -> 10.2, the rest within 3%; on 1B qkv and o, 6M and 4M elements,
#: 7.6 -> 8.4 and 7.3 -> 8.2: those keep 64 features).
PLANES_TILES_32_WIDE_MIN_NK = 16 * 2 ** 20
#: 17-32 rows on the large weights (``PLANES_TILES_64_LARGE_MIN_NK``) with K >= 8192 (8B down):
#: two 16-row tiles on 128 features (``int4_forms3.json``: 30.2 -> 27.2 us); with N >= 16384 and
#: K 4096..8191 (8B gate_up): the 64-row large tile, half its rows padding (46.0 us at 64 rows
#: against 49.3 for 32-row tiles on 128 features). The 1B head (K = 2048) keeps the wide 32-row tile.
PLANES_TILES_32_LONG_K = 8192
PLANES_TILES_32_AS_64_MIN_N = 16384
PLANES_TILES_32_AS_64_MIN_K = 4096
#: 33-64 rows by the weight's size N*K (H100, CUDA graphs over L2-cold weights, bf16 x, g128,
#: M=64, ``results/h100/2026-11-27-547b7e0``): from 48*2**20 (8B down and gate_up, 1B lm_head) 256
#: features, 8 warps, no split: 30.7 vs 39.0, 46.8 vs 61.7, 96.5 vs 123.3 us. Up to 16*2**20 (1B
#: down, 8B o) two M tiles of 32 rows, one warpgroup on 128 features (``int4_forms3.json``: 16.4
#: -> 14.8, 16.2 -> 14.1 us against 64 rows on 64 features). Between them (1B gate_up, 8B qkv)
#: ``PLANES_TILES[64]`` was best.
PLANES_TILES_64_SMALL_MAX_NK = 16 * 2 ** 20
PLANES_TILES_64_LARGE = (256, 8, 3, 1, 1, False)
PLANES_TILES_64_LARGE_MIN_NK = 48 * 2 ** 20
#: A planes weight runs the decode variant's GEMV (it reads the planes layout, groups of >= 128)
#: up to this many rows; from 2 rows the planes kernel with 16 padded rows is faster (same run,
#: ``planes mma`` against the GEMV: M=2 1B gate_up 12.9 vs 20.3 us, 8B down 19.9 vs 34.6; M=4
#: 13.3 vs 25.8, 20.4 vs 43.8) ...
PLANES_GEMV_MAX_M = 1
#: ... and at one row too on weights of at least this many elements N*K: the planes kernel pads
#: x to 16 rows, and with two warps and two chunks per step it beat the GEMV reading the planes
#: layout at one row (``int4_forms4.json``, us: 1B gate_up 13.1 -> 11.9, 1B down 10.3 -> 9.4,
#: 8B qkv 11.8 -> 9.8, gate_up 38.0 -> 34.4, down 22.3 -> 17.2, 8B o 8.3 both; the 1B head 59.4).
#: Below it (1B qkv 5.6 both, 1B o 4.2 vs 4.7) the GEMV stays.
PLANES_MMA_MIN_NK = 16 * 2 ** 20
#: Weights of at most this many elements (1B qkv and o) run 17-64 rows as several 16-row tiles
#: (``int4_forms3.json``, us: M=32 1B qkv 7.6 -> 6.7, 1B o 7.3 -> 5.7 against one 32-row tile;
#: M=64 9.5 and 7.4 against dequant+cuBLAS's 12.8 and 10.4, which the small weights ran from 33
#: rows before) ...
PLANES_DEQUANT_SMALL_NK = 8 * 2 ** 20
#: ... and from this many rows dequant+cuBLAS (unmeasured for 16-row tiles beyond 64 rows), as
#: every weight from ``problem.DEQUANT_GEMM_MIN_M`` rows.
PLANES_DEQUANT_SMALL_MIN_M = 65


@triton.jit
def _group_word(gw_ptr, rows, n_mask, N, g, PER_ROW: tl.constexpr):
    """Group ``g``'s (0 for one group per row) (BLOCK_N, 1) int32 words (``weight.group_words``:
    the float32 scale, whose low 13 bits are 0 for a 16-bit scale, OR the zero, int). A 2-D tile
    of 4-byte words: the software pipeline copies it ahead like the codes (sm_90 TTGIR; 1-D loads
    of 2-byte scales and zeros stay loads each step waits on)."""
    if PER_ROW:
        g = 0
    return tl.load(gw_ptr + g * N + rows[:, None], mask=n_mask[:, None], other=0)


@triton.jit
def _word_scale(word):
    """The float32 scale of a group word (its low 4 bits hold the zero)."""
    return (word & -16).to(tl.float32, bitcast=True)


@triton.jit
def _plane_minus_zero(words, zc, i: tl.constexpr, CODE_MODE: tl.constexpr, ASM: tl.constexpr):
    """(offset + code of nibble ``i``) - (offset + zero) of each word, in x's 16-bit dtype, exact.

    ASM (sm_90; not under the interpreter): two words per ``prmt``: byte i//2 of each into bytes
    0 and 2 of one register, a shift by 4 for odd i, one ``lop3`` to mask both nibbles and OR the
    exponent of the offset into both halves, one packed ``sub`` of the zero: 2 instructions per
    code (1.5 where ptxas drops the shift by 0), where the plain ops take about 3.5 (each code
    alone to a 16-bit half, then packed: sm_90 PTX)."""
    if ASM:
        # operands: $0 the two results; $1, $2 two words; $3 the two zeros; $4/$5 the prmt
        # selector, $6/$7 the shift (constants, one per packed element)
        sel = tl.full(words.shape, (i // 2) | ((i // 2) << 4) | ((4 + i // 2) << 8) | ((4 + i // 2) << 12),
                      tl.int32)
        shift = tl.full(words.shape, 4 * (i % 2), tl.int32)
        if CODE_MODE == 1:
            out = tl.inline_asm_elementwise(
                "{ .reg .b32 t; prmt.b32 t, $1, $2, $4; shr.u32 t, t, $6; "
                "lop3.b32 t, t, 0x000F000F, 0x43004300, 0xEA; sub.bf16x2 $0, t, $3; }",
                "=r,r,r,r,r,r,r,r", [words, zc, sel, shift], dtype=tl.bfloat16, is_pure=True, pack=2)
        else:
            out = tl.inline_asm_elementwise(
                "{ .reg .b32 t; prmt.b32 t, $1, $2, $4; shr.u32 t, t, $6; "
                "lop3.b32 t, t, 0x000F000F, 0x64006400, 0xEA; sub.f16x2 $0, t, $3; }",
                "=r,r,r,r,r,r,r,r", [words, zc, sel, shift], dtype=tl.float16, is_pure=True, pack=2)
    else:
        out = _codes_as_float((words >> (4 * i)) & 0xF, CODE_MODE) - zc
    return out


@triton.jit
def _planes_dot(x_rows, words, z, m_mask, q, first: tl.constexpr, count: tl.constexpr, F32_DOT: tl.constexpr,
                CODE_MODE: tl.constexpr, ASM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """sum over planes ``first .. first+count-1`` of chunk ``q`` of (code - zero) x^T: a float32
    (BLOCK_N, BLOCK_M) MMA sum. Nibble ``i`` of ``words`` is the A operand of columns 16i .. 16i+15;
    ``z`` the (BLOCK_N, 1) int32 zeros."""
    if F32_DOT:       # the interpreter (its bf16 dot is wrong): float32 codes minus the zero
        zc = z.to(tl.float32)
    else:             # (offset + zero) in x's dtype, exact (integer zeros < 16): OR-ed like a code
        zc = _codes_as_float(z, CODE_MODE)
    part = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for j in tl.static_range(count):
        xi = tl.load(x_rows + (q * 128 + 16 * (first + j)), mask=m_mask[:, None], other=0.0)
        if F32_DOT:
            a = _codes_as_float((words >> (4 * (first + j))) & 0xF, 0) - zc
            xi = xi.to(tl.float32)
        else:
            a = _plane_minus_zero(words, zc, first + j, CODE_MODE, ASM)
        part = tl.dot(a, tl.trans(xi), part)
    return part


@triton.jit
def _planes_kernel(x_ptr, w_ptr, gw_ptr, b_ptr, out_ptr, ws_ptr, cnt_ptr, M, N, stride_xm, stride_w,
                   chunks_per_split, n_chunks, m_tiles, n_splits,
                   GROUP: tl.constexpr, PER_ROW: tl.constexpr, HAS_BIAS: tl.constexpr,
                   PARTIAL: tl.constexpr, FIXUP: tl.constexpr, F32_DOT: tl.constexpr, CODE_MODE: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   ASM: tl.constexpr = False, PDL: tl.constexpr = False, CHUNKS: tl.constexpr = 1,
                   SCALE_AHEAD: tl.constexpr = False):
    """(BLOCK_N features, BLOCK_M rows) of out^T per program, over chunks of 128 codes: per chunk
    one (BLOCK_N, 16) word tile; nibble ``i`` of it, minus the zero, is the MMA's A operand for
    columns 16i .. 16i+15 against the matching (BLOCK_M, 16) slice of x. Each group's MMA sum
    (float32) is multiplied by its scales and added to the accumulator. Each loop step takes
    CHUNKS chunks (it divides the split's chunks); SCALE_AHEAD (one group per chunk) loads the
    next chunk's scales a step early."""
    pdl.wait_for_previous(PDL)
    PPG: tl.constexpr = 8 if (PER_ROW or GROUP >= 128) else GROUP // 16     # planes per group
    pid = tl.program_id(0)
    pid_m = pid % m_tiles
    pid_n = pid // m_tiles
    pid_k = tl.program_id(1)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = rows < N
    ms = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    m_mask = ms < M
    c16 = tl.arange(0, 16)
    w_rows = w_ptr + rows.to(tl.int64)[:, None] * stride_w + c16[None, :]
    x_rows = x_ptr + ms.to(tl.int64)[:, None] * stride_xm + c16[None, :]
    q_start = pid_k * chunks_per_split
    q_end = tl.minimum(n_chunks, q_start + chunks_per_split)
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    AHEAD: tl.constexpr = SCALE_AHEAD and PPG == 8
    if AHEAD:
        s_next = _word_scale(_group_word(gw_ptr, rows, n_mask, N, (q_start * 128) // GROUP, PER_ROW))
    for q0 in range(q_start, q_end, CHUNKS):                 # CHUNKS divides the split's chunks
        for c in tl.static_range(CHUNKS):
            q = q0 + c
            words = tl.load(w_rows + q * 16, mask=n_mask[:, None], other=0)
            for h in tl.static_range(8 // PPG):                  # the groups of this chunk
                # loaded in the loop, not a chunk ahead: a zero carried across iterations took a
                # layout of its own, and the codes then went through shared memory (sm_90 TTGIR)
                word = _group_word(gw_ptr, rows, n_mask, N, (q * 128 + h * PPG * 16) // GROUP, PER_ROW)
                z = word & 0xF
                if AHEAD:
                    s = s_next
                    q_next = tl.minimum(q + 1, q_end - 1)
                    s_next = _word_scale(_group_word(gw_ptr, rows, n_mask, N, (q_next * 128) // GROUP, PER_ROW))
                else:
                    s = _word_scale(word)
                part = _planes_dot(x_rows, words, z, m_mask, q, h * PPG, PPG, F32_DOT, CODE_MODE, ASM, BLOCK_M,
                                   BLOCK_N)
                acc += part * s
    acc = tl.trans(acc)
    _store(acc, ms, m_mask, rows, n_mask, pid_k, pid, M, N, b_ptr, out_ptr, ws_ptr, cnt_ptr, n_splits,
           HAS_BIAS, PARTIAL, FIXUP)


_planes = TritonLauncher(_planes_kernel)


def planes_config(p: LinearProblem) -> tuple[int, int, int, int, int, int, bool]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages, programs per SM, chunks per step, scale ahead) of
    the planes kernel: BLOCK_M the power of two >= M within 16..64 (more rows run several M tiles),
    the rest from ``PLANES_TILES``; weights of at most 8M elements run 16-row tiles at any M;
    9-16 rows ``PLANES_TILES_WIDE`` where K >= 4096 on weights of at most 32M elements; 17-32
    rows ``PLANES_TILES_WIDE`` from 16M elements (from 48M: two wide 16-row tiles where K >=
    8192, the 64-row large tile where N >= 16384 and K >= 4096); 33-64 rows by the weight's size,
    two 32-row ``PLANES_TILES_WIDE`` tiles up to 16M elements, ``PLANES_TILES_64_LARGE`` from 48M.

    Example:
        >>> def tiles(m, n, k):
        ...     return planes_config(LinearProblem(torch.bfloat16, m, n, k, 4, 128, False, False, "cuda", "planes"))
        >>> tiles(16, 28672, 4096), tiles(8, 4096, 4096), tiles(64, 2048, 2048)      # two warps, two chunks
        ((16, 64, 2, 3, 4, 2, False), (16, 64, 2, 3, 4, 2, False), (16, 64, 2, 3, 4, 2, False))
        >>> tiles(16, 4096, 4096), tiles(32, 4096, 14336)                          # one warpgroup, 128 features
        ((16, 128, 4, 4, 4, 1, False), (16, 128, 4, 4, 4, 1, False))
        >>> tiles(24, 4096, 4096), tiles(64, 4096, 4096)
        ((32, 128, 4, 4, 4, 1, False), (32, 128, 4, 4, 4, 1, False))
        >>> tiles(40, 6144, 4096), tiles(32, 28672, 4096), tiles(64, 28672, 4096)
        ((64, 128, 8, 3, 2, 1, True), (64, 256, 8, 3, 1, 1, False), (64, 256, 8, 3, 1, 1, False))
    """
    block_m = min(PLANES_MAX_BLOCK_M, max(16, _pow2_ge(p.m)))
    if p.n * p.k <= PLANES_DEQUANT_SMALL_NK:
        return (16,) + PLANES_TILES[16]
    if (block_m == 16 and p.m >= PLANES_TILES_16_WIDE_MIN_M and p.k >= PLANES_TILES_16_WIDE_MIN_K
            and p.n * p.k <= PLANES_TILES_16_WIDE_MAX_NK):
        return (block_m,) + PLANES_TILES_WIDE
    if block_m == 32 and p.n * p.k >= PLANES_TILES_64_LARGE_MIN_NK:
        if p.k >= PLANES_TILES_32_LONG_K:
            return (16,) + PLANES_TILES_WIDE
        if p.n >= PLANES_TILES_32_AS_64_MIN_N and p.k >= PLANES_TILES_32_AS_64_MIN_K:
            return (64,) + PLANES_TILES_64_LARGE
    if block_m == 32 and p.n * p.k >= PLANES_TILES_32_WIDE_MIN_NK:
        return (block_m,) + PLANES_TILES_WIDE
    if block_m == 64 and p.n * p.k <= PLANES_TILES_64_SMALL_MAX_NK:
        return (32,) + PLANES_TILES_WIDE
    if block_m == 64 and p.n * p.k >= PLANES_TILES_64_LARGE_MIN_NK:
        return (block_m,) + PLANES_TILES_64_LARGE
    return (block_m,) + PLANES_TILES[block_m]


def planes_gemv(p: LinearProblem) -> bool:
    """Whether the GEMV kernel runs a planes-layout problem (``PLANES_GEMV_MAX_M`` rows, N*K under
    ``PLANES_MMA_MIN_NK``; groups of at least one 128-code chunk, so a GEMV tile covers whole groups
    in either layout)."""
    return (p.m <= PLANES_GEMV_MAX_M and p.n * p.k < PLANES_MMA_MIN_NK
            and (p.group >= 128 or p.group >= p.k))


def planes_dequant(p: LinearProblem) -> bool:
    """Whether dequant+cuBLAS runs a planes-layout problem: ``p.large``, or small weights from
    ``PLANES_DEQUANT_SMALL_MIN_M`` rows (``PLANES_DEQUANT_SMALL_NK``)."""
    return p.large or (p.m >= PLANES_DEQUANT_SMALL_MIN_M and p.n * p.k <= PLANES_DEQUANT_SMALL_NK)


def launch_planes(call: LinearCall, config: Optional[tuple] = None, programs_per_sm: Optional[int] = None,
                  fixup: bool = False, asm: Optional[bool] = None) -> torch.Tensor:
    """Run ``call`` (a planes-layout weight) with ``planes_config`` or an explicit
    (BLOCK_M, BLOCK_N, warps, stages[, programs per SM[, chunks per step[, scale ahead]]]);
    K splits aim at ``programs_per_sm`` (default: the config's); ``fixup`` adds the split partials
    in the kernel (the last split of a tile) instead of the combine kernel; ``asm`` unpacks two
    codes per ``prmt``/``lop3`` (``_plane_minus_zero``; default: on, except under the interpreter,
    which has no inline PTX). Two chunks per step need an even number of chunks (K / 128); with an
    odd number the kernel steps one chunk at a time."""
    p, w, x = call.problem, call.w, call.x
    config = tuple(config or planes_config(p))
    block_m, block_n, warps, stages = config[:4]
    pps = programs_per_sm or (config[4] if len(config) > 4 else PROGRAMS_PER_SM)
    chunks = config[5] if len(config) > 5 else 1
    scale_ahead = bool(config[6]) if len(config) > 6 else False
    per_row = w.group_size == -1 or w.group >= p.k
    m_tiles, n_tiles = cdiv(p.m, block_m), cdiv(p.n, block_n)
    tiles = m_tiles * n_tiles
    byte_cap = max(1, w.nbytes // (2 * 8 * p.m * p.n))
    chunks = chunks if (p.k // PLANE_CHUNK) % chunks == 0 else 1
    split, k_per_split = _split(tiles, p.k, chunks * PLANE_CHUNK, x.device, pps, min(MAX_SPLIT, byte_cap))
    out = alloc.empty((p.m, p.n), x.dtype, x.device)
    has_bias = call.bias is not None
    bias = call.bias if has_bias else w.scales_t
    ws = out if split == 1 else torch.empty((split, p.m, p.n), dtype=torch.float32, device=x.device)
    fixup = fixup and split > 1
    counters = _counters(x.device, tiles) if fixup else ws
    dependent = pdl.on(x.device)
    mode, _ = code_mode(4, x.dtype)
    interpreting = triton_interpreting()
    asm = not interpreting if asm is None else asm and not interpreting
    _planes((tiles, split), (x, w.packed, w.group_words, bias, out, ws, counters, p.m, p.n, x.stride(0),
                             w.packed.stride(0), k_per_split // PLANE_CHUNK, p.k // PLANE_CHUNK, m_tiles, split,
                             w.group, per_row, has_bias, split > 1, fixup, interpreting, mode, block_m, block_n,
                             asm, dependent, chunks, scale_ahead),
            num_warps=warps, num_stages=stages)
    if split > 1 and not fixup:
        mn = p.m * p.n
        _combine((cdiv(mn, 1024),), (ws, bias, out, mn, p.n, split, has_bias, 1024, dependent), num_warps=4)
    return epilogue.finish(out, call)   # only the dense one-row GEMV fuses SwiGLU


def supports_planes(p: LinearProblem) -> Optional[str]:
    """None for a planes-layout weight (``weight.repack``) with float16/bfloat16 x, except where
    the GEMV kernel reads it (``planes_gemv``) or dequant+cuBLAS does (``planes_dequant``), else
    why not.

    Example:
        >>> supports_planes(LinearProblem(torch.bfloat16, 16, 64, 256, 4, 128, False, False, "cuda"))
        'the weight is in the rows layout (weight.repack(w, "planes") makes the planes layout)'
    """
    if not p.planes:
        return f'the weight is in the {p.layout or "rows"} layout (weight.repack(w, "planes") makes the planes layout)'
    if p.dtype not in (torch.float16, torch.bfloat16):
        return (f"x is {str(p.dtype).replace('torch.', '')}; the planes kernel takes float16 or bfloat16 "
                "(float32 and float64 run on the torch path)")
    if planes_gemv(p):
        return (f"M={p.m} <= {PLANES_GEMV_MAX_M}, N*K={p.n * p.k} < {PLANES_MMA_MIN_NK}, groups of >= 128: "
                "the decode variant's GEMV reads the planes layout")
    if planes_dequant(p):
        return f"M={p.m} rows on N*K={p.n * p.k}: dequant+cuBLAS (its dequantize kernel reads the planes layout)"
    return None
