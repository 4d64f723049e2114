"""The ``row_split`` softmax variant: one wide row held in the registers of several programs.

A row of N logits is cut into ``segs = cdiv(N, BLOCK)`` segments, one program each. A program
loads its segment once, reduces it to (max, sum of exp(x - max)), publishes the pair to a
small workspace and waits (a per-row counter in global memory) until every segment of its row
has published; it then merges the pairs into the row's maximum and sum and writes its segment
from the exponentials still in its registers. The row moves through global memory exactly once
each way (``looped`` reads it twice, ``split`` launches twice and re-reads it), and the programs
are short, so the last wave of a launch leaves little of the GPU idle.

Waiting on other programs is safe because programs take their segment by ticket (an atomic
counter, in the order they actually start), not by program id: all segments of a row with a
lower ticket than a running program's have started, so at most one row can be waiting for a
segment not yet started, and that segment starts as soon as any other program finishes.
Counters go back to zero inside the launch, so one zeroed workspace per device and stream serves
every launch, CUDA graph replays included. Under Triton's interpreter (programs run one after
another) a first ``PUBLISH_ONLY`` launch publishes every pair, and the second finds its rows
complete.

Off by default: ``ROW_SPLIT`` ((op, element size, N rounded up to a power of two) ->
(BLOCK, num_warps)) lists where it is selected; empty until measured on a GPU
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
from ...runtime.triton.launch import TritonLauncher, cdiv, next_power_of_2
from .problem import MAX_ROWS, SoftmaxCall, SoftmaxProblem

#: Where ``row_split`` is selected: (op, element size, N rounded up to a power of two) ->
#: (BLOCK, num_warps). Empty: not yet measured on a GPU.
ROW_SPLIT: dict[tuple[str, int, int], tuple[int, int]] = {}

MIN_N = 4096         # narrower rows fit one program (``row``/``multirow``)
MAX_SEGS = 64        # segments per row at most (pairs are merged in a vector of 16 or 64: few compiles)
LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def _row_base(row, inner, stride_outer, stride_inner):
    """Element offset of row ``row`` (int32): divided in 32 bits, addressed in 64."""
    return (row // inner).to(tl.int64) * stride_outer + (row % inner).to(tl.int64) * stride_inner


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
    """Count this program's pair as published (after every thread's stores)."""
    tl.debug_barrier()
    tl.atomic_add(row_cnt_ptr, 1, sem="release")


@triton.jit
def wait_for_row(row_cnt_ptr, segs):
    """Wait until all ``segs`` programs of this row have arrived; their pairs are then visible."""
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


@triton.jit(do_not_specialize=["x_inner", "units", "reset_at"])
def _row_split_kernel(x_ptr, y_ptr, part_ptr, cnt_ptr, n, x_inner, x_so, x_si, units, reset_at,
                      LOG: tl.constexpr, BLOCK: tl.constexpr, SEGS_P2: tl.constexpr, TICKETS: tl.constexpr,
                      PUBLISH_ONLY: tl.constexpr):
    segs = tl.cdiv(n, BLOCK)
    if TICKETS:
        ticket = take_ticket(cnt_ptr, units)
    else:  # the program id: no atomic before the loads, but relies on programs starting in id order
        ticket = tl.program_id(0)
    row = ticket // segs
    seg = ticket % segs
    cols = seg * BLOCK + tl.arange(0, BLOCK)
    ok = cols < n
    x_row = x_ptr + _row_base(row, x_inner, x_so, x_si)
    v = tl.load(x_row + cols, mask=ok, other=float("-inf")).to(tl.float32)
    m = tl.max(v, axis=0)
    base = tl.where(m == float("-inf"), 0.0, m)  # an all -inf segment adds exp(-inf) = 0
    e = tl.exp2((v - base) * LOG2E)
    part = part_ptr + ticket.to(tl.int64) * 2
    tl.store(part, m)
    tl.store(part + 1, tl.sum(e, axis=0))
    row_cnt = cnt_ptr + 1 + row
    arrive(row_cnt)
    if not PUBLISH_ONLY:
        wait_for_row(row_cnt, segs)
        k = tl.arange(0, SEGS_P2)
        k_ok = k < segs
        parts = part_ptr + (row.to(tl.int64) * segs + k) * 2
        k_m = tl.load(parts, mask=k_ok, other=float("-inf"), cache_modifier=".cg")
        k_s = tl.load(parts + 1, mask=k_ok, other=0.0, cache_modifier=".cg")
        row_m = tl.max(k_m, axis=0)
        row_base = tl.where(row_m == float("-inf"), 0.0, row_m)
        total = tl.sum(tl.where(k_m == float("-inf"), 0.0, k_s * tl.exp2((k_m - row_base) * LOG2E)), axis=0)
        if LOG:
            y = (v - row_m) - tl.log(total)
        else:  # exp(x - row max) / total, from this segment's exp(x - base)
            y = e * (tl.exp2((base - row_base) * LOG2E) / total)
        tl.store(y_ptr + row.to(tl.int64) * n + cols, y.to(y_ptr.dtype.element_ty), mask=ok)
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
        >>> row_split_config("softmax", 2, 65536) is None or len(row_split_config("softmax", 2, 65536)) == 2
        True
    """
    return ROW_SPLIT.get((op, itemsize, next_power_of_2(n)))


