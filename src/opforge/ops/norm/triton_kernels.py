"""Triton kernels for layer_norm, rms_norm and their fused residual-add forms.

Two kernels serve three variants, chosen by the row length N:

* ``multirow`` (N <= 1024): a program normalizes a tile of BLOCK_M rows at once, so narrow rows
  still give each program enough bytes in flight.
* ``row`` (1024 < N <= the register limit): one program per row, the row held in registers,
  read once and written once.
* ``looped`` (any N): one program per row walks it in chunks summing x - shift and its square,
  then a second walk normalizes. The row's second read mostly hits L2.

All accumulate in float32. Layer norm never takes E[x^2] - E[x]^2: it sums d = x - shift with a
shift near the mean (the mean itself, or the row's first value where ``config.first_value_shift``
says so), exact for clustered rows, so E[d^2] - E[d]^2 cancels little. The sums of d and d^2 are
one reduction of (d, d^2) pairs: one exchange between warps where two sums take two.
Rows are addressed as ``(r // inner) * stride_outer + (r % inner) * stride_inner`` so strided
views run in place; outputs are packed.
"""
from __future__ import annotations

from typing import Optional

import triton
import triton.language as tl

from ...runtime import alloc
from ...runtime.triton import pdl
from ...runtime.backends import triton_interpreting
from ...runtime.errors import kernel_dtype_reason
from ...runtime.triton.launch import I32_MAX, TritonLauncher, cdiv
from .config import (MULTIROW_MAX_N, ROW_MAX_N, first_value_shift, looped_config, multirow_config, paired_sums,
                     row_config)
from .problem import PLANS, NormCall, NormProblem

# With the first value as the shift, where E[(x - shift)^2] > SHIFT_FAR * var (the shift over ~4
# standard deviations off the mean, the one-pass form losing ~4 bits) the variance is recomputed
# around the mean.
SHIFT_FAR = tl.constexpr(16.0)


@triton.jit
def _sum_and_squares(d, axis: tl.constexpr, PAIRED: tl.constexpr):
    """(sum of d, sum of d * d) along ``axis``. PAIRED: one reduction of (d, d^2) pairs, one exchange
    between warps where two sums take two (sm_90 PTX: 8 -> 5 barriers in a one-row program). The
    interpreter sums the paired axis with numpy, which adds a strided axis in order, not pairwise
    (1e3 times the error at 40000 values), so there the two sums stay apart."""
    if PAIRED:
        s1, s2 = tl.split(tl.sum(tl.join(d, d * d), axis=axis))
    else:
        s1 = tl.sum(d, axis=axis)
        s2 = tl.sum(d * d, axis=axis)
    return s1, s2


