"""The ``planes`` Triton variant of ``linear``: int4 weights repacked into the planes layout
(``weight.repack``), on tensor cores, M = 1..255 (more than 64 rows run several M tiles).
The other kernels read the planes layout where they run better: the decode variant's GEMV at
one row of weights under 16M elements with groups of >= 128 (``planes_gemv``), dequant+cuBLAS
(its dequantize kernel) on small weights from 65 rows and on every weight from 256
(``planes_dequant``).

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
  group's float32 MMA sum, so no dequantized weight is rounded to 16 bits, except on the tiles
  that fold the scale into the codes (``FOLD``: the weight rounded once, as dequant+cuBLAS does).
* One K = 128 dot per chunk (``K128``): Triton waits once per chunk for its MMAs, not per plane.
* Scale and zero in one int32 word per group and row (``weight.group_words``, same 4 bytes as
  the two 16-bit values), a 2-D tile that the software pipeline copies ahead with the codes.

On GPUs with Hopper's copy engine (sm_90+) the large weights at 9+ rows (``planes_tiles.planes_tma``)
read their word tiles, and x's chunks with the K = 128 dot, through tensor descriptors: a tile per
copy instruction instead of 16-byte copies from every thread (registers 188 -> 128 on the two-warp
tile, 191 -> 118 on the 256-feature tile; 8B gate_up at 16 rows 12-15% faster, but smaller weights
and fewer rows slower).

With programmatic dependent launch, a program on a weight of ``PLANES_PREFETCH_MIN_NK``+ elements
first asks L2 for the first lines of its rows (``pdl.prefetch_to_l2``), then waits on the previous
kernel: its first DRAM reads overlap that kernel's tail.

Tiles (``planes_tiles.planes_config``): the weight is the MMA's first operand (out^T = W x^T);
BLOCK_M the power of two >= M (16..64) or a smaller tile run several times; warps, stages,
chunks per step, whether a chunk is one K = 128 dot and whether the scale is folded into the
codes, by rows and weight size. K split as the other dot kernels, partials added by the combine
kernel (or, ``fixup``, by the last split in the kernel).
"""
from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from ...runtime import alloc
from ...runtime.backends import triton_interpreting
from ...runtime.triton import pdl
from ...runtime.triton.arch import nvidia_sm90_or_newer
from ...runtime.triton.launch import TritonLauncher, cdiv
from . import epilogue, planes_tiles
from .config import MAX_SPLIT, PROGRAMS_PER_SM, _split, code_mode, prefetch_lines
from .kernel_parts import _codes_as_float, _counters, _store, launch_combine
from .planes_tiles import PLANES_GEMV_MAX_M, PLANES_MMA_MIN_NK, PLANES_PREFETCH_MIN_NK, planes_config, planes_dequant, \
    planes_gemv
