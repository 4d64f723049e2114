"""The ``row_split`` norm variant: one wide row held in the registers of several programs.

A row of N values is cut into ``segs = cdiv(N, BLOCK)`` segments, one program each. A program
loads its segment once, reduces it to partial statistics, publishes them to a small workspace
and waits (a per-row counter in global memory) until every segment of its row has published;
it then combines the partials, normalizes the segment still in its registers and stores it.
The row moves through global memory exactly once each way (a looped program reads it twice),
and the programs are short, so the last wave of a launch leaves little of the GPU idle.

Layer norm's partials are (shift, sum(x - shift), sum((x - shift)^2)) with shift = the
segment's own mean: for clustered rows (1e4 + randn) ``x - shift`` is exact. They are
combined around segment 0's shift (Chan's pairwise update), and each program normalizes
``(x - shift) - (mean - shift)``, both small, so float32 keeps the precision the other variants
keep. RMS norm's partial is the sum of squares.

Waiting on other programs is safe because programs take their segment by ticket (an atomic
counter, in the order they actually start), not by program id: all segments of a row with a
lower ticket than a running program's have started, so at most one row can be waiting for a
segment not yet started, and that segment starts as soon as any other program finishes.
Counters go back to zero inside the launch (the last program of a row resets its row's counter,
the last ticket resets the ticket counter), so one zeroed workspace per device and stream
serves every launch, CUDA graph replays included.

Triton's interpreter runs programs one after another, where a wait could never end: there a
first launch (``PUBLISH_ONLY``) publishes every segment's partials, and the second launch finds
its row complete and counts one more round before resetting.

Off by default: ``ROW_SPLIT`` (op, element size, N rounded up to a power of two) ->
(BLOCK, num_warps) lists where it is selected; empty until measured on a GPU
(``benchmarks/tools/wide_row_tune.py`` prints the entries that win).
"""
from __future__ import annotations

import functools
from typing import Optional

import torch
import triton
import triton.language as tl

from ...runtime import alloc
from ...runtime.errors import kernel_dtype_reason
from ...runtime.switches import triton_interpreting
from ...runtime.triton import pdl
from ...runtime.triton.launch import TritonLauncher, cdiv, next_power_of_2
from .problem import NormCall, NormProblem

#: Where ``row_split`` is selected: (op, element size, N rounded up to a power of two) ->
#: (BLOCK, num_warps). Empty: not yet measured on a GPU.
ROW_SPLIT: dict[tuple[str, int, int], tuple[int, int]] = {}

MIN_N = 4096         # narrower rows fit one program (``row``/``multirow``)
MIN_ROWS = 64        # fewer rows: host time decides, and the other variants leave launch plans (this one not yet)
MAX_SEGS = 64        # segments per row at most (partials are combined in a vector of 16 or 64: few compiles)


