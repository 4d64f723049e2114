"""Triton kernels for softmax and log_softmax over the last dimension.

Four variants, chosen by the row length N and the number of rows:

* ``multirow`` (N <= 1024): a program takes a tile of BLOCK_M rows, so narrow rows (N = 128)
  still give each program enough bytes in flight. One read, one write.
* ``row`` (N up to ``ROW_MAX_N``): one program per row, the row held in registers: max,
  exponentials, sum and the scaled store all from one read.
* ``split`` (few rows, N beyond ``ROW_MAX_N``): each row is cut into segments handled by
  separate programs, so a single long row (a vocabulary of 262144 logits) still spreads over
  the whole GPU. A first kernel writes each segment's (max, sum of exp) to a small workspace;
  a second merges its row's partials and writes its segment. The segments are re-read from L2
  at these sizes.
* ``looped`` (any N): a persistent grid, one program per SM; each program walks its rows in
  tiles of R x C elements. The first walk keeps, per lane, a running maximum and a sum rescaled
  to it (an online softmax, never overflowing); a tile's R values per lane are reduced inside
  their thread first, so the loop has no barrier and pays 1 + 2/R exponentials per element. The
  lanes are merged at the end of the row. The second walk goes backwards, so the tiles the first
  walk read last, still in L2 (loaded with ``evict_last``), come first; each walk loads its next
  tile before computing the current one.

All accumulate in float32 and subtract the row maximum before exponentiating. Rows are
addressed as ``(r // inner) * stride_outer + (r % inner) * stride_inner`` so strided views run
in place; outputs are packed. An all ``-inf`` row gives NaN, as ``torch.softmax`` does.
"""
from __future__ import annotations

import functools
from typing import Optional

import torch
import triton
import triton.language as tl

from ...runtime import alloc
from ...runtime.errors import kernel_dtype_reason
from ...runtime.triton.launch import TritonLauncher, cdiv, int_spec, next_power_of_2
from .config import LOOP_CTAS_PER_SM, MULTIROW_MAX_N, ROW_MAX_N, SPLIT_CHUNK, looped_config, multirow_config, \
    row_config, split_config
from .problem import MAX_ROWS, PLANS, SoftmaxCall, SoftmaxProblem

MAX_N = 2**31 - 1


