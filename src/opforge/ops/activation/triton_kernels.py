"""The Triton kernel for gelu, silu, relu, swiglu and geglu.

One pointwise kernel serves every activation and layout: a program loads BLOCK consecutive
elements of one row of each input (16-byte vector loads where the addresses allow), applies the
activation in float32, multiplies by ``up`` for the gated forms, and stores once in the output
dtype. A flat or dense tensor is one long row; strided rows (``big[:, :N]``) are addressed as
``(r // inner) * stride_outer + (r % inner) * stride_inner``, so they run in place.

The formulas are those of ``reference.py``, rearranged to stay accurate in float32 where the
textbook forms cancel: exact GELU is ``0.5 * x * erfc(-x / sqrt(2))`` (``1 + erf(z)`` loses
every digit for x below about -4), with erfc from a fitted rational-exponential form accurate
to 1.1e-7; the tanh form is ``0.5 * x * (1 + tanh(u)) == x * sigmoid(2u) == x / (1 + exp(-2u))``;
SiLU is ``x / (1 + exp(-x))``. One exponential each.
"""
from __future__ import annotations

from typing import Optional

import triton
import triton.language as tl

from ...runtime import alloc
from ...runtime.triton import pdl
from ...runtime.errors import kernel_dtype_reason
from ...runtime.triton.launch import TritonLauncher, cdiv, int_spec
from .config import block_config
from .problem import GATED, PLANS, ActivationCall, ActivationProblem

GELU, GELU_TANH, SILU, RELU = 0, 1, 2, 3


