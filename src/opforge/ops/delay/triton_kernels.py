"""The Triton kernel of apply_delay and revert_delay.

Program (b, time block, codebook block) loads the block's delays once, computes each element's
source time ``t - sign * d_c``, gathers the codes where it lies in ``[0, T)`` (the load is
masked elsewhere: no read out of bounds) and writes the fill ids in the rest. Input and output
are addressed through their strides, so strided views run in place. Delays are read from the
device: no index tensor is built on the host and nothing synchronizes.
"""
from __future__ import annotations

from typing import Optional

import triton
import triton.language as tl

from ...runtime import alloc
from ...runtime.launch import TritonLauncher, cdiv, next_power_of_2
from .problem import DelayCall, DelayProblem

TILE = 4096      # elements per program
MAX_C_BLOCK = 64


@triton.jit
def _delay_kernel(codes_ptr, delays_ptr, out_ptr, T, C, t_blocks, scb, sct, scc, sob, sot, soc,
                  fill_before, fill_after, SIGN: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr):
    pid = tl.program_id(0)
    b = (pid // t_blocks).to(tl.int64)
    t = (pid % t_blocks) * BT + tl.arange(0, BT)
    c = tl.program_id(1) * BC + tl.arange(0, BC)
    cm = c < C
    d = tl.load(delays_ptr + c, mask=cm, other=0).to(tl.int64)
    src = t.to(tl.int64)[:, None] - SIGN * d[None, :]
    live = (t < T)[:, None] & cm[None, :]
    inside = (src >= 0) & (src < T)
    c64 = c.to(tl.int64)[None, :]
    x = tl.load(codes_ptr + (b * scb + src * sct + c64 * scc), mask=live & inside, other=0)
    y = tl.where(inside, x, tl.where(src < 0, fill_before, fill_after))
    tl.store(out_ptr + (b * sob + t.to(tl.int64)[:, None] * sot + c64 * soc), y.to(out_ptr.dtype.element_ty),
             mask=live)


_delay = TritonLauncher(_delay_kernel)


def block_config(t: int, c: int) -> tuple[int, int]:
    """(BT, BC): codebooks per program (all of them up to 64), then as many time steps as fit a tile."""
    bc = min(MAX_C_BLOCK, next_power_of_2(c))
    bt = max(1, min(next_power_of_2(t), TILE // bc))
    return bt, bc


def launch(call: DelayCall):
    codes = call.codes
    out = call.out if call.out is not None else alloc.empty(codes.shape, codes.dtype, codes.device)
    b, t, c = codes.shape
    bt, bc = block_config(t, c)
    t_blocks = cdiv(t, bt)
    sign = 1 if call.problem.op == "apply_delay" else -1
    _delay((b * t_blocks, cdiv(c, bc)),
           (codes, call.delays, out, t, c, t_blocks, *codes.stride(), *out.stride(),
            call.fill_before, call.fill_after, sign, bt, bc),
           num_warps=max(1, min(8, bt * bc // 512)))
    return out


def supports(p: DelayProblem) -> Optional[str]:
    return None


VARIANTS = (("gather", supports, launch, "one program per time block and codebook block, masked gather"),)
