"""The Triton kernel of apply_delay and revert_delay.

Program (b, block) walks a block of one sequence's (T, C) plane as flat indices ``t * C + c``
(no lanes wasted on a small C such as Dia's 9), computes each element's source time
``t - sign * d_c`` (delays gathered per element; they stay in L1), gathers the codes where it
lies in ``[0, T)`` (the load is masked elsewhere: no read out of bounds) and writes the fill ids
in the rest. Input and output are addressed through their strides, so strided views run in
place. Delays are read from the device: no index tensor is built on the host and nothing
synchronizes.
"""
from __future__ import annotations

from typing import Optional

import triton
import triton.language as tl

from ...runtime import alloc, plans
from ...runtime.lru import LRU
from ...runtime.triton.launch import I32_MAX, TritonLauncher, cdiv, int_spec, next_power_of_2
from .problem import DelayCall, DelayProblem

BLOCK = 2048     # elements of one sequence's (T, C) plane per program
WIDE_FROM = 2**31   # planes (plus a block) from this size index in 64 bits


@triton.jit
def _delay_kernel(codes_ptr, delays_ptr, out_ptr, T, C, plane, blocks, scb, sct, scc, sob, sot, soc,
                  fill_before, fill_after, SIGN: tl.constexpr, BLOCK: tl.constexpr, OUT_PACKED: tl.constexpr,
                  WIDE: tl.constexpr):
    pid = tl.program_id(0)
    b = (pid // blocks).to(tl.int64)
    if WIDE:   # a plane of 2**31 elements or more: 64-bit index math (slower divisions)
        e = (pid % blocks).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    else:
        e = (pid % blocks) * BLOCK + tl.arange(0, BLOCK)   # flat index t * C + c in the plane
    live = e < plane
    t = e // C
    c = e - t * C
    d = tl.load(delays_ptr + c, mask=live, other=0).to(e.dtype)
    src = t - SIGN * d
    inside = (src >= 0) & (src < T)
    x = tl.load(codes_ptr + (b * scb + src.to(tl.int64) * sct + c.to(tl.int64) * scc), mask=live & inside, other=0)
    y = tl.where(inside, x, tl.where(src < 0, fill_before, fill_after))
    if OUT_PACKED:
        dst = b * plane + e.to(tl.int64)   # plane (T * C) is its own argument: Triton sees its alignment
    else:
        dst = b * sob + t.to(tl.int64) * sot + c.to(tl.int64) * soc
    tl.store(out_ptr + dst, y.to(out_ptr.dtype.element_ty), mask=live)


_delay = TritonLauncher(_delay_kernel)


def _fill_spec(v: int) -> tuple:
    return (v == 1, v & 15 == 0, -I32_MAX - 1 <= v <= I32_MAX)


_launch_args: LRU[tuple, tuple] = LRU(4096, "delay.launch_plans")


def _plan(op: str, shape: tuple, cs: tuple, os_: tuple, packed: bool, fb: int, fa: int) -> tuple:
    """(grid, scalar and constexpr arguments, the part of the launch key they decide, num_warps)."""
    b, t, c = shape
    plane = t * c
    block = max(16, min(BLOCK, next_power_of_2(plane)))
    blocks = cdiv(plane, block)
    sign = 1 if op == "apply_delay" else -1
    wide, warps = plane + block >= WIDE_FROM, max(1, min(8, block // 256))
    scalars = (t, c, plane, blocks, *cs, *os_, fb, fa, sign, block, packed, wide)
    # what Triton specializes on besides the tensors: ints equal to 1 / divisible by 16 / beyond
    # int32 (the fill ids may be negative: their own class), and the constexprs
    key = (tuple(map(int_spec, (t, c, plane, blocks) + cs + os_)), _fill_spec(fb), _fill_spec(fa),
           sign, block, packed, wide, warps)
    return (b * blocks,), scalars, key, warps


def launch(call: DelayCall):
    codes, delays, out = call.codes, call.delays, call.out
    # a new out's strides follow from codes' (the signature decides them): None stands for them
    sig = (call.problem.op, codes.shape, codes.stride(), None if out is None else out.stride(), codes.dtype,
           delays.dtype, codes.device, call.fill_before, call.fill_after)
    if out is None:
        out = alloc.empty_packed_like(codes)
    # with launch plans off (OPFORGE_PLANS=0) every call computes its launch arguments afresh
    keep = plans.enabled()
    plan = _launch_args.get(sig) if keep else None
    if plan is None:
        grid, scalars, key, warps = _plan(call.problem.op, tuple(codes.shape), codes.stride(), out.stride(),
                                          out.is_contiguous(), call.fill_before, call.fill_after)
        index = codes.get_device()
        plan = (grid, list(scalars), (index, codes.dtype, delays.dtype) + key, warps, index)
        if keep:
            _launch_args.put(sig, plan)
    grid, scalars, key0, warps, index = plan
    tensors = (codes, delays, out)
    ptrs = [codes.data_ptr(), delays.data_ptr(), out.data_ptr()]
    key = key0 + (ptrs[0] & 15, ptrs[1] & 15, ptrs[2] & 15)
    if not _delay.launch_raw(key, grid, ptrs + scalars, warps, index):
        _delay(grid, tensors + tuple(scalars), num_warps=warps, key=key)
    return out


def supports(p: DelayProblem) -> Optional[str]:
    return None


VARIANTS = (("gather", supports, launch, "one program per block of a sequence's flat (T, C) plane, masked gather"),)