@triton.jit
def _row_offsets(row, inner, stride_outer, stride_inner):
    return (row // inner) * stride_outer + (row % inner) * stride_inner


@triton.jit
def _first_values(x_ptr, r_ptr, s_ptr, x_off, r_off, row_ok, HAS_RES: tl.constexpr):
    """Per row (x_off, r_off: row start offsets), its first value, of x + residual rounded to the
    stored dtype when HAS_RES, as the kernel normalizes it: a load every thread makes, no exchange."""
    v = tl.load(x_ptr + x_off, mask=row_ok, other=0.0).to(tl.float32)
    if HAS_RES:
        v += tl.load(r_ptr + r_off, mask=row_ok, other=0.0).to(tl.float32)
        v = v.to(s_ptr.dtype.element_ty).to(tl.float32)
    return v


@triton.jit(do_not_specialize=["rows", "x_inner", "r_inner"])
def _tile_kernel(x_ptr, r_ptr, y_ptr, s_ptr, w_ptr, b_ptr, rows, n,
                 x_inner, x_so, x_si, r_inner, r_so, r_si, eps,
                 IS_RMS: tl.constexpr, HAS_RES: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, FIRST_SHIFT: tl.constexpr, PAIRED: tl.constexpr,
                 PDL: tl.constexpr = False):
    pdl.wait_for_previous(PDL)
    row = (tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    col_ok = cols < n
    mask = (row < rows)[:, None] & col_ok[None, :]
    out_off = row[:, None] * n + cols[None, :]
    x_off = _row_offsets(row, x_inner, x_so, x_si)
    v = tl.load(x_ptr + x_off[:, None] + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    r_off = x_off  # unused without a residual
    if HAS_RES:
        r_off = _row_offsets(row, r_inner, r_so, r_si)
        v += tl.load(r_ptr + r_off[:, None] + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        total = v.to(s_ptr.dtype.element_ty)
        tl.store(s_ptr + out_off, total, mask=mask)
        v = total.to(tl.float32)
    if IS_RMS:
        y = v * tl.rsqrt(tl.sum(v * v, axis=1) / n + eps)[:, None]
    else:
        # Shifted data: d = x - shift is exact for clustered rows, so the mean of d corrects
        # the rounding of shift (rows like 1e4 + randn keep float32 accuracy), and since
        # mean(d) is small, var = mean(d^2) - mean(d)^2 cancels little.
        if FIRST_SHIFT:
            # shift = the row's first value: it does not wait for the whole row, so the paired
            # sums below are the only exchange between warps.
            shift = _first_values(x_ptr, r_ptr, s_ptr, x_off, r_off, row < rows, HAS_RES)
        else:
            shift = tl.sum(v, axis=1) / n
        d = tl.where(mask, v - shift[:, None], 0.0)
        d_sum, d_sq_sum = _sum_and_squares(d, 1, PAIRED)
        d_mean = d_sum / n
        d_sq = d_sq_sum / n
        var = tl.maximum(d_sq - d_mean * d_mean, 0.0)
        if FIRST_SHIFT:
            if tl.max(d_sq - var * SHIFT_FAR, axis=0) > 0.0:
                # A row's shift was far from its mean (an odd prefix), so d_sq - d_mean^2 cancelled:
                # take the variance around the mean itself for this tile, in one more round over
                # the rows read again (from cache: keeping d live across the branch costs registers).
                if HAS_RES:
                    tl.debug_barrier()
                    again = tl.load(s_ptr + out_off, mask=mask, other=0.0).to(tl.float32)
                else:
                    again = tl.load(x_ptr + x_off[:, None] + cols[None, :], mask=mask, other=0.0).to(tl.float32)
                dev = tl.where(mask, (again - shift[:, None]) - d_mean[:, None], 0.0)
                var = tl.sum(dev * dev, axis=1) / n
        y = (d - d_mean[:, None]) * tl.rsqrt(var + eps)[:, None]
    if HAS_W:
        y *= tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    if HAS_B:
        y += tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(y_ptr + out_off, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _first_walk_chunk(x_row, r_row, s_row, c, ok, HAS_RES: tl.constexpr):
    """x[c] (float32) on the looped variant's first walk, asking L2 to keep it; with HAS_RES,
    x + residual rounded to the stored dtype, stored (kept in L2 for the second walk) and returned."""
    v = tl.load(x_row + c, mask=ok, other=0.0, eviction_policy="evict_last").to(tl.float32)
    if HAS_RES:
        v += tl.load(r_row + c, mask=ok, other=0.0, eviction_policy="evict_first").to(tl.float32)
        total = v.to(s_row.dtype.element_ty)
        tl.store(s_row + c, total, mask=ok, eviction_policy="evict_last")
        v = total.to(tl.float32)
    return v


@triton.jit(do_not_specialize=["rows", "x_inner", "r_inner"])
def _looped_kernel(x_ptr, r_ptr, y_ptr, s_ptr, w_ptr, b_ptr, rows, n,
                   x_inner, x_so, x_si, r_inner, r_so, r_si, eps,
                   IS_RMS: tl.constexpr, HAS_RES: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr,
                   CHUNK: tl.constexpr, PAIRED: tl.constexpr, PDL: tl.constexpr = False):
    pdl.wait_for_previous(PDL)
    row = tl.program_id(0).to(tl.int64)
    x_start = _row_offsets(row, x_inner, x_so, x_si)
    x_row = x_ptr + x_start
    r_start = _row_offsets(row, r_inner, r_so, r_si)
    r_row = r_ptr + r_start
    y_row = y_ptr + row * n
    s_row = s_ptr + row * n
    cols = tl.arange(0, CHUNK)
    # The row is read twice. The first walk asks L2 to keep it (evict_last) and the second walks
    # it backwards, so the chunks it needs first are the ones read most recently.
    # Layer norm takes sums of v - shift, shift being the first chunk's mean: for clustered rows
    # (1e4 + randn) that subtraction is exact, so var = E[(v-shift)^2] - E[v-shift]^2 cancels
    # little, and the two sums of a chunk are one reduction of pairs.
    shift = 0.0
    ok = cols < n
    v = _first_walk_chunk(x_row, r_row, s_row, cols, ok, HAS_RES)
    if IS_RMS:
        s1 = tl.zeros((), tl.float32)
        s2 = tl.sum(v * v, axis=0)
    else:
        shift = tl.sum(v, axis=0) / tl.minimum(n, CHUNK).to(tl.float32)
        s1, s2 = _sum_and_squares(tl.where(ok, v - shift, 0.0), 0, PAIRED)
    for start in range(CHUNK, n, CHUNK):
        c = start + cols
        ok = c < n
        v = _first_walk_chunk(x_row, r_row, s_row, c, ok, HAS_RES)
        if IS_RMS:
            s2 += tl.sum(v * v, axis=0)
        else:
            c1, c2 = _sum_and_squares(tl.where(ok, v - shift, 0.0), 0, PAIRED)
            s1 += c1
            s2 += c2
    mean = s1 / n
    if HAS_RES:
        tl.debug_barrier()  # the stored sums are re-read below, possibly by other threads
    if IS_RMS:
        m2 = s2
    else:
        m2 = tl.maximum(s2 - s1 * mean, 0.0)
    rstd = tl.rsqrt(m2 / n + eps)
    last = tl.cdiv(n, CHUNK) - 1
    for i in range(0, tl.cdiv(n, CHUNK)):
        c = (last - i) * CHUNK + cols
        ok = c < n
        if HAS_RES:
            v = tl.load(s_row + c, mask=ok, other=0.0, eviction_policy="evict_first").to(tl.float32)
        else:
            v = tl.load(x_row + c, mask=ok, other=0.0, eviction_policy="evict_first").to(tl.float32)
        if IS_RMS:
            y = v * rstd
        else:
            y = ((v - shift) - mean) * rstd
        if HAS_W:
            y *= tl.load(w_ptr + c, mask=ok, other=0.0).to(tl.float32)
        if HAS_B:
            y += tl.load(b_ptr + c, mask=ok, other=0.0).to(tl.float32)
        tl.store(y_row + c, y.to(y_ptr.dtype.element_ty), mask=ok, eviction_policy="evict_first")


_tile = TritonLauncher(_tile_kernel)
_looped = TritonLauncher(_looped_kernel)


_INF = float("inf")


def _outputs(call: NormCall):
    x = call.x.tensor
    y = alloc.empty_packed_like(x)
    s = alloc.empty_packed_like(x) if call.problem.has_residual else None
    return y, s


def _launch(launcher: TritonLauncher, call: NormCall, config: tuple, grid: tuple, constexprs: tuple, warps: int):
    """Run one norm kernel: straight to the compiled binary with raw addresses when this
    specialization has run before, else through Triton's path (which compiles)."""
    p = call.problem
    x, r = call.x, call.residual or call.x
    w, b = call.weight, call.bias
    y, s = _outputs(call)
    xt = x.tensor
    xp, rp, yp = xt.data_ptr(), r.tensor.data_ptr(), y.data_ptr()
    sp = s.data_ptr() if s is not None else yp
    wp = w.data_ptr() if w is not None else yp
    bp = b.data_ptr() if b is not None else yp
    tail = (p.rows, p.n, x.inner, x.stride_outer, x.stride_inner, r.inner, r.stride_outer, r.stride_inner,
            call.eps, p.is_rms, p.has_residual, w is not None, b is not None) + constexprs
    key = None
    # The key fixes Triton's specialization: all pointers 16-byte aligned, no integer equal to 1
    # or beyond int32, each stride's divisibility by 16 (rows and inner are not specialized).
    if not ((xp | rp | wp | bp) & 15 or p.n == 1
            or max(x.stride_outer, x.stride_inner, r.stride_outer, r.stride_inner) > I32_MAX):
        index = xt.device.index
        key = (config, constexprs, p.op, p.dtype, p.n, p.weight_dtype, p.bias_dtype, index, x.stride_outer & 15,
               x.stride_inner & 15, r.stride_outer & 15, r.stride_inner & 15)
    if key is None or not launcher.launch_raw(key, grid, (xp, rp, yp, sp, wp, bp) + tail, warps, index):
        launcher(grid, (xt, r.tensor, y, s if s is not None else y, w if w is not None else y,
                        b if b is not None else y) + tail, num_warps=warps, key=key)
    if key is not None and call.signature is not None:
        _offer_plan(launcher, key, call, grid[0], tail, index)
    return (y, s) if s is not None else y


def _offer_plan(launcher: TritonLauncher, key: tuple, call: NormCall, grid_x: int, tail: tuple, index: int) -> None:
    """Leave a plan that repeats this launch for calls of the same signature (packed x, residual,
    weight and bias; the pointers and eps change per call)."""
    if call.signature in PLANS:  # one declined this call (another current device, say)
        return
    go = launcher.raw_launcher(key)
    if go is None:
        return
    p = call.problem
    head, consts = tail[:8], tail[9:]
    has_res, has_w, has_b = p.has_residual, call.weight is not None, call.bias is not None
    empty_like = alloc.empty_packed_like

    def plan(x, residual, weight, bias, eps):
        if type(eps) is not float or not 0.0 <= eps < _INF:
            return None
        xp = x.data_ptr()
        rp = residual.data_ptr() if has_res else xp
        wp = weight.data_ptr() if has_w else 0
        bp = bias.data_ptr() if has_b else 0
        if (xp | rp | wp | bp) & 15:
            return None
        y = empty_like(x)
        yp = y.data_ptr()
        if has_res:
            s = empty_like(x)
            sp = s.data_ptr()
        else:
            s, sp = None, yp
        if not go(grid_x, (xp, rp, yp, sp, wp if has_w else yp, bp if has_b else yp) + head + (eps,) + consts, index):
            return None
        return (y, s) if has_res else y

    PLANS.offer(call.signature, plan, "triton")


def _pairs(p: NormProblem) -> bool:
    """Whether layer norm may sum (d, d^2) as pairs at all (not rms_norm, not under the interpreter:
    see ``_sum_and_squares``); ``config.paired_sums`` says where the tile program does."""
    return not p.is_rms and not triton_interpreting()


def _tile_constexprs(call: NormCall, block_m: int, block_n: int) -> tuple:
    p = call.problem
    first = not p.is_rms and first_value_shift(block_n, p.has_residual)
    return block_m, block_n, first, _pairs(p) and paired_sums(block_m, block_n), pdl.on(call.x.tensor.device)


def launch_multirow(call: NormCall):
    config = multirow_config(call.problem.n, call.problem.dtype.itemsize)
    block_m, block_n, warps = config
    return _launch(_tile, call, config, (cdiv(call.problem.rows, block_m),),
                   _tile_constexprs(call, block_m, block_n), warps)


def launch_row(call: NormCall):
    config = row_config(call.problem.n, call.problem.dtype.itemsize, call.problem.is_rms)
    block_m, block_n, warps = config
    return _launch(_tile, call, config, (call.problem.rows,), _tile_constexprs(call, block_m, block_n), warps)


def launch_looped(call: NormCall):
    config = looped_config(call.problem.n)
    chunk, warps = config
    return _launch(_looped, call, config, (call.problem.rows,),
                   (chunk, _pairs(call.problem), pdl.on(call.x.tensor.device)), warps)


def _dtype_reason(p: NormProblem) -> Optional[str]:
    return kernel_dtype_reason("triton", p.dtype)


def supports_multirow(p: NormProblem) -> Optional[str]:
    return _dtype_reason(p) or (None if p.n <= MULTIROW_MAX_N else f"N={p.n} > {MULTIROW_MAX_N}")


def supports_row(p: NormProblem) -> Optional[str]:
    if _dtype_reason(p):
        return _dtype_reason(p)
    limit = ROW_MAX_N[p.dtype.itemsize]
    return (None if p.n <= limit else f"N={p.n} > {limit}: a row this wide would spill registers")


def supports_looped(p: NormProblem) -> Optional[str]:
    return _dtype_reason(p)


VARIANTS = (
    ("multirow", supports_multirow, launch_multirow, "several narrow rows per program, held in registers"),
    ("row", supports_row, launch_row, "one row per program, held in registers"),
    ("looped", supports_looped, launch_looped, "one row per program, walked in chunks (any N)"),
)
