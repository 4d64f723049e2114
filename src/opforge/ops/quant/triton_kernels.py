"""Triton kernels for ``linear`` with a quantized weight (int4 or int8, any group, symmetric or not).

Two kernels behind two variants, chosen by the number of rows M of x:

* ``decode`` (M <= 16). M <= 4 (int8: 2): ``_gemv_kernel``, FMAs, no tensor cores. A program
  owns BLOCK_N output features and a range of K; it streams that part of the packed weight once
  as int32 words (int4: 8 codes, int8: 4) with 16-byte loads, in a (BLOCK_N, words) tile that
  never leaves the layout it was loaded in: code ``i`` of every word is masked in place (no
  shift: the word's high half is shifted down once) and OR-ed with the exponent of a power of two,
  one ``lop3``, which makes it that power plus the code; one FADD removes the power. It meets
  x[PACK*j + i] (a strided read of x, from L1) by FMAs into per-word sums; scale and zero are
  applied per word column; the only cross-thread reduction is the one at the end. More rows:
  ``_qmm_kernel`` with 16 padded rows: every row shares each weight load. Up to 64 rows its SWAP
  form puts the weight on the MMA's wide side (out^T = W x^T, 64
  features x 128 codes) and int4 codes leave their words through ``tl.join`` (JOIN); int4 at
  M 33..64 on weights of N*K >= 48*2**20 runs the JOIN form not swapped, on (64, 128, 128)
  tiles (``config.UNSWAPPED_JOIN_MIN_NK``).
* ``prefill`` (M > 16): ``_qmm_kernel`` on (BLOCK_M, BLOCK_N) tiles; per K tile (inside one
  group) the codes, as 16-bit floats, go to ``tl.dot`` (tensor cores) against x. Tiles by M, N,
  K and the group. Programs that share an N tile are adjacent in the grid, so a weight tile is
  read from DRAM about once.

* ``planes`` (int4 weights repacked by ``weight.repack``, as the model loader does on CUDA;
  M 2..255, and one row on weights of 16M+ elements or with groups under 128):
  ``planes._planes_kernel``, see there. The GEMV and dequantize kernels read the planes layout
  too (``PLANES``), so a repacked weight keeps the decode variant at one row on smaller weights
  and dequant+cuBLAS from 256 rows (small weights from 65).

* ``dequant_gemm`` (M >= ``problem.DEQUANT_GEMM_MIN_M``; also int4 at M 17..64 with
  N*K <= ``problem.DEQUANT_SMALL_NK``, and int4 from M 65 except wide, short weights up to 128
  rows: ``problem.INT4_DEQUANT_MIN_M``): ``_dequant_kernel`` writes the weight in x's dtype (one
  pass over N*K), then cuBLAS (``F.linear``). The one variant that rounds the dequantized weight
  to 16 bits; at these M the GEMM dwarfs the extra pass, and on small int4 weights the dot
  kernel's fixed cost does (H100, M=64 2048x2048: 21.5 -> 10.0 us; M=128 4096x4096 79.8 -> 33.3).

The GEMV and dot kernels split K when the tiles alone give fewer than ``PROGRAMS_PER_SM`` programs per SM: each
split writes float32 partials to a workspace (split, M, N); a tiny second kernel or, with
``fixup`` (the int4 GEMV kernel), the last split of each tile adds
them in split order, adds the bias and casts (deterministic either way, and bitwise the same; no
atomics on the data).

Launch choices (``opforge.ops.quant.config``) are the third H100 sweep's: the in-kernel split
reduction for the int4 GEMV kernel, int4 tiles (16, 128, 128) for M 5..16 and (64, 64, 128) for M 33..64, and dequant+cuBLAS from M = 256.
Each won in a sweep of single launch configs and, measured end to end at 629522a
(against the earlier choices, since removed; benchmarks/NOTES.md), was as fast or faster on the GPU-bound shapes; the
int8 GEMV kernel's in-kernel reduction measured slower there (0.53-0.99x) and stays off. Later
sweeps (CUDA graphs, L2-cold weights) added wide-K GEMV tiles for one row (at b634a74), the
swapped dot tiles up to 64 rows (at f515a1a, ``config.SWAP_MAX_M``; they replace the M 5..64 tiles above)
and, for int4 at M 17..64 (at fed7445), dequant+cuBLAS on small weights and the non-swapped
JOIN tiles at M 33..64 on large ones (``problem.DEQUANT_SMALL_NK``, ``config.UNSWAPPED_JOIN_MIN_NK``).

Exactness: per group both accumulate ``scale * (sum_k x*code - zero * sum_k x)``. Codes are
exact in float32 and in 16-bit floats (the dot path keeps an offset on them, 128 or 1024, folded
into the zero), products are exact and sums float32: the result is the QuantizedWeight's up to
float32 accumulation; no dequantized weight is rounded to 16 bits. Under the interpreter (whose
bf16 ``tl.dot`` is wrong) the dot operands are cast to float32. ``benchmarks/tools/quant_ptx.py``
reports registers, spills and shared memory per config for sm_90 without a GPU.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from ...runtime import alloc
from ...runtime.triton import pdl
from ...runtime.backends import triton_interpreting
from ...runtime.triton.launch import TritonLauncher, cdiv
from . import epilogue
from . import problem as qproblem
from .config import GEMV_MAX_M, MAX_SPLIT, PROGRAMS_PER_SM, _pow2_le, _programs_per_sm, _split, _swapped, \
    _unswapped_join, code_mode, split_fixup, tile_config
from .kernel_parts import _codes_as_float, _combine, _counters, _store, launch_combine  # noqa: F401 (_combine: tests)
from .planes import launch_planes, supports_planes
from .planes_tiles import PLANES_DEQUANT_SMALL_MIN_M, PLANES_GEMV_MAX_M, PLANES_MMA_MIN_NK, planes_dequant, planes_gemv
from .problem import LinearCall, LinearProblem

KERNEL_DTYPES = (torch.float16, torch.bfloat16)


@triton.jit
def _load_codes(w_ptr, rows, n_mask, k0, K, k_words, stride_w, BITS: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_K: tl.constexpr, JOIN: tl.constexpr = False):
    """The (BLOCK_N, BLOCK_K) int32 codes of rows ``rows`` at columns ``k0 ..`` (0 where masked).
    ``k_words`` = K / 8 as an argument of its own: ``K // 8`` is only known to be even, which
    made the masked word loads 8 bytes wide.

    int4 JOIN: the 8 codes of a word join in three levels of ``tl.join`` (each adds a minor
    dimension of 2 held by the same thread), paired so that the joined index (c, b, a) is code
    4c + 2b + a; the reshape then merges dimensions one thread already holds in order, instead
    of spreading a broadcast dimension of 8 over the tile."""
    if BITS == 4:
        words = k0 // 8 + tl.arange(0, BLOCK_K // 8)
        w_off = rows.to(tl.int64)[:, None] * stride_w + words[None, :]
        packed = tl.load(w_ptr + w_off, mask=n_mask[:, None] & (words < k_words)[None, :], other=0)
        if JOIN:
            q0 = tl.join(tl.join((packed & 0xF), (packed >> 16) & 0xF),
                         tl.join((packed >> 8) & 0xF, (packed >> 24) & 0xF))
            q1 = tl.join(tl.join((packed >> 4) & 0xF, (packed >> 20) & 0xF),
                         tl.join((packed >> 12) & 0xF, (packed >> 28) & 0xF))
            codes = tl.reshape(tl.join(q0, q1), (BLOCK_N, BLOCK_K))
        else:
            shifts = tl.arange(0, 8) * 4
            codes = tl.reshape((packed[:, :, None] >> shifts[None, None, :]) & 0xF, (BLOCK_N, BLOCK_K))
    else:
        ks = k0 + tl.arange(0, BLOCK_K)
        w_off = rows.to(tl.int64)[:, None] * stride_w + ks[None, :]
        codes = tl.load(w_ptr + w_off, mask=n_mask[:, None] & (ks < K)[None, :], other=0).to(tl.int32)
    return codes


@triton.jit
def _scales_and_zeros(s_ptr, z_ptr, g, N, rows, n_mask, zero_const: tl.constexpr, SYMMETRIC: tl.constexpr,
                      BLOCK_N: tl.constexpr):
    """Group ``g``'s float32 scales and zeros of ``rows`` (scales_t and zeros_t are (groups, N))."""
    s = tl.load(s_ptr + g * N + rows, mask=n_mask, other=0.0).to(tl.float32)
    if SYMMETRIC:
        z = tl.full((BLOCK_N,), zero_const, tl.float32)
    else:
        z = tl.load(z_ptr + g * N + rows, mask=n_mask, other=0.0).to(tl.float32)
    return s, z