@triton.jit
def _row_base(row, inner, stride_outer, stride_inner):
    return (row // inner).to(tl.int64) * stride_outer + (row % inner).to(tl.int64) * stride_inner


@triton.jit
def _erfc_abs(z):
    """erfc(|z|) within 1.1e-7 relative, for every z (Chebyshev fit from Numerical Recipes, 6.2)."""
    a = tl.abs(z)
    t = 1.0 / (1.0 + 0.5 * a)
    p = 0.17087277
    p = p * t - 0.82215223
    p = p * t + 1.48851587
    p = p * t - 1.13520398
    p = p * t + 0.27886807
    p = p * t - 0.18628806
    p = p * t + 0.09678418
    p = p * t + 0.37409196
    p = p * t + 1.00002368
    return t * tl.exp(t * p - a * a - 1.26551223)


@triton.jit
def _activate(v, ACT: tl.constexpr):
    if ACT == 0:    # GELU, exact, as 0.5 * x * erfc(-x / sqrt(2)): no cancellation for x << 0
        e = _erfc_abs(v * 0.7071067811865476)
        y = v * tl.where(v >= 0.0, 1.0 - 0.5 * e, 0.5 * e)
    elif ACT == 1:  # GELU, tanh form: x * sigmoid(2u), u = sqrt(2/pi) * (x + 0.044715 x^3)
        u = 0.7978845608028654 * (v + 0.044715 * v * v * v)
        y = v / (1.0 + tl.exp(-2.0 * u))
    elif ACT == 2:  # SiLU
        y = v / (1.0 + tl.exp(-v))
    else:           # ReLU (NaN stays NaN)
        y = tl.where(v < 0.0, 0.0, v)
    return y


@triton.jit
def _pointwise_kernel(x_ptr, u_ptr, y_ptr, n, blocks, x_inner, x_so, x_si, u_inner, u_so, u_si,
                      ACT: tl.constexpr, GATED: tl.constexpr, BLOCK: tl.constexpr, WIDE: tl.constexpr,
                      PDL: tl.constexpr = False):
    pdl.wait_for_previous(PDL)
    pid = tl.program_id(0)
    row = pid // blocks
    if WIDE:
        start = (pid % blocks).to(tl.int64) * BLOCK
    else:
        start = (pid % blocks) * BLOCK
    cols = tl.arange(0, BLOCK)
    ok = cols < n - start
    v = tl.load(x_ptr + (_row_base(row, x_inner, x_so, x_si) + start) + cols, mask=ok, other=0.0)
    y = _activate(v.to(tl.float32), ACT)
    if GATED:
        u = tl.load(u_ptr + (_row_base(row, u_inner, u_so, u_si) + start) + cols, mask=ok, other=0.0)
        y = y * u.to(tl.float32)
    tl.store(y_ptr + (row.to(tl.int64) * n + start) + cols, y.to(y_ptr.dtype.element_ty), mask=ok)


_pointwise = TritonLauncher(_pointwise_kernel)


def _act_code(op: str, approximate: Optional[str]) -> int:
    if op in ("gelu", "geglu"):
        return GELU_TANH if approximate == "tanh" else GELU
    return SILU if op in ("silu", "swiglu") else RELU


def _addressing(r) -> tuple[int, int, int]:
    if r.stride_outer == 0:  # one stride (or one row): row r starts at r * stride_inner
        return 1, r.stride_inner, 0
    return r.inner, r.stride_outer, r.stride_inner


def launch_pointwise(call: ActivationCall, block: Optional[int] = None, num_warps: Optional[int] = None):
    """Run the pointwise kernel; ``block`` and ``num_warps`` override the configuration (for tuning)."""
    p = call.problem
    x_rows = call.rows[0]
    u_rows = call.rows[1] if p.gated else x_rows
    x, u = x_rows.tensor, u_rows.tensor
    layout = call.layout
    if layout == "flat":
        n, rows = p.numel, 1
        y = alloc.empty_packed_like(x)
    elif layout == "dense":
        n, rows = p.numel, 1
        y = alloc.empty((p.numel,), x.dtype, x.device).as_strided(p.shape, x.stride())
    else:
        n = p.shape[-1]
        rows = p.numel // n
        y = alloc.empty(p.shape, x.dtype, x.device)
    default_block, default_warps = block_config(n, x.element_size())
    block = block or default_block
    num_warps = num_warps or (default_warps if block == default_block else max(1, min(16, block // 512)))
    blocks = cdiv(n, block)
    xa = (1, 0, 0) if rows == 1 else _addressing(x_rows)
    ua = (1, 0, 0) if rows == 1 else _addressing(u_rows)
    act = _act_code(p.op, p.approximate)
    wide = n + block >= 2**31
    dependent = pdl.on(x.device)
    # The output is fresh (16-byte aligned); every other argument's specialization is keyed.
    key = (x.dtype, x.get_device(), x.data_ptr() & 15, u.data_ptr() & 15, int_spec(n), int_spec(blocks),
           xa if rows == 1 else tuple(map(int_spec, xa + ua)), act, p.gated, block, wide, num_warps, dependent)
    tail = (n, blocks, *xa, *ua, act, p.gated, block, wide, dependent)
    _pointwise((rows * blocks,), (x, u, y) + tail, num_warps=num_warps, key=key)
    if call.signature is not None and layout == "flat":
        _offer_plan(key, call, rows * blocks, tail)
    return y


def _offer_plan(key: tuple, call: ActivationCall, grid_x: int, tail: tuple) -> None:
    """Leave a plan that repeats this launch for calls of the same signature (packed inputs: only
    the pointers change per call)."""
    x, u = call.x, call.up
    if call.signature in PLANS or (x.data_ptr() | (u.data_ptr() if u is not None else 0)) & 15:
        return  # declined before (another current device, say), or unaligned
    go = _pointwise.raw_launcher(key)
    if go is None:
        return
    index = x.get_device()
    empty_like = alloc.empty_packed_like
    if u is None:
        def plan(x, up):
            xp = x.data_ptr()
            if xp & 15:
                return None
            y = empty_like(x)
            return y if go(grid_x, (xp, xp, y.data_ptr()) + tail, index) else None
    else:
        def plan(x, up):
            xp, upp = x.data_ptr(), up.data_ptr()
            if (xp | upp) & 15:
                return None
            y = empty_like(x)
            return y if go(grid_x, (xp, upp, y.data_ptr()) + tail, index) else None

    PLANS.offer(call.signature, plan, "triton")


def supports_pointwise(p: ActivationProblem) -> Optional[str]:
    return kernel_dtype_reason("triton", p.dtype, "gate" if p.op in GATED else "x")


VARIANTS = (
    ("pointwise", supports_pointwise, launch_pointwise, "one pass, float32 math, vector loads, strided rows in place"),
)