@triton.jit
def _row_base(row, inner, stride_outer, stride_inner):
    """Element offset of row ``row`` (int32): divided in 32 bits, addressed in 64."""
    return (row // inner).to(tl.int64) * stride_outer + (row % inner).to(tl.int64) * stride_inner


@triton.jit
def _tile_kernel(x_ptr, y_ptr, rows, n, x_inner, x_so, x_si,
                 LOG: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    row = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    mask = (row < rows)[:, None] & (cols < n)[None, :]
    x_off = _row_base(row, x_inner, x_so, x_si)
    v = tl.load(x_ptr + x_off[:, None] + cols[None, :], mask=mask, other=float("-inf")).to(tl.float32)
    shifted = v - tl.max(v, axis=1)[:, None]
    e = tl.exp2(shifted * 1.4426950408889634)
    total = tl.sum(e, axis=1)
    if LOG:
        y = shifted - tl.log(total)[:, None]
    else:
        y = e * (1.0 / total)[:, None]
    y_off = row.to(tl.int64) * n
    tl.store(y_ptr + y_off[:, None] + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _load_tile(x_row, off, end, offs, HINTS: tl.constexpr):
    """x_row[off + offs] where in range, -inf elsewhere; with HINTS, kept in L2 for a second read."""
    idx = off + offs
    if HINTS:
        v = tl.load(x_row + idx, mask=idx < end, other=float("-inf"), eviction_policy="evict_last")
    else:
        v = tl.load(x_row + idx, mask=idx < end, other=float("-inf"))
    return v


@triton.jit
def _online_stats(x_row, start, end, R: tl.constexpr, C: tl.constexpr, HINTS: tl.constexpr,
                  PREFETCH: tl.constexpr):
    """(max, sum of exp(x - max)) of x_row[start:end], walked in tiles of R x C elements.

    Each of the C lanes keeps a running maximum and a sum scaled to it (an online softmax). The R
    values a lane gets per tile lie in one thread, so they are reduced first and the rescaling
    costs two exponentials per R elements: 1 + 2/R exponentials per element, no barrier in the
    loop. Lanes that saw only -inf keep m = -inf, s = 0. With PREFETCH the next tile is loaded
    before this one is reduced, so one program per SM keeps memory busy while it computes.
    """
    offs = tl.arange(0, R)[:, None] * C + tl.arange(0, C)[None, :]
    m_vec = tl.full([C], float("-inf"), tl.float32)
    s_vec = tl.zeros([C], tl.float32)
    if PREFETCH:
        nxt = _load_tile(x_row, start, end, offs, HINTS)
    for off in range(start, end, R * C):
        if PREFETCH:
            v = nxt
            nxt = _load_tile(x_row, off + R * C, end, offs, HINTS)  # past the end: all masked, no traffic
        else:
            v = _load_tile(x_row, off, end, offs, HINTS)
        v = v.to(tl.float32)
        m_new = tl.maximum(m_vec, tl.max(v, axis=0))
        base = tl.where(m_new == float("-inf"), 0.0, m_new)  # an all -inf lane adds exp(-inf) = 0
        e = tl.exp2((v - base[None, :]) * 1.4426950408889634)
        s_vec = s_vec * tl.exp2((m_vec - base) * 1.4426950408889634) + tl.sum(e, axis=0)
        m_vec = m_new
    m = tl.max(m_vec, axis=0)
    base = tl.where(m == float("-inf"), 0.0, m)
    return m, tl.sum(s_vec * tl.exp2((m_vec - base) * 1.4426950408889634), axis=0)


@triton.jit
def _load_last_use(x_row, off, end, offs, HINTS: tl.constexpr):
    """x_row[off + offs] where in range, 0 elsewhere; with HINTS, let L2 drop it first."""
    idx = off + offs
    if HINTS:
        v = tl.load(x_row + idx, mask=idx < end, other=0.0, eviction_policy="evict_first")
    else:
        v = tl.load(x_row + idx, mask=idx < end, other=0.0)
    return v


@triton.jit
def _write_segment(x_row, y_row, start, end, m, total, LOG: tl.constexpr, R: tl.constexpr, C: tl.constexpr,
                   REVERSE: tl.constexpr, HINTS: tl.constexpr, PREFETCH: tl.constexpr):
    """y_row[start:end] = softmax (or log_softmax) of x_row[start:end] given the row's max and sum.

    With REVERSE the tiles go last to first (those the first walk read last are the likeliest
    still in L2); with PREFETCH the next tile is loaded before this one is computed and stored.
    """
    offs = tl.arange(0, R)[:, None] * C + tl.arange(0, C)[None, :]
    steps = tl.cdiv(end - start, R * C)
    inv = 1.0 / total
    log_total = tl.log(total)
    if PREFETCH:
        if REVERSE:
            nxt = _load_last_use(x_row, start + (steps - 1) * (R * C), end, offs, HINTS)
        else:
            nxt = _load_last_use(x_row, start, end, offs, HINTS)
    for i in range(0, steps):
        if REVERSE:
            off = start + (steps - 1 - i) * (R * C)
        else:
            off = start + i * (R * C)
        if PREFETCH:
            v = nxt
            j = tl.minimum(i + 1, steps - 1)  # the last step reloads its own tile (cached), no overrun
            if REVERSE:
                nxt = _load_last_use(x_row, start + (steps - 1 - j) * (R * C), end, offs, HINTS)
            else:
                nxt = _load_last_use(x_row, start + j * (R * C), end, offs, HINTS)
        else:
            v = _load_last_use(x_row, off, end, offs, HINTS)
        shifted = v.to(tl.float32) - m
        if LOG:
            y = shifted - log_total
        else:
            y = tl.exp2(shifted * 1.4426950408889634) * inv
        idx = off + offs
        if HINTS:
            tl.store(y_row + idx, y.to(y_row.dtype.element_ty), mask=idx < end, eviction_policy="evict_first")
        else:
            tl.store(y_row + idx, y.to(y_row.dtype.element_ty), mask=idx < end)


@triton.jit
def _looped_kernel(x_ptr, y_ptr, rows, n, x_inner, x_so, x_si, LOG: tl.constexpr, R: tl.constexpr,
                   C: tl.constexpr, HINTS: tl.constexpr, PREFETCH: tl.constexpr):
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    for i in range(0, tl.cdiv(rows - pid, programs)):
        row = pid + i * programs
        x_row = x_ptr + _row_base(row, x_inner, x_so, x_si)
        y_row = y_ptr + row.to(tl.int64) * n
        m, total = _online_stats(x_row, 0, n, R, C, HINTS, PREFETCH)
        _write_segment(x_row, y_row, 0, n, m, total, LOG, R, C, True, HINTS, PREFETCH)


@triton.jit
def _split_stats_kernel(x_ptr, ws_ptr, n, splits, seg, x_inner, x_so, x_si, R: tl.constexpr, C: tl.constexpr,
                        PREFETCH: tl.constexpr):
    pid = tl.program_id(0)
    row = pid // splits
    start = (pid % splits) * seg
    x_row = x_ptr + _row_base(row, x_inner, x_so, x_si)
    m, total = _online_stats(x_row, start, tl.minimum(start + seg, n), R, C, False, PREFETCH)
    tl.store(ws_ptr + pid * 2, m)
    tl.store(ws_ptr + pid * 2 + 1, total)


@triton.jit
def _split_apply_kernel(x_ptr, y_ptr, ws_ptr, n, splits, seg, x_inner, x_so, x_si, LOG: tl.constexpr,
                        R: tl.constexpr, C: tl.constexpr, SPLITS: tl.constexpr, PREFETCH: tl.constexpr):
    pid = tl.program_id(0)
    row = pid // splits
    start = (pid % splits) * seg
    parts = tl.arange(0, SPLITS)
    ok = parts < splits
    part_ptr = ws_ptr + (row * splits + parts) * 2
    part_m = tl.load(part_ptr, mask=ok, other=float("-inf"))
    part_s = tl.load(part_ptr + 1, mask=ok, other=0.0)
    m = tl.max(part_m, axis=0)
    total = tl.sum(tl.where(part_m == float("-inf"), 0.0, part_s * tl.exp2((part_m - m) * 1.4426950408889634)),
                   axis=0)
    x_row = x_ptr + _row_base(row, x_inner, x_so, x_si)
    y_row = y_ptr + row.to(tl.int64) * n
    _write_segment(x_row, y_row, start, tl.minimum(start + seg, n), m, total, LOG, R, C, False, False, PREFETCH)


_tile = TritonLauncher(_tile_kernel)
_looped = TritonLauncher(_looped_kernel)
_split_stats = TritonLauncher(_split_stats_kernel)
_split_apply = TritonLauncher(_split_apply_kernel)


@functools.lru_cache(maxsize=None)
def sm_count(device_index: Optional[int]) -> int:
    """Multiprocessors of a CUDA device; a small stand-in under the interpreter (CPU tensors)."""
    if device_index is None or not torch.cuda.is_available():
        return 4
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _sms(x: torch.Tensor) -> int:
    return sm_count(x.device.index if x.device.type == "cuda" else None)


def _x_args(call: SoftmaxCall) -> tuple:
    """The x tensor and its row addressing, normalized so packed rows need no division."""
    x = call.x
    if call.problem.rows == 1:
        return x.tensor, 1, 0, 0
    if x.stride_outer == 0:  # one stride: row r starts at r * stride_inner
        return x.tensor, 1, x.stride_inner, 0
    return x.tensor, x.inner, x.stride_outer, x.stride_inner


def _key(x: torch.Tensor, *ints_and_config) -> tuple:
    """A launch key that fixes Triton's specialization of (x, a fresh output, ints, constexprs).

    Outputs and workspaces are fresh allocations, hence 16-byte aligned; x's alignment, dtype and
    device are keyed, and each integer by its specialization class (config values by value).
    """
    return (x.dtype, x.get_device(), x.data_ptr() & 15) + ints_and_config


def launch_tile(call: SoftmaxCall, block_m: int, block_n: int, num_warps: int) -> torch.Tensor:
    """Run the register-held kernel with BLOCK_M rows of BLOCK_N (>= N) columns per program."""
    p = call.problem
    x, inner, so, si = _x_args(call)
    y = alloc.empty_packed_like(x)
    key = _key(x, int_spec(p.rows), int_spec(p.n), int_spec(inner), int_spec(so), int_spec(si), p.is_log,
               block_m, block_n, num_warps)
    grid = (cdiv(p.rows, block_m),)
    tail = (p.rows, p.n, inner, so, si, p.is_log, block_m, block_n)
    _tile(grid, (x, y) + tail, num_warps=num_warps, key=key)
    if call.signature is not None:
        _offer_plan(_tile, key, call, grid[0], tail)
    return call.finish(y)


def _offer_plan(launcher: TritonLauncher, key: tuple, call: SoftmaxCall, grid_x: int, tail: tuple) -> None:
    """Leave a plan that repeats this launch for calls of the same signature (a packed x whose last
    dimension is normalized: only x's and the output's pointers change per call)."""
    x = call.x.tensor
    if call.signature in PLANS or x.data_ptr() & 15:  # declined before (another device), or unaligned
        return
    go = launcher.raw_launcher(key)
    if go is None:
        return
    index = x.get_device()
    empty_like = alloc.empty_packed_like

    def plan(x):
        xp = x.data_ptr()
        if xp & 15:
            return None
        y = empty_like(x)
        return y if go(grid_x, (xp, y.data_ptr()) + tail, index) else None

    PLANS.offer(call.signature, plan, "triton")


def launch_multirow(call: SoftmaxCall) -> torch.Tensor:
    return launch_tile(call, *multirow_config(call.problem.n, call.problem.dtype.itemsize))


def launch_row(call: SoftmaxCall) -> torch.Tensor:
    return launch_tile(call, *row_config(call.problem.n))


def tile_shape(chunk: int, num_warps: int, elem_size: int, cols: Optional[int] = None) -> tuple[int, int]:
    """(R, C) of a looped/split step of ``chunk`` elements: C lanes (one 16-byte vector per thread
    across all warps, so the R values of a lane stay in one thread) times R."""
    c = min(chunk, cols or (16 // elem_size) * 32 * num_warps)
    return chunk // c, c


def launch_looped(call: SoftmaxCall, chunk: Optional[int] = None, num_warps: Optional[int] = None,
                  ctas_per_sm: Optional[int] = None, hints: bool = True, prefetch: bool = True,
                  cols: Optional[int] = None, num_stages: int = 2) -> torch.Tensor:
    """Run the looped variant; the keyword arguments override its configuration (for tuning)."""
    p = call.problem
    x, inner, so, si = _x_args(call)
    y = alloc.empty_packed_like(x)
    default_chunk, default_warps = looped_config(x.element_size(), p.n)
    chunk = chunk or min(default_chunk, max(16, next_power_of_2(p.n)))
    num_warps = num_warps or min(default_warps, max(1, chunk // 512))
    r, c = tile_shape(chunk, num_warps, x.element_size(), cols)
    programs = min(p.rows, _sms(x) * (ctas_per_sm or LOOP_CTAS_PER_SM))
    key = _key(x, int_spec(p.rows), int_spec(p.n), int_spec(inner), int_spec(so), int_spec(si), p.is_log,
               r, c, hints, prefetch, num_warps, num_stages)
    tail = (p.rows, p.n, inner, so, si, p.is_log, r, c, hints, prefetch)
    _looped((programs,), (x, y) + tail, num_warps=num_warps, num_stages=num_stages, key=key)
    if call.signature is not None:
        _offer_plan(_looped, key, call, programs, tail)
    return call.finish(y)


def launch_split(call: SoftmaxCall, chunk: int = SPLIT_CHUNK, num_warps: Optional[int] = None,
                 splits: Optional[int] = None, prefetch: bool = True, cols: Optional[int] = None) -> torch.Tensor:
    """Run the two-kernel split variant; the keyword arguments override its configuration."""
    p = call.problem
    x, inner, so, si = _x_args(call)
    y = alloc.empty_packed_like(x)
    if splits is None:
        splits, seg = split_config(p.rows, p.n, _sms(x), chunk)
    else:
        seg = cdiv(cdiv(p.n, splits), chunk) * chunk
        splits = cdiv(p.n, seg)
    num_warps = num_warps or max(1, min(8, chunk // 512))
    r, c = tile_shape(chunk, num_warps, x.element_size(), cols)
    ws = torch.empty(p.rows * splits * 2, dtype=torch.float32, device=x.device)
    grid = (p.rows * splits,)
    ints = (int_spec(p.n), int_spec(splits), int_spec(seg), int_spec(inner), int_spec(so), int_spec(si))
    _split_stats(grid, (x, ws, p.n, splits, seg, inner, so, si, r, c, prefetch), num_warps=num_warps,
                 key=_key(x, *ints, r, c, prefetch, num_warps))
    parts = max(2, next_power_of_2(splits))
    _split_apply(grid, (x, y, ws, p.n, splits, seg, inner, so, si, p.is_log, r, c, parts, prefetch),
                 num_warps=num_warps, key=_key(x, *ints, p.is_log, r, c, parts, prefetch, num_warps))
    return call.finish(y)


def _dtype_reason(p: SoftmaxProblem) -> Optional[str]:
    reason = kernel_dtype_reason("triton", p.dtype)
    if reason:
        return reason
    if p.n > MAX_N or p.rows > MAX_ROWS:
        return f"{p.rows} rows x N={p.n}: N must be below 2**31 and rows below {MAX_ROWS}"
    return None


def supports_multirow(p: SoftmaxProblem) -> Optional[str]:
    return _dtype_reason(p) or (None if p.n <= MULTIROW_MAX_N else f"N={p.n} > {MULTIROW_MAX_N}")


def supports_row(p: SoftmaxProblem) -> Optional[str]:
    reason = _dtype_reason(p)
    if reason:
        return reason
    limit = ROW_MAX_N[p.dtype.itemsize]
    return None if p.n <= limit else f"N={p.n} > {limit}: a row this wide would spill registers"


def supports_split(p: SoftmaxProblem) -> Optional[str]:
    reason = _dtype_reason(p)
    if reason:
        return reason
    if not p.few_rows:
        return f"{p.rows} rows are enough to keep the GPU busy with one program per row"
    limit = ROW_MAX_N[p.dtype.itemsize]
    return None if p.n > limit else f"N={p.n} <= {limit}: a row fits one program"


def supports_looped(p: SoftmaxProblem) -> Optional[str]:
    return _dtype_reason(p)


VARIANTS = (
    ("multirow", supports_multirow, launch_multirow, "several narrow rows per program, held in registers"),
    ("row", supports_row, launch_row, "one row per program, held in registers"),
    ("split", supports_split, launch_split, "few long rows: segments in parallel, partials merged"),
    ("looped", supports_looped, launch_looped, "online max and sum, rows walked in chunks (any N)"),
)