def _x_args(call: SoftmaxCall) -> tuple:
    """The x tensor and its row addressing, normalized so packed rows need no division."""
    x = call.x
    if call.problem.rows == 1:
        return x.tensor, 1, 0, 0
    if x.stride_outer == 0:  # one stride: row r starts at r * stride_inner
        return x.tensor, 1, x.stride_inner, 0
    return x.tensor, x.inner, x.stride_outer, x.stride_inner


def launch_row_split(call: SoftmaxCall, block: Optional[int] = None, num_warps: Optional[int] = None,
                     tickets: bool = True) -> torch.Tensor:
    """Run the variant; ``block`` and ``num_warps`` override ``ROW_SPLIT`` (for tuning and tests).

    ``tickets=False`` numbers segments by program id instead of by ticket: one atomic less before
    a program's loads, but a row's wait then relies on the GPU starting programs in id order, which
    CUDA does not promise (measured as a candidate only)."""
    p = call.problem
    if block is None or num_warps is None:
        block, num_warps = row_split_config(p.op, p.dtype.itemsize, p.n)
    segs = cdiv(p.n, block)
    if segs > MAX_SEGS or p.rows * segs > MAX_ROWS:
        raise ValueError(f"row_split: {p.rows} rows x N={p.n} in blocks of {block} is {segs} segments per row; "
                         f"at most {MAX_SEGS} per row and {MAX_ROWS} in all")
    x, inner, so, si = _x_args(call)
    y = alloc.empty_packed_like(x)
    units = p.rows * segs
    parts = torch.empty(units * 2, dtype=torch.float32, device=x.device)
    counters = WORKSPACE.counters(x.device, p.rows)
    interpreted = triton_interpreting() or x.device.type == "cpu"
    head = (x, y, parts, counters, p.n, inner, so, si, units)
    flags = (p.is_log, block, 16 if segs <= 16 else MAX_SEGS, tickets)
    if interpreted:  # programs run one at a time: publish every pair first (see the module doc)
        _row_split((units,), head + (3 * segs - 1,) + flags + (True,), num_warps=num_warps)
    _row_split((units,), head + ((3 if interpreted else 2) * segs - 1,) + flags + (False,), num_warps=num_warps)
    return call.finish(y)


def supports_row_split(p: SoftmaxProblem) -> Optional[str]:
    reason = kernel_dtype_reason("triton", p.dtype)
    if reason:
        return reason
    if p.n < MIN_N:
        return f"N={p.n} < {MIN_N}: one program holds the row"
    if p.few_rows:
        return f"{p.rows} rows: ``split`` spreads so few rows over more programs"
    if row_split_config(p.op, p.dtype.itemsize, p.n) is None:
        return f"off for {p.op} at N={p.n} ({p.dtype.itemsize}-byte elements): not measured (ROW_SPLIT)"
    return None