@triton.jit
def _add_group(acc, p, xs, s, zc, SWAP: tl.constexpr):
    """acc + (p - zc xs) s: ``p`` the MMA sum of (code + offset) . x over one group, ``xs`` the sum of x
    over it per row of x, ``zc`` (zero + offset) and ``s`` the scale per feature."""
    if SWAP:
        out = acc + (p - zc[:, None] * xs[None, :]) * s[:, None]
    else:
        out = acc + (p - xs[:, None] * zc[None, :]) * s[None, :]
    return out


@triton.jit
def _qmm_kernel(x_ptr, w_ptr, s_ptr, z_ptr, b_ptr, out_ptr, ws_ptr, cnt_ptr, M, N, K, k_words, stride_xm, stride_w,
                k_per_split, m_tiles, n_splits,
                BITS: tl.constexpr, GROUP: tl.constexpr, PER_ROW: tl.constexpr, SYMMETRIC: tl.constexpr,
                HAS_BIAS: tl.constexpr, PARTIAL: tl.constexpr, FIXUP: tl.constexpr, F32_DOT: tl.constexpr,
                CODE_MODE: tl.constexpr,
                CODE_OFFSET: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                JOIN: tl.constexpr = False, SWAP: tl.constexpr = False, PDL: tl.constexpr = False):
    """(BLOCK_M, BLOCK_N) output tiles; per K tile (inside one group) the codes go to tl.dot.

    JOIN (int4): the codes leave their words through ``tl.join`` (see ``_load_codes``).
    SWAP: the weight is the dot's first operand (out^T = W x^T; the accumulator is (BLOCK_N,
    BLOCK_M), transposed once at the end): the wide side of the MMA is N, not the few rows of x."""
    pdl.wait_for_previous(PDL)
    pid = tl.program_id(0)
    pid_m = pid % m_tiles
    pid_n = pid // m_tiles
    pid_k = tl.program_id(1)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = rows < N
    ms = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    m_mask = ms < M
    k_start = pid_k * k_per_split
    k_end = tl.minimum(K, k_start + k_per_split)
    zero_const: tl.constexpr = 2 ** (BITS - 1)
    if SWAP:
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    x_sum = tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.float32)   # PER_ROW: x summed over K, per column
    # over K tile indices, not K offsets: k0 = kt * BLOCK_K is then known to be a multiple of
    # BLOCK_K, so the int4 word index k0 // 8 is aligned for 16-byte copies (a loop over offsets
    # from pid_k * k_per_split gave 8-byte cp.async per sm_90 SASS)
    for kt in range(pid_k * (k_per_split // BLOCK_K), (k_end + BLOCK_K - 1) // BLOCK_K):
        k0 = kt * BLOCK_K
        ks = k0 + tl.arange(0, BLOCK_K)
        codes = _load_codes(w_ptr, rows, n_mask, k0, K, k_words, stride_w, BITS, BLOCK_N, BLOCK_K, JOIN)
        x = tl.load(x_ptr + ms.to(tl.int64)[:, None] * stride_xm + ks[None, :],
                    mask=m_mask[:, None] & (ks < K)[None, :], other=0.0)
        c = _codes_as_float(codes, CODE_MODE)                         # code + CODE_OFFSET
        if F32_DOT:
            x = x.to(tl.float32)
            c = c.to(tl.float32)
        if PER_ROW:
            # one scale and zero per row: the MMAs accumulate (code + offset) . x over the whole
            # K range (one chain the pipeline keeps in flight), the zero and scale apply once below
            if SWAP:
                acc = tl.dot(c, tl.trans(x), acc)
            else:
                acc = tl.dot(x, tl.trans(c), acc)
            x_sum += x.to(tl.float32)
        else:
            if SWAP:
                p = tl.dot(c, tl.trans(x))
            else:
                p = tl.dot(x, tl.trans(c))
            xs = tl.sum(x.to(tl.float32), axis=1)                        # (BLOCK_M,)
            s, z = _scales_and_zeros(s_ptr, z_ptr, k0 // GROUP, N, rows, n_mask, zero_const, SYMMETRIC, BLOCK_N)
            # the whole K tile is one group (BLOCK_K divides it)
            acc = _add_group(acc, p, xs, s, z + CODE_OFFSET, SWAP)
    if PER_ROW:
        s, z = _scales_and_zeros(s_ptr, z_ptr, 0, N, rows, n_mask, zero_const, SYMMETRIC, BLOCK_N)
        acc = _add_group(tl.zeros_like(acc), acc, tl.sum(x_sum, axis=1), s, z + CODE_OFFSET, SWAP)
    if SWAP:
        acc = tl.trans(acc)
    _store(acc, ms, m_mask, rows, n_mask, pid_k, pid, M, N, b_ptr, out_ptr, ws_ptr, cnt_ptr, n_splits,
           HAS_BIAS, PARTIAL, FIXUP)


@triton.jit
def _unpack(src, i: tl.constexpr, BITS: tl.constexpr, LOP3: tl.constexpr):
    """Code ``i`` of each word as float32, from ``src`` (the word for the low half of its codes,
    the word shifted right by 16 for the high half): masked in place at bit ``BITS * p`` and
    OR-ed with the exponent of 2**(23 - BITS*p), it is the float 2**(23 - BITS*p) + code.
    LOP3: the mask and the OR as one ``lop3.b32`` (ptxas emits two LOP3s for ``(a & imm) | imm``;
    not under the interpreter, which has no inline PTX)."""
    P: tl.constexpr = i % (16 // BITS)
    MASK: tl.constexpr = (2 ** BITS - 1) << (BITS * P)
    EXP: tl.constexpr = (150 - BITS * P) << 23
    BASE: tl.constexpr = 2.0 ** (23 - BITS * P)
    if LOP3:
        bits = tl.inline_asm_elementwise("lop3.b32 $0, $1, $2, $3, 0xEA;", "=r,r,r,r",
                                         [src, tl.full(src.shape, MASK, tl.int32), tl.full(src.shape, EXP, tl.int32)],
                                         dtype=tl.int32, is_pure=True, pack=1)
    else:
        bits = (src & MASK) | EXP
    return bits.to(tl.float32, bitcast=True) - BASE


@triton.jit
def _code_columns(wj, i: tl.constexpr, PACK: tl.constexpr, PLANES: tl.constexpr):
    """The columns of code ``i`` of words ``wj``: ``PACK * wj + i`` in the rows layout; in the
    planes layout (int4, ``weight.pack_planes``) column ``128 * (wj // 16) + 16 * i + wj % 16``.
    Word tiles and K splits of the GEMV are whole 128-code chunks (BLOCK_K a multiple of 128), so
    a tile covers the same columns, and (groups of >= 128) the same groups, in either layout."""
    if PLANES:
        cols = (wj // 16) * 128 + (wj % 16) + 16 * i
    else:
        cols = wj * PACK + i
    return cols


@triton.jit
def _gemv_row(x_ptr, words_ptr, s_ptr, z_ptr, row_off, rows, n_mask, N, k_words, w_start, w_end,
              BITS: tl.constexpr, GROUP: tl.constexpr, PER_ROW: tl.constexpr, SYMMETRIC: tl.constexpr,
              LOP3: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PLANES: tl.constexpr = False):
    """One row of x: (BLOCK_N,) float32 dot products over words w_start .. w_end (2-D tiles only:
    x is a strided (WORDS,) load per code position, broadcast over the tile's rows). PLANES: the
    planes layout (``_code_columns``)."""
    PACK: tl.constexpr = 32 // BITS
    HALF: tl.constexpr = PACK // 2
    WORDS: tl.constexpr = BLOCK_K // PACK
    zero_const: tl.constexpr = 2 ** (BITS - 1)
    SCALE_PER_WORD: tl.constexpr = (not PER_ROW) and GROUP < BLOCK_K
    j = tl.arange(0, WORDS)
    acc = tl.zeros((BLOCK_N, WORDS), dtype=tl.float32)
    for w0 in range(w_start, w_end, WORDS):
        wj = w0 + j
        j_mask = wj < k_words
        packed = tl.load(words_ptr + row_off + wj[None, :], mask=n_mask[:, None] & j_mask[None, :], other=0)
        hi = packed >> 16
        t = tl.zeros((BLOCK_N, WORDS), dtype=tl.float32)
        if PLANES:
            # The step's x in one load (its 128-code chunks are contiguous), for the per-word sums:
            # it brings every sector of the step's x into L1 at once, as the first code's load does in
            # the rows layout (code i of a rows word shares its sectors with codes 0..7; in the planes
            # layout each code's x sits in sectors of its own).
            ks = w0 * PACK + tl.arange(0, BLOCK_K)
            seg = tl.load(x_ptr + ks, mask=ks < k_words * PACK, other=0.0)
        else:
            xs = tl.zeros((WORDS,), dtype=tl.float32)
        for i in tl.static_range(PACK):
            xi = tl.load(x_ptr + _code_columns(wj, i, PACK, PLANES), mask=j_mask, other=0.0).to(tl.float32)
            if not PLANES:
                xs += xi
            if i < HALF:
                ci = _unpack(packed, i, BITS, LOP3)
            else:
                ci = _unpack(hi, i, BITS, LOP3)
            t += ci * xi[None, :]
        if PLANES:   # reduced after the codes' loads, which the segment's load (in flight) serves
            xs = tl.reshape(tl.sum(tl.reshape(seg.to(tl.float32), (WORDS // 16, 8, 16)), axis=1), (WORDS,))
        if SCALE_PER_WORD:   # several groups in the tile: each word's own group
            sg_off = ((wj * PACK) // GROUP)[None, :] * N + rows[:, None]
            sg_mask = n_mask[:, None] & j_mask[None, :]
            s = tl.load(s_ptr + sg_off, mask=sg_mask, other=0.0).to(tl.float32)
            if SYMMETRIC:
                acc += s * (t - zero_const * xs[None, :])
            else:
                z = tl.load(z_ptr + sg_off, mask=sg_mask, other=0.0).to(tl.float32)
                acc += s * (t - z * xs[None, :])
        else:
            g = 0 if PER_ROW else (w0 * PACK) // GROUP
            s = tl.load(s_ptr + g * N + rows, mask=n_mask, other=0.0).to(tl.float32)
            if SYMMETRIC:
                acc += s[:, None] * (t - zero_const * xs[None, :])
            else:
                z = tl.load(z_ptr + g * N + rows, mask=n_mask, other=0.0).to(tl.float32)
                acc += s[:, None] * (t - z[:, None] * xs[None, :])
    return tl.sum(acc, axis=1)


@triton.jit
def _gemv_rows(x_ptr, words_ptr, s_ptr, z_ptr, row_off, rows, n_mask, ms, m_mask, N, k_words, stride_xm, w_start,
               w_end, BITS: tl.constexpr, GROUP: tl.constexpr, PER_ROW: tl.constexpr, SYMMETRIC: tl.constexpr,
               LOP3: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
               PLANES: tl.constexpr = False):
    """BLOCK_M rows of x: (BLOCK_M, BLOCK_N) float32 results, on (BLOCK_M, BLOCK_N, WORDS) tiles."""
    PACK: tl.constexpr = 32 // BITS
    HALF: tl.constexpr = PACK // 2
    WORDS: tl.constexpr = BLOCK_K // PACK
    zero_const: tl.constexpr = 2 ** (BITS - 1)
    SCALE_PER_WORD: tl.constexpr = (not PER_ROW) and GROUP < BLOCK_K
    j = tl.arange(0, WORDS)
    x_rows = x_ptr + ms.to(tl.int64)[:, None, None] * stride_xm          # (BLOCK_M, 1, 1)
    acc = tl.zeros((BLOCK_M, BLOCK_N, WORDS), dtype=tl.float32)
    for w0 in range(w_start, w_end, WORDS):
        wj = w0 + j
        j_mask = wj < k_words
        packed = tl.load(words_ptr + row_off[None, :, :] + wj[None, None, :],
                         mask=n_mask[None, :, None] & j_mask[None, None, :], other=0)   # (1, BLOCK_N, WORDS)
        hi = packed >> 16
        x_off = wj[None, None, :]
        x_mask = m_mask[:, None, None] & j_mask[None, None, :]
        t = tl.zeros((BLOCK_M, BLOCK_N, WORDS), dtype=tl.float32)
        xs = tl.zeros((BLOCK_M, 1, WORDS), dtype=tl.float32)
        for i in tl.static_range(PACK):
            xi = tl.load(x_rows + _code_columns(x_off, i, PACK, PLANES), mask=x_mask,
                         other=0.0).to(tl.float32)   # (BLOCK_M, 1, WORDS)
            xs += xi
            if i < HALF:
                ci = _unpack(packed, i, BITS, LOP3)
            else:
                ci = _unpack(hi, i, BITS, LOP3)
            t += ci * xi
        if SCALE_PER_WORD:   # several groups in the tile: each word's own group
            sg_off = ((wj * PACK) // GROUP)[None, :] * N + rows[:, None]
            sg_mask = n_mask[:, None] & j_mask[None, :]
            s = tl.load(s_ptr + sg_off, mask=sg_mask, other=0.0).to(tl.float32)[None, :, :]
            if SYMMETRIC:
                acc += s * (t - zero_const * xs)
            else:
                z = tl.load(z_ptr + sg_off, mask=sg_mask, other=0.0).to(tl.float32)[None, :, :]
                acc += s * (t - z * xs)
        else:
            g = 0 if PER_ROW else (w0 * PACK) // GROUP
            s = tl.load(s_ptr + g * N + rows, mask=n_mask, other=0.0).to(tl.float32)[None, :, None]
            if SYMMETRIC:
                acc += s * (t - zero_const * xs)
            else:
                z = tl.load(z_ptr + g * N + rows, mask=n_mask, other=0.0).to(tl.float32)[None, :, None]
                acc += s * (t - z * xs)
    return tl.sum(acc, axis=2)


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, s_ptr, z_ptr, b_ptr, out_ptr, ws_ptr, cnt_ptr, M, N, K, k_words, stride_xm, stride_w,
                 words_per_split, n_splits, BITS: tl.constexpr, GROUP: tl.constexpr, PER_ROW: tl.constexpr,
                 SYMMETRIC: tl.constexpr, HAS_BIAS: tl.constexpr, PARTIAL: tl.constexpr, FIXUP: tl.constexpr,
                 LOP3: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 PDL: tl.constexpr = False, PLANES: tl.constexpr = False):
    """BLOCK_M (1..16) rows of x by FMAs, no tensor cores (PLANES: int4 in the planes layout,
    ``_code_columns``). The weight is read as int32 words (int4: 8 codes, int8: 4) in a
    (BLOCK_N, BLOCK_K / PACK) tile that stays in the layout it was loaded in (16-byte loads:
    the loop runs over word indices, so their alignment is known).
    Codes are never shifted down: code ``i`` sits at bit ``BITS * p`` (p = i mod PACK/2) of the
    word or of the word shifted right by 16 (one shift per word); masked in place and OR-ed with
    the exponent of 2**(23 - BITS*p), it is the float 2**(23 - BITS*p) + code exactly, so one
    LOP3 and one FADD per code. Products meet per-word float32 sums; scale and zero apply per word
    column once per step; one reduction at the end."""
    pdl.wait_for_previous(PDL)
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = rows < N
    ms = tl.arange(0, BLOCK_M)
    m_mask = ms < M
    words_ptr = w_ptr.to(tl.pointer_type(tl.int32))   # int8 rows are read as words too (K % 4 == 0)
    row_off = rows.to(tl.int64)[:, None] * stride_w
    w_start = pid_k * words_per_split
    w_end = tl.minimum(k_words, w_start + words_per_split)
    if BLOCK_M == 1:
        res = _gemv_row(x_ptr, words_ptr, s_ptr, z_ptr, row_off, rows, n_mask, N, k_words, w_start, w_end, BITS,
                        GROUP, PER_ROW, SYMMETRIC, LOP3, BLOCK_N, BLOCK_K, PLANES)[None, :]
    else:
        res = _gemv_rows(x_ptr, words_ptr, s_ptr, z_ptr, row_off, rows, n_mask, ms, m_mask, N, k_words, stride_xm,
                         w_start, w_end, BITS, GROUP, PER_ROW, SYMMETRIC, LOP3, BLOCK_M, BLOCK_N, BLOCK_K, PLANES)
    _store(res, ms, m_mask, rows, n_mask, pid_k, pid_n, M, N, b_ptr, out_ptr, ws_ptr, cnt_ptr, n_splits,
           HAS_BIAS, PARTIAL, FIXUP)


@triton.jit
def _dequant_kernel(w_ptr, s_ptr, z_ptr, out_ptr, N, K, k_words, stride_w, BITS: tl.constexpr, GROUP: tl.constexpr,
                    PER_ROW: tl.constexpr, SYMMETRIC: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    PLANES: tl.constexpr = False):
    """out[n, k] = (code - zero) * scale in float32, cast to out's dtype; BLOCK_K within one group
    (PLANES: the planes layout, ``_dequant_planes``)."""
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = rows < N
    if PLANES:
        _dequant_planes(w_ptr, s_ptr, z_ptr, out_ptr, rows, n_mask, N, K, stride_w, GROUP, PER_ROW, SYMMETRIC,
                        BLOCK_N)
    else:
        k0 = tl.program_id(1) * BLOCK_K
        ks = k0 + tl.arange(0, BLOCK_K)
        codes = _load_codes(w_ptr, rows, n_mask, k0, K, k_words, stride_w, BITS, BLOCK_N, BLOCK_K)
        g = 0 if PER_ROW else k0 // GROUP
        s = tl.load(s_ptr + g * N + rows, mask=n_mask, other=0.0).to(tl.float32)
        if SYMMETRIC:
            z = tl.full((BLOCK_N,), 2 ** (BITS - 1), tl.float32)
        else:
            z = tl.load(z_ptr + g * N + rows, mask=n_mask, other=0.0).to(tl.float32)
        w = (_codes_as_float(codes, 0) - z[:, None]) * s[:, None]
        tl.store(out_ptr + rows.to(tl.int64)[:, None] * K + ks[None, :], w.to(out_ptr.dtype.element_ty),
                 mask=n_mask[:, None] & (ks < K)[None, :])


@triton.jit
def _dequant_planes(w_ptr, s_ptr, z_ptr, out_ptr, rows, n_mask, N, K, stride_w, GROUP: tl.constexpr,
                    PER_ROW: tl.constexpr, SYMMETRIC: tl.constexpr, BLOCK_N: tl.constexpr):
    """The dequantize kernel's program for one 128-code chunk of the planes layout (program_id 1):
    a (BLOCK_N, 16) word tile becomes (BLOCK_N, 8 planes, 16) codes, plane ``i`` with its own
    group's scale and zero (any group >= 16), which in that order are the chunk's 128 columns
    (16i + c): one (BLOCK_N, 128) store, as the rows layout's program writes."""
    q = tl.program_id(1)
    c16 = tl.arange(0, 16)
    planes = tl.arange(0, 8)
    rows64 = rows.to(tl.int64)[:, None]
    words = tl.load(w_ptr + rows64 * stride_w + (q * 16 + c16)[None, :], mask=n_mask[:, None], other=0)
    codes = (words[:, None, :] >> (4 * planes)[None, :, None]) & 0xF
    g = planes * 0 if PER_ROW else (q * 128 + 16 * planes) // GROUP
    sg_off = g[None, :] * N + rows[:, None]
    s = tl.load(s_ptr + sg_off, mask=n_mask[:, None], other=0.0).to(tl.float32)
    if SYMMETRIC:
        z = tl.full((BLOCK_N, 8), 8.0, tl.float32)
    else:
        z = tl.load(z_ptr + sg_off, mask=n_mask[:, None], other=0.0).to(tl.float32)
    w = tl.reshape((_codes_as_float(codes, 0) - z[:, :, None]) * s[:, :, None], (BLOCK_N, 128))
    tl.store(out_ptr + rows64 * K + (q * 128 + tl.arange(0, 128))[None, :], w.to(out_ptr.dtype.element_ty),
             mask=n_mask[:, None])


_qmm = TritonLauncher(_qmm_kernel)
_dequant = TritonLauncher(_dequant_kernel)
_gemv = TritonLauncher(_gemv_kernel)


def launch(call: LinearCall) -> torch.Tensor:
    """Run the kernel for ``call`` (either variant: the tile config tells them apart)."""
    p = call.problem
    config = tile_config(p)
    swap = config[3] and _swapped(p)
    join = swap or _unswapped_join(p)
    return launch_config(call, config, _programs_per_sm(config), join=join, swap=swap)


def launch_config(call: LinearCall, config: tuple, programs_per_sm: int = PROGRAMS_PER_SM,
                  fixup: Optional[bool] = None, join: bool = False, swap: bool = False) -> torch.Tensor:
    """Run ``call`` with an explicit ``tile_config``-style tuple (the benchmark's sweep uses this).
    BLOCK_M 1 without dot is the GEMV kernel (M must be 1); the dot path needs BLOCK_K <= group.
    ``join`` (int4) and ``swap`` choose the dot kernel's JOIN and SWAP forms."""
    p = call.problem
    w = call.w
    x = call.x
    block_m, block_n, block_k, use_dot, warps, stages = config
    per_row = w.group_size == -1 or w.group >= p.k
    if use_dot and block_k > w.group and not per_row:
        raise ValueError(f"the dot path needs BLOCK_K ({block_k}) <= group ({w.group})")
    if not use_dot and (p.m > block_m or block_m > GEMV_MAX_M or (p.bits == 8 and p.k % 4)):
        raise ValueError(f"the GEMV kernel takes M <= BLOCK_M <= {GEMV_MAX_M} (and int8 K % 4 == 0)")
    if not use_dot and not per_row and w.group < block_k and block_k % w.group:
        raise ValueError(f"the GEMV kernel needs BLOCK_K ({block_k}) and the group ({w.group}) to divide one another")
    if w.layout == "planes" and (use_dot or block_k % 128 or not (per_row or w.group >= 128)):
        raise ValueError("a planes-layout weight runs here only in the GEMV kernel, with BLOCK_K a multiple of 128 "
                         f"and groups of at least 128 (got {config}, group {w.group})")
    m_tiles, n_tiles = cdiv(p.m, block_m), cdiv(p.n, block_n)
    tiles = m_tiles * n_tiles
    # partials cost 8 bytes per split and output element (written, read back): at most half the weight's bytes
    byte_cap = max(1, w.nbytes // (2 * 8 * p.m * p.n))
    split, k_per_split = _split(tiles, p.k, block_k, x.device, programs_per_sm, min(MAX_SPLIT, byte_cap))
    out = alloc.empty((p.m, p.n), x.dtype, x.device)
    has_bias = call.bias is not None
    bias = call.bias if has_bias else w.scales_t
    zeros = w.zeros_t if w.zeros_t is not None else w.scales_t
    fixup = split_fixup(config, p.bits) if fixup is None else fixup
    ws = out if split == 1 else torch.empty((split, p.m, p.n), dtype=torch.float32, device=x.device)
    counters = _counters(x.device, tiles) if split > 1 and fixup else ws
    dependent = pdl.on(x.device)
    if use_dot:
        mode, offset = code_mode(w.bits, x.dtype)
        _qmm((tiles, split), (x, w.packed, w.scales_t, zeros, bias, out, ws, counters, p.m, p.n, p.k, p.k // 8,
                              x.stride(0), w.packed.stride(0), k_per_split, m_tiles, split, w.bits, w.group, per_row,
                              w.symmetric, has_bias, split > 1, fixup, triton_interpreting(), mode, offset,
                              block_m, block_n, block_k, join and w.bits == 4, swap, dependent),
             num_warps=warps, num_stages=stages)
    else:
        pack = 32 // w.bits
        _gemv((n_tiles, split), (x, w.packed, w.scales_t, zeros, bias, out, ws, counters, p.m, p.n, p.k, p.k // pack,
                                 x.stride(0), p.k // pack, k_per_split // pack, split, w.bits, w.group, per_row,
                                 w.symmetric, has_bias, split > 1, fixup, not triton_interpreting(), block_m, block_n,
                                 block_k, dependent, w.layout == "planes"),
              num_warps=warps, num_stages=stages)
    if split > 1 and not fixup:
        launch_combine(ws, bias, out, split, has_bias, dependent)
    # SwiGLU as its own kernel: in the one-row GEMV it measured slower than apart (H100, 1B int4 step)
    return epilogue.finish(out, call)


def dequantize(w, dtype: torch.dtype) -> torch.Tensor:
    """The (N, K) weight ``(code - zero) * scale`` (float32, then cast to ``dtype``) by a Triton kernel."""
    n, k = w.shape
    per_row = w.group_size == -1 or w.group >= k
    planes = w.layout == "planes"      # one program per 128-code chunk
    block_k = 128 if planes else min(_pow2_le(k if per_row else w.group), 128)
    out = alloc.empty((n, k), dtype, w.device)
    zeros = w.zeros_t if w.zeros_t is not None else w.scales_t
    _dequant((cdiv(n, 32), cdiv(k, block_k)), (w.packed, w.scales_t, zeros, out, n, k, k // 8, w.packed.stride(0),
                                                w.bits, w.group, per_row, w.symmetric, 32, block_k, planes),
             num_warps=4)
    return out


def launch_dequant_gemm(call: LinearCall) -> torch.Tensor:
    """Dequantize the weight to x's dtype (one pass over N*K), then cuBLAS through ``F.linear``.
    Unlike the other variants, the weight is rounded to x's 16-bit dtype before the product."""
    wd = dequantize(call.w, call.x.dtype)
    return epilogue.finish(F.linear(call.x, wd, call.bias), call)


def _dtype_reason(p: LinearProblem):
    if p.dtype not in KERNEL_DTYPES:
        return (f"x is {str(p.dtype).replace('torch.', '')}; the quantized kernels take float16 or bfloat16 "
                "(float32 and float64 run on the torch path)")
    if p.dense:
        return "w is dense (torch's F.linear runs it)"
    if p.k < 16:
        return f"K={p.k} < 16 (tl.dot needs K tiles of at least 16)"
    return None


def _rows_reason(p: LinearProblem):
    """Why the rows-layout kernels cannot run ``p`` (the dtype and K checks, and the layout)."""
    if p.planes:
        return "the weight is in the planes layout: the planes variant reads it"
    return _dtype_reason(p)


def supports_decode(p: LinearProblem):
    if p.planes:
        return _planes_gemv_reason(p)
    return _dtype_reason(p) or (None if p.decode else f"M={p.m} rows > 16: the prefill variant's")


def _planes_gemv_reason(p: LinearProblem):
    """A planes-layout weight runs in the decode variant only through the GEMV kernel
    (``planes_tiles.planes_gemv``: one row, N*K under ``PLANES_MMA_MIN_NK``, groups of at least one
    128-code chunk; ``_code_columns``)."""
    reason = _dtype_reason(p)
    if reason:
        return reason
    if not planes_gemv(p):
        return (f"the weight is in the planes layout: the decode variant reads it with the GEMV kernel "
                f"(M <= {PLANES_GEMV_MAX_M}, N*K < {PLANES_MMA_MIN_NK}, groups >= 128), not at M={p.m}, N={p.n} "
                f"with group {p.group}")
    return None


def supports_dequant_gemm(p: LinearProblem):
    if p.planes:   # the dequantize kernel reads the planes layout (planes_tiles.planes_dequant)
        large = None if planes_dequant(p) else (f"the weight is in the planes layout: dequant+cuBLAS takes it from "
                                                f"M={qproblem.DEQUANT_GEMM_MIN_M} rows (small weights from "
                                                f"M={PLANES_DEQUANT_SMALL_MIN_M}), not M={p.m} with N*K={p.n * p.k}")
        return _dtype_reason(p) or large
    return _dtype_reason(p) or (None if p.dequant_gemm else _not_dequant_gemm_reason(p))


def _not_dequant_gemm_reason(p: LinearProblem) -> str:
    small = f", and not int4 at M 17..{qproblem.DEQUANT_SMALL_MAX_M} with N*K <= {qproblem.DEQUANT_SMALL_NK}"
    mid = (f", nor int4 from M={qproblem.INT4_DEQUANT_MIN_M} (but N >= {qproblem.INT4_WIDE_N} with K <= "
           f"{qproblem.INT4_WIDE_MAX_K} only from M={qproblem.INT4_WIDE_MAX_M + 1})")
    return f"M={p.m} rows < {qproblem.DEQUANT_GEMM_MIN_M}{small}{mid}: the Triton GEMM's (exact codes, no weight pass)"


def supports_prefill(p: LinearProblem):
    return _rows_reason(p)


VARIANTS = (
    ("planes", supports_planes, launch_planes,
     "int4 weights repacked into the planes layout (weight.repack): nibble i of a word tile is one "
     "MMA K step, unpacked in the operand's registers; M 2..255 (one row on heads and small groups)"),
    ("decode", supports_decode, launch, "M <= 16: packed weights streamed once, unpacked in registers, split K"),
    ("dequant_gemm", supports_dequant_gemm, launch_dequant_gemm,
     "M >= 256, also int4 M 17..64 with N*K <= 8*2**20 and int4 from M 65 (wide short weights "
     "from 129): weight dequantized to x's dtype in one pass, then cuBLAS"),
    ("prefill", supports_prefill, launch, "M > 16: codes fed to tl.dot per group tile, scale/zero per group"),
)
