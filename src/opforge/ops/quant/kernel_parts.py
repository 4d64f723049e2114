"""Triton pieces the quantized ``linear`` kernels share: codes as floats, the output store with
its K-split partials and in-kernel reduction, and the kernel that adds split partials.

``triton_kernels`` (the rows-layout GEMV and dot kernels), ``planes`` (the planes-layout dot
kernel) and ``dense_gemv`` launch with these.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ...runtime import alloc
from ...runtime.triton import pdl
from ...runtime.triton.launch import TritonLauncher, cdiv, next_power_of_2


@triton.jit
def _codes_as_float(codes, MODE: tl.constexpr):
    """Codes (int32, < 256) as floats without integer-to-float conversions (a quarter-rate
    instruction on recent GPUs): OR-ing a code into the low mantissa bits of a power of two
    gives that power plus the code, exactly.

    MODE 0: float32, ``2**23 + code - 2**23`` = code. MODE 1 (codes < 128): bfloat16 ``128 + code``.
    MODE 2 (codes < 1024): float16 ``1024 + code``. MODE 3: float32 code rounded to bfloat16
    (exact for codes < 256). Modes 1 and 2 keep the offset: the caller adds it to the zero."""
    if MODE == 1:
        out = (codes | 0x4300).to(tl.int16).to(tl.bfloat16, bitcast=True)
    elif MODE == 2:
        out = (codes | 0x6400).to(tl.int16).to(tl.float16, bitcast=True)
    elif MODE == 3:
        out = ((codes | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0).to(tl.bfloat16)
    else:
        out = (codes | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0
    return out   # one return: compiled Triton wants one return type per function


@triton.jit
def _store(res, ms, m_mask, rows, n_mask, pid_k, tile, M, N, b_ptr, out_ptr, ws_ptr, cnt_ptr, n_splits,
           HAS_BIAS: tl.constexpr, PARTIAL: tl.constexpr, FIXUP: tl.constexpr):
    """Write a (BLOCK_M, BLOCK_N) float32 result: with the bias added, cast, to the output; or
    (PARTIAL) to this split's slice of the workspace. With FIXUP, the split that finishes a tile
    last (a per-tile counter, taken with an acq_rel atomic after a barrier) adds the tile's
    partials in split order, writes the output and resets the counter to 0 for the next call."""
    out_mask = m_mask[:, None] & n_mask[None, :]
    if PARTIAL:
        off = (pid_k * M + ms.to(tl.int64))[:, None] * N + rows[None, :]
        tl.store(ws_ptr + off, res, mask=out_mask)
        if FIXUP:
            tl.debug_barrier()                                       # every thread's partial is written
            done = tl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel")
            if done == n_splits - 1:
                base = ms.to(tl.int64)[:, None] * N + rows[None, :]
                total = tl.zeros_like(res)
                part = ws_ptr + base
                for _ in range(n_splits):
                    total += tl.load(part, mask=out_mask, other=0.0, cache_modifier=".cg")  # L2: other SMs wrote them
                    part += M * N
                if HAS_BIAS:
                    total += tl.load(b_ptr + rows, mask=n_mask, other=0.0).to(tl.float32)[None, :]
                tl.store(out_ptr + base, total.to(out_ptr.dtype.element_ty), mask=out_mask)
                tl.atomic_xchg(cnt_ptr + tile, 0)
    else:
        if HAS_BIAS:
            res += tl.load(b_ptr + rows, mask=n_mask, other=0.0).to(tl.float32)[None, :]
        off = ms.to(tl.int64)[:, None] * N + rows[None, :]
        tl.store(out_ptr + off, res.to(out_ptr.dtype.element_ty), mask=out_mask)


@triton.jit
def _combine_kernel(ws_ptr, b_ptr, out_ptr, MN, N, SPLIT: tl.constexpr, SPLIT_P2: tl.constexpr,
                    HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    """out = sum over splits of the float32 partials (in split order), + bias, cast. Every split's
    partial is loaded at once, as one (splits, BLOCK) tile: a loop over the splits let ptxas keep
    two or three loads in flight and wait for each group in turn (sm_90 SASS at 8 splits), so a
    call waited several L2 round trips instead of one. With ``combine_tile``'s BLOCK the split axis
    lies within each thread, whose sum runs in index order: the bits of the loop's (and of the
    in-kernel reduction, ``_store``)."""
    pdl.wait_for_previous(PDL)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < MN
    s = tl.arange(0, SPLIT_P2)
    parts = tl.load(ws_ptr + s[:, None] * MN + offs[None, :], mask=(s[:, None] < SPLIT) & mask[None, :], other=0.0)
    acc = tl.sum(parts, axis=0)
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs % N, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + offs, acc.to(out_ptr.dtype.element_ty), mask=mask)


_combine = TritonLauncher(_combine_kernel)


def combine_tile(split_p2: int) -> tuple[int, int]:
    """(elements per program, warps) of the combine kernel for ``split_p2`` partials (a power of
    two: the splits' count rounded up, as the kernel loads them): 4 consecutive
    elements per thread (one 16-byte load per split), the warps' threads side by side along them,
    so each thread holds all of its elements' splits (4 warps up to 8 splits, 2 up to 16, then 1:
    at most 128 partial values per thread).

    Example:
        >>> [combine_tile(s) for s in (2, 8, 16, 32)]
        [(512, 4), (512, 4), (256, 2), (128, 1)]
    """
    warps = max(1, 32 // max(8, split_p2))
    return 128 * warps, warps


def launch_combine(ws, bias, out, split: int, has_bias: bool, dependent: bool) -> None:
    """Add ``split`` float32 partials (split, M, N) into ``out`` (M, N), with ``bias`` if ``has_bias``."""
    mn = out.numel()
    split_p2 = next_power_of_2(split)    # opforge's host-side helpers: triton's cost ~2 us per call
    block, warps = combine_tile(split_p2)
    _combine((cdiv(mn, block),), (ws, bias, out, mn, out.shape[-1], split, split_p2, has_bias, block, dependent),
             num_warps=warps)


_counters = alloc.tile_counters   # per device and stream, left at zero by every launch