@triton.jit
def _row_offsets(row, inner, stride_outer, stride_inner):
    return (row // inner) * stride_outer + (row % inner) * stride_inner


@triton.jit
def take_ticket(cnt_ptr, units):
    """This program's unit of work, numbered in the order programs start; the last ticket of the
    launch puts the counter back to zero."""
    ticket = tl.atomic_add(cnt_ptr, 1, sem="relaxed")
    if ticket == units - 1:
        tl.atomic_xchg(cnt_ptr, 0, sem="relaxed")
    return ticket


@triton.jit
def arrive(row_cnt_ptr):
    """Count this program's partials as published (after every thread's stores)."""
    tl.debug_barrier()
    tl.atomic_add(row_cnt_ptr, 1, sem="release")


@triton.jit
def wait_for_row(row_cnt_ptr, segs):
    """Wait until all ``segs`` programs of this row have arrived; their partials are then visible."""
    seen = tl.atomic_add(row_cnt_ptr, 0, sem="acquire")
    while seen < segs:
        seen = tl.atomic_add(row_cnt_ptr, 0, sem="acquire")
    tl.debug_barrier()


@triton.jit
def leave(row_cnt_ptr, reset_at):
    """Count this program out of its row; the last one out resets the row's counter to zero."""
    left = tl.atomic_add(row_cnt_ptr, 1, sem="relaxed")
    if left == reset_at:
        tl.atomic_xchg(row_cnt_ptr, 0, sem="relaxed")


@triton.jit(do_not_specialize=["rows", "x_inner", "r_inner", "units", "reset_at"])
def _row_split_kernel(x_ptr, r_ptr, y_ptr, s_ptr, w_ptr, b_ptr, part_ptr, cnt_ptr, rows, n,
                      x_inner, x_so, x_si, r_inner, r_so, r_si, eps, units, reset_at,
                      IS_RMS: tl.constexpr, HAS_RES: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr,
                      BLOCK: tl.constexpr, SEGS_P2: tl.constexpr, TICKETS: tl.constexpr,
                      PUBLISH_ONLY: tl.constexpr, PDL: tl.constexpr = False):
    pdl.wait_for_previous(PDL)
    segs = tl.cdiv(n, BLOCK)
    if TICKETS:
        ticket = take_ticket(cnt_ptr, units)
    else:  # the program id: no atomic before the loads, but relies on programs starting in id order
        ticket = tl.program_id(0)
    row = (ticket // segs).to(tl.int64)
    seg = ticket % segs
    cols = seg * BLOCK + tl.arange(0, BLOCK)
    ok = cols < n
    out_off = row * n + cols
    v = tl.load(x_ptr + _row_offsets(row, x_inner, x_so, x_si) + cols, mask=ok, other=0.0).to(tl.float32)
    if HAS_RES:
        v += tl.load(r_ptr + _row_offsets(row, r_inner, r_so, r_si) + cols, mask=ok, other=0.0).to(tl.float32)
        total = v.to(s_ptr.dtype.element_ty)
        if not PUBLISH_ONLY:
            tl.store(s_ptr + out_off, total, mask=ok)
        v = total.to(tl.float32)
    part = part_ptr + ticket.to(tl.int64) * 3
    if IS_RMS:
        tl.store(part, tl.sum(v * v, axis=0))
    else:
        count = tl.minimum(n - seg * BLOCK, BLOCK).to(tl.float32)
        shift = tl.sum(v, axis=0) / count
        d = tl.where(ok, v - shift, 0.0)
        tl.store(part, shift)
        tl.store(part + 1, tl.sum(d, axis=0))
        tl.store(part + 2, tl.sum(d * d, axis=0))
    row_cnt = cnt_ptr + 1 + row
    arrive(row_cnt)
    if not PUBLISH_ONLY:
        wait_for_row(row_cnt, segs)
        k = tl.arange(0, SEGS_P2)
        k_ok = k < segs
        parts = part_ptr + (row * segs + k) * 3
        if IS_RMS:
            sum_sq = tl.sum(tl.load(parts, mask=k_ok, other=0.0, cache_modifier=".cg"), axis=0)
            y = v * tl.rsqrt(sum_sq / n + eps)
        else:
            k_shift = tl.load(parts, mask=k_ok, other=0.0, cache_modifier=".cg")
            k_s1 = tl.load(parts + 1, mask=k_ok, other=0.0, cache_modifier=".cg")
            k_s2 = tl.load(parts + 2, mask=k_ok, other=0.0, cache_modifier=".cg")
            k_count = tl.maximum(tl.minimum(n - k * BLOCK, BLOCK), 1).to(tl.float32)
            shift0 = tl.sum(tl.where(k == 0, k_shift, 0.0), axis=0)
            # each segment's mean, less shift0: exact differences of close shifts plus small means
            k_mean = tl.where(k_ok, (k_shift - shift0) + k_s1 / k_count, 0.0)
            mean = tl.sum(k_mean * k_count, axis=0) / n
            k_dev = k_mean - mean
            m2 = tl.sum(tl.where(k_ok, (k_s2 - k_s1 * k_s1 / k_count) + k_count * k_dev * k_dev, 0.0), axis=0)
            rstd = tl.rsqrt(tl.maximum(m2, 0.0) / n + eps)
            # (x - shift) - (row mean - shift), row mean = shift0 + mean
            y = (d - ((shift0 - shift) + mean)) * rstd
        if HAS_W:
            y *= tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32)
        if HAS_B:
            y += tl.load(b_ptr + cols, mask=ok, other=0.0).to(tl.float32)
        tl.store(y_ptr + out_off, y.to(y_ptr.dtype.element_ty), mask=ok)
        leave(row_cnt, reset_at)


_row_split = TritonLauncher(_row_split_kernel)


class Workspace:
    """Zeroed int32 counters (the ticket, then one per row) per device and stream, grown on
    demand; the kernel leaves them at zero. Two streams never share counters."""

    def __init__(self) -> None:
        self._counters: dict[tuple, torch.Tensor] = {}

    def counters(self, device: torch.device, rows: int) -> torch.Tensor:
        stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
        key = (device.type, device.index, stream)
        buf = self._counters.get(key)
        if buf is None or buf.numel() < rows + 1:
            buf = torch.zeros(max(rows + 1, 2 * (buf.numel() if buf is not None else 0), 1024),
                              dtype=torch.int32, device=device)
            self._counters[key] = buf
        return buf


WORKSPACE = Workspace()


@functools.lru_cache(maxsize=None)
def row_split_config(op: str, itemsize: int, n: int) -> Optional[tuple[int, int]]:
    """(BLOCK, num_warps) where ``ROW_SPLIT`` turns the variant on for this op, dtype and N, else None.

    Example:
        >>> row_split_config("layer_norm", 2, 65536) is None or len(row_split_config("layer_norm", 2, 65536)) == 2
        True
    """
    return ROW_SPLIT.get((op, itemsize, next_power_of_2(n)))


def launch_row_split(call: NormCall, block: Optional[int] = None, num_warps: Optional[int] = None,
                     tickets: bool = True):
    """Run the variant; ``block`` and ``num_warps`` override ``ROW_SPLIT`` (for tuning and tests).

    ``tickets=False`` numbers segments by program id instead of by ticket: one atomic less before
    a program's loads, but a row's wait then relies on the GPU starting programs in id order, which
    CUDA does not promise (measured as a candidate only)."""
    p = call.problem
    if block is None or num_warps is None:
        block, num_warps = row_split_config(p.op, p.dtype.itemsize, p.n)
    segs = cdiv(p.n, block)
    if segs > MAX_SEGS:
        raise ValueError(f"row_split: N={p.n} in blocks of {block} is {segs} segments, more than {MAX_SEGS}")
    x, r = call.x, call.residual or call.x
    w, b = call.weight, call.bias
    xt = x.tensor
    y = alloc.empty_packed_like(xt)
    s = alloc.empty_packed_like(xt) if p.has_residual else None
    units = p.rows * segs
    parts = torch.empty(units * 3, dtype=torch.float32, device=xt.device)
    counters = WORKSPACE.counters(xt.device, p.rows)
    interpreted = triton_interpreting() or xt.device.type == "cpu"
    head = (xt, r.tensor, y, s if s is not None else y, w if w is not None else y, b if b is not None else y,
            parts, counters, p.rows, p.n, x.inner, x.stride_outer, x.stride_inner, r.inner, r.stride_outer,
            r.stride_inner, call.eps, units)
    flags = (p.is_rms, p.has_residual, w is not None, b is not None, block, 16 if segs <= 16 else MAX_SEGS,
             tickets)
    use_pdl = pdl.on(xt.device)
    if interpreted:  # programs run one at a time: publish every partial first (see the module doc)
        _row_split((units,), head + (3 * segs - 1,) + flags + (True, use_pdl), num_warps=num_warps)
    _row_split((units,), head + ((3 if interpreted else 2) * segs - 1,) + flags + (False, use_pdl),
               num_warps=num_warps)
    return (y, s) if s is not None else y


def supports_row_split(p: NormProblem) -> Optional[str]:
    reason = kernel_dtype_reason("triton", p.dtype)
    if reason:
        return reason
    if p.n < MIN_N:
        return f"N={p.n} < {MIN_N}: one program holds the row"
    if p.rows < MIN_ROWS:
        return f"{p.rows} rows < {MIN_ROWS}: the launch's host time decides (no launch plan here yet)"
    if row_split_config(p.op, p.dtype.itemsize, p.n) is None:
        return f"off for {p.op} at N={p.n} ({p.dtype.itemsize}-byte elements): not measured (ROW_SPLIT)"
    return None