from .problem import LinearCall, LinearProblem
from .weight import PLANE_CHUNK

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
def _plane_minus_zero(words, zc, i: tl.constexpr, CODE_MODE: tl.constexpr, ASM: tl.constexpr, sc=None):
    """(offset + code of nibble ``i``) - (offset + zero) of each word, in x's 16-bit dtype, exact;
    times ``sc`` (the scales, x's dtype, one rounding) when given.

    ASM (sm_90; not under the interpreter): two words per ``prmt``: byte i//2 of each into bytes
    0 and 2 of one register, a shift by 4 for odd i, one ``lop3`` to mask both nibbles and OR the
    exponent of the offset into both halves, one packed ``sub`` of the zero: 2 instructions per
    code (1.5 where ptxas drops the shift by 0), where the plain ops take about 3.5 (each code
    alone to a 16-bit half, then packed: sm_90 PTX)."""
    if ASM:
        # operands: $0 the two results; $1, $2 two words; $3 the two zeros; $4/$5 the prmt
        # selector, $6/$7 the shift (constants, one per packed element); with sc, the two
        # scales are $4 and the selector and shift move up by one
        sel = tl.full(words.shape, (i // 2) | ((i // 2) << 4) | ((4 + i // 2) << 8) | ((4 + i // 2) << 12),
                      tl.int32)
        shift = tl.full(words.shape, 4 * (i % 2), tl.int32)
        if sc is None:
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
            if CODE_MODE == 1:
                out = tl.inline_asm_elementwise(
                    "{ .reg .b32 t; prmt.b32 t, $1, $2, $5; shr.u32 t, t, $7; "
                    "lop3.b32 t, t, 0x000F000F, 0x43004300, 0xEA; sub.bf16x2 t, t, $3; mul.rn.bf16x2 $0, t, $4; }",
                    "=r,r,r,r,r,r,r,r,r", [words, zc, sc, sel, shift], dtype=tl.bfloat16, is_pure=True, pack=2)
            else:
                out = tl.inline_asm_elementwise(
                    "{ .reg .b32 t; prmt.b32 t, $1, $2, $5; shr.u32 t, t, $7; "
                    "lop3.b32 t, t, 0x000F000F, 0x64006400, 0xEA; sub.f16x2 t, t, $3; mul.rn.f16x2 $0, t, $4; }",
                    "=r,r,r,r,r,r,r,r,r", [words, zc, sc, sel, shift], dtype=tl.float16, is_pure=True, pack=2)
    else:
        out = _codes_as_float((words >> (4 * i)) & 0xF, CODE_MODE) - zc
        if sc is not None:
            out = out * sc
    return out


@triton.jit
def _planes_dot(acc, s, x_rows, words, z, m_mask, q, first: tl.constexpr, count: tl.constexpr, F32_DOT: tl.constexpr,
                CODE_MODE: tl.constexpr, ASM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                K128: tl.constexpr, FOLD: tl.constexpr, X_TILE: tl.constexpr = False):
    """``acc`` plus scale ``s`` times the sum over planes ``first .. first+count-1`` of chunk ``q``
    of (code - zero) x^T (float32, (BLOCK_N, BLOCK_M)). Nibble ``i`` of ``words`` is the A operand
    of columns 16i .. 16i+15; ``z`` the (BLOCK_N, 1) int32 zeros.

    K128 (count == 8): the 8 planes joined into one (BLOCK_N, 128) operand of one dot, whose 8
    MMAs Triton issues before a single wait (8 dots of K = 16 wait for each); ``x_rows`` then
    points at 128 columns. FOLD (with K128): (code - zero) * s rounded to x's dtype is the
    operand and ``acc`` the dot's accumulator, carried over the loop without waits. X_TILE (with
    K128): ``x_rows`` is the chunk's (BLOCK_M, 128) tile of x itself, already loaded."""
    mode: tl.constexpr = 0 if F32_DOT else CODE_MODE
    if F32_DOT:       # the interpreter (its bf16 dot is wrong): float32 codes minus the zero
        zc = z.to(tl.float32)
    else:             # (offset + zero) in x's dtype, exact (integer zeros < 16): OR-ed like a code
        zc = _codes_as_float(z, CODE_MODE)
    if K128:
        sc = None
        if FOLD:
            sc = s.to(zc.dtype)
        a = tl.join(tl.join(tl.join(_plane_minus_zero(words, zc, 0, mode, ASM, sc),
                                    _plane_minus_zero(words, zc, 1, mode, ASM, sc)),
                            tl.join(_plane_minus_zero(words, zc, 2, mode, ASM, sc),
                                    _plane_minus_zero(words, zc, 3, mode, ASM, sc))),
                    tl.join(tl.join(_plane_minus_zero(words, zc, 4, mode, ASM, sc),
                                    _plane_minus_zero(words, zc, 5, mode, ASM, sc)),
                            tl.join(_plane_minus_zero(words, zc, 6, mode, ASM, sc),
                                    _plane_minus_zero(words, zc, 7, mode, ASM, sc))))
        # (n, c, p0, p1, p2) holds plane p0 + 2 p1 + 4 p2, column c: column 16 plane + c of the chunk
        a = tl.reshape(tl.permute(a, (0, 4, 3, 2, 1)), (BLOCK_N, 128))
        if X_TILE:
            xc = x_rows
        else:
            xc = tl.load(x_rows + q * 128, mask=m_mask[:, None], other=0.0)
        if F32_DOT:
            xc = xc.to(tl.float32)
        if FOLD:
            out = tl.dot(a, tl.trans(xc), acc)
        else:
            out = acc + tl.dot(a, tl.trans(xc)) * s
    else:
        part = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        for j in tl.static_range(count):
            xi = tl.load(x_rows + (q * 128 + 16 * (first + j)), mask=m_mask[:, None], other=0.0)
            if F32_DOT:
                xi = xi.to(tl.float32)
            part = tl.dot(_plane_minus_zero(words, zc, first + j, mode, ASM), tl.trans(xi), part)
        out = acc + part * s
    return out


@triton.jit
def _planes_kernel(x_ptr, x_desc, w_ptr, w_desc, gw_ptr, b_ptr, out_ptr, ws_ptr, cnt_ptr, M, N, stride_xm, stride_w,
                   chunks_per_split, n_chunks, m_tiles, n_splits,
                   GROUP: tl.constexpr, PER_ROW: tl.constexpr, HAS_BIAS: tl.constexpr,
                   PARTIAL: tl.constexpr, FIXUP: tl.constexpr, F32_DOT: tl.constexpr, CODE_MODE: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   ASM: tl.constexpr = False, PDL: tl.constexpr = False, CHUNKS: tl.constexpr = 1,
                   SCALE_AHEAD: tl.constexpr = False, K128: tl.constexpr = False, FOLD: tl.constexpr = False,
                   PF_LINES: tl.constexpr = 0, TMA: tl.constexpr = False, X_TMA: tl.constexpr = False):
    """(BLOCK_N features, BLOCK_M rows) of out^T per program, over chunks of 128 codes: per chunk
    one (BLOCK_N, 16) word tile; nibble ``i`` of it, minus the zero, is the MMA's A operand for
    columns 16i .. 16i+15 against the matching (BLOCK_M, 16) slice of x. Each group's MMA sum
    (float32) is multiplied by its scales and added to the accumulator. Each loop step takes
    CHUNKS chunks (it divides the split's chunks); SCALE_AHEAD (one group per chunk) loads the
    next chunk's scales a step early. PF_LINES: with PDL, the first PF_LINES 128-byte lines of
    each weight row of the split are prefetched to L2 before the wait on the previous kernel. TMA:
    the word tiles come through ``w_desc``, a (N, K / 8) tensor descriptor of (BLOCK_N, 16) blocks
    (Hopper's copy engine; rows past N read as zeros), instead of pointer loads; X_TMA (with K128)
    x's chunks through ``x_desc``, (BLOCK_M, 128) blocks of (M, K) (rows past M read as zeros)."""
    PPG: tl.constexpr = 8 if (PER_ROW or GROUP >= 128) else GROUP // 16     # planes per group
    pid = tl.program_id(0)
    pid_m = pid % m_tiles
    pid_n = pid // m_tiles
    pid_k = tl.program_id(1)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = rows < N
    q_start = pid_k * chunks_per_split
    q_end = tl.minimum(n_chunks, q_start + chunks_per_split)
    if PF_LINES > 0:       # a line holds two 64-byte chunks of a row
        pf_q = q_start + 2 * tl.arange(0, PF_LINES)
        pdl.prefetch_to_l2(w_ptr + rows.to(tl.int64)[:, None] * stride_w + 16 * pf_q[None, :],
                           n_mask[:, None] & (pf_q < q_end)[None, :], PDL)
    pdl.wait_for_previous(PDL)
    ms = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    m_mask = ms < M
    c16 = tl.arange(0, 16)
    w_rows = w_ptr + rows.to(tl.int64)[:, None] * stride_w + c16[None, :]
    if K128:
        x_rows = x_ptr + ms.to(tl.int64)[:, None] * stride_xm + tl.arange(0, 128)[None, :]
    else:
        x_rows = x_ptr + ms.to(tl.int64)[:, None] * stride_xm + c16[None, :]
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    AHEAD: tl.constexpr = SCALE_AHEAD and PPG == 8
    if AHEAD:
        s_next = _word_scale(_group_word(gw_ptr, rows, n_mask, N, (q_start * 128) // GROUP, PER_ROW))
    for q0 in range(q_start, q_end, CHUNKS):                 # CHUNKS divides the split's chunks
        for c in tl.static_range(CHUNKS):
            q = q0 + c
            if TMA:
                words = w_desc.load([pid_n * BLOCK_N, q * 16])
            else:
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
                if X_TMA and K128:
                    acc = _planes_dot(acc, s, x_desc.load([pid_m * BLOCK_M, q * 128]), words, z, m_mask, q, h * PPG,
                                      PPG, F32_DOT, CODE_MODE, ASM, BLOCK_M, BLOCK_N, K128, FOLD, True)
                else:
                    acc = _planes_dot(acc, s, x_rows, words, z, m_mask, q, h * PPG, PPG, F32_DOT, CODE_MODE, ASM,
                                      BLOCK_M, BLOCK_N, K128, FOLD)
    acc = tl.trans(acc)
    _store(acc, ms, m_mask, rows, n_mask, pid_k, pid, M, N, b_ptr, out_ptr, ws_ptr, cnt_ptr, n_splits,
           HAS_BIAS, PARTIAL, FIXUP)


# One row runs a copy whose M is not specialized. Triton compiles M == 1 as a constant, and that
# variant of the K = 128 tiles ran slower than the same tiles at two rows (H100, CUDA graphs over
# L2-cold weights, ``results/h100/2026-11-27-e5379f8/int4_small_rows.json``: 8B gate_up 35.0 vs
# 28.0 us, 8B head 121.8 vs 107.4). From two rows M keeps its specialization: M % 16 changes the
# two-warp tile's sm_90 code (188 registers vs 150), and without it 1B qkv and o at 64 rows ran
# 10% slower in ``quant_batch`` (``results/h100/2026-11-28-b338125``).
_planes_one_row_kernel = triton.jit(do_not_specialize=["M"])(_planes_kernel.fn)
_planes = TritonLauncher(_planes_kernel)
_planes_one_row = TritonLauncher(_planes_one_row_kernel)


def launch_planes(call: LinearCall, config: Optional[tuple] = None, programs_per_sm: Optional[int] = None,
                  fixup: bool = False, asm: Optional[bool] = None, tma: Optional[bool] = None,
                  x_tma: Optional[bool] = None) -> torch.Tensor:
    """Run ``call`` (a planes-layout weight) with ``planes_config`` or an explicit (BLOCK_M,
    BLOCK_N, warps, stages[, programs per SM[, chunks per step[, scale ahead[, K = 128 dot[, scale
    folded]]]]]) (the K = 128 dot needs groups of >= 128 codes; smaller groups run per plane);
    K splits aim at ``programs_per_sm`` (default: the config's); ``fixup`` adds the split partials
    in the kernel (the last split of a tile) instead of the combine kernel; ``asm`` unpacks two
    codes per ``prmt``/``lop3`` (``_plane_minus_zero``; default: on, except under the interpreter,
    which has no inline PTX); ``tma`` / ``x_tma`` read the codes / x through tensor descriptors
    (default: ``tma_forms``).
    Two chunks per step need an even number of chunks (K / 128); with an odd number the kernel
    steps one chunk at a time."""
    p, w, x = call.problem, call.w, call.x
    config = tuple(config or planes_config(p))
    block_m, block_n, warps, stages = config[:4]
    pps = programs_per_sm or (config[4] if len(config) > 4 else PROGRAMS_PER_SM)
    chunks = config[5] if len(config) > 5 else 1
    scale_ahead = bool(config[6]) if len(config) > 6 else False
    per_row = w.group_size == -1 or w.group >= p.k
    k128 = bool(config[7]) and (per_row or w.group >= 128) if len(config) > 7 else False
    fold = k128 and bool(config[8]) if len(config) > 8 else False
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
    kernel = _planes_one_row if p.m == 1 else _planes
    pf_lines = prefetch_lines(n_tiles * split, x.device, pps, block_n, k_per_split // 2) \
        if dependent and p.n * p.k >= PLANES_PREFETCH_MIN_NK else 0
    default_w, default_x = tma_forms(p, x)
    tma = default_w if tma is None else tma
    x_tma = (default_x if x_tma is None else x_tma) and k128 and _descriptor_ok(x)
    w_desc = _word_tiles(w.packed, block_n) if tma else w.packed
    x_desc = _x_tiles(x, block_m) if x_tma else x
    kernel((tiles, split), (x, x_desc, w.packed, w_desc, w.group_words, bias, out, ws, counters, p.m, p.n, x.stride(0),
                            w.packed.stride(0), k_per_split // PLANE_CHUNK, p.k // PLANE_CHUNK, m_tiles, split,
                            w.group, per_row, has_bias, split > 1, fixup, interpreting, mode, block_m, block_n,
                            asm, dependent, chunks, scale_ahead, k128, fold, pf_lines, tma, x_tma),
           num_warps=warps, num_stages=stages)
    if split > 1 and not fixup:
        launch_combine(ws, bias, out, split, has_bias, dependent)
    return epilogue.finish(out, call)   # only the dense one-row GEMV fuses SwiGLU


def tma_forms(p: LinearProblem, x: torch.Tensor) -> tuple[bool, bool]:
    """(codes, x) through tensor descriptors by default: ``planes_tiles.planes_tma`` on GPUs with
    Hopper's copy engine (compute capability 9.0+), pointers elsewhere and under the interpreter.

    Example:
        >>> tma_forms(LinearProblem(torch.bfloat16, 16, 28672, 4096, 4, 128, False, False, "cpu", "planes"),
        ...           torch.zeros(16, 4096))
        (False, False)
    """
    if x.device.type != "cuda" or triton_interpreting() or not nvidia_sm90_or_newer(x.device.index):
        return False, False
    return planes_tiles.planes_tma(p)


def _descriptor_ok(t: torch.Tensor) -> bool:
    """Whether a 2-D tensor can be a descriptor's base: unit inner stride, 16-byte aligned address
    and row stride."""
    return t.stride(1) == 1 and t.data_ptr() % 16 == 0 and (t.stride(0) * t.element_size()) % 16 == 0


def _word_tiles(packed: torch.Tensor, block_n: int):
    """A tensor descriptor over the planes layout's (N, K / 8) int32 words whose block is one
    chunk (16 words) of ``block_n`` rows: what the kernel's TMA form loads per chunk."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    return TensorDescriptor(packed, list(packed.shape), [packed.stride(0), 1], [block_n, 16])


def _x_tiles(x: torch.Tensor, block_m: int):
    """A tensor descriptor over x (M, K) whose block is one chunk (128 columns) of ``block_m`` rows."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    return TensorDescriptor(x, list(x.shape), [x.stride(0), 1], [block_m, 128])


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
