"""Triton kernels for ``linear`` with a quantized weight (int4 or int8, any group, symmetric or not).

One kernel, two variants chosen by the number of rows M of x:

* ``decode`` (M <= 16): GEMV-style. A program owns BLOCK_N output features and a range of K;
  it streams that part of the packed weight once (int4: int32 words of 8 codes, 16-byte vector
  loads; int8: bytes) and unpacks it in registers. For M = 1 the codes meet x with float32 FMAs
  and a reduction along K; for 2..16 rows x is padded to 16 rows and the codes go to ``tl.dot``,
  so every row shares each weight load. When N alone gives too few programs to fill the GPU, K
  is split: each split writes float32 partials to a workspace (split, M, N) and a tiny second
  kernel adds them in a fixed order, the bias, and casts (deterministic; no atomics, no memset).
* ``prefill`` (M > 16): the same loop on (BLOCK_M, BLOCK_N) output tiles, the codes of each K
  tile fed to ``tl.dot`` (tensor cores) against x; tiles chosen by M, N, K and the group. The
  programs that share an N tile run next to each other, so the weight tile is read from DRAM
  about once. Split K applies here too when the tiles are too few.

Exactness: a K tile never straddles a group (BLOCK_K divides the group, or for the FMA path
the tile is viewed as (BLOCK_K / SUB, SUB) sub-groups). Per group the kernel accumulates
``scale * (sum_k x*code - zero * sum_k x)``: the codes (< 256) are exact in float16/bfloat16,
products are exact and sums float32, so the result is the QuantizedWeight's up to float32
accumulation, with no 16-bit rounding of a dequantized weight. Under the interpreter (whose
bf16 ``tl.dot`` is wrong) the dot operands are cast to float32.
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from ...runtime import alloc
from ...runtime.backends import triton_interpreting
from ...runtime.launch import TritonLauncher, cdiv
from .problem import LinearCall, LinearProblem

KERNEL_DTYPES = (torch.float16, torch.bfloat16)
PROGRAMS_PER_SM = 4           # split K until about this many programs per SM are in flight
MAX_SPLIT = 32


@triton.jit
def _load_codes(w_ptr, rows, n_mask, k0, K, BITS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """The (BLOCK_N, BLOCK_K) int32 codes of rows ``rows`` at columns ``k0 ..`` (0 where masked)."""
    if BITS == 4:
        words = k0 // 8 + tl.arange(0, BLOCK_K // 8)
        w_off = rows.to(tl.int64)[:, None] * (K // 8) + words[None, :]
        packed = tl.load(w_ptr + w_off, mask=n_mask[:, None] & (words < K // 8)[None, :], other=0)
        shifts = tl.arange(0, 8) * 4
        codes = (packed[:, :, None] >> shifts[None, None, :]) & 0xF
        return tl.reshape(codes, (BLOCK_N, BLOCK_K))
    else:
        ks = k0 + tl.arange(0, BLOCK_K)
        w_off = rows.to(tl.int64)[:, None] * K + ks[None, :]
        return tl.load(w_ptr + w_off, mask=n_mask[:, None] & (ks < K)[None, :], other=0).to(tl.int32)


@triton.jit
def _qlinear_kernel(x_ptr, w_ptr, s_ptr, z_ptr, b_ptr, out_ptr, M, N, K, stride_xm, k_per_split, m_tiles,
                    BITS: tl.constexpr, GROUP: tl.constexpr, PER_ROW: tl.constexpr, SYMMETRIC: tl.constexpr,
                    HAS_BIAS: tl.constexpr, PARTIAL: tl.constexpr, USE_DOT: tl.constexpr, F32_DOT: tl.constexpr,
                    SUB: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
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
    NSUB: tl.constexpr = BLOCK_K // SUB
    zero_const: tl.constexpr = 2 ** (BITS - 1)
    if USE_DOT:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for k0 in range(k_start, k_end, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_mask = ks < K
        codes = _load_codes(w_ptr, rows, n_mask, k0, K, BITS, BLOCK_N, BLOCK_K)
        x = tl.load(x_ptr + ms.to(tl.int64)[:, None] * stride_xm + ks[None, :],
                    mask=m_mask[:, None] & k_mask[None, :], other=0.0)
        if PER_ROW:
            g = tl.zeros((NSUB,), dtype=tl.int32)
        else:
            g = (k0 + tl.arange(0, NSUB) * SUB) // GROUP
        sg_off = g[None, :] * N + rows[:, None]                     # (BLOCK_N, NSUB), scales_t is (groups, N)
        s = tl.load(s_ptr + sg_off, mask=n_mask[:, None], other=0.0).to(tl.float32)
        if SYMMETRIC:
            z = tl.full((BLOCK_N, NSUB), zero_const, tl.float32)
        else:
            z = tl.load(z_ptr + sg_off, mask=n_mask[:, None], other=0.0).to(tl.float32)
        if USE_DOT:
            # NSUB == 1: the whole K tile is one group
            if F32_DOT:
                p = tl.dot(x.to(tl.float32), tl.trans(codes.to(tl.float32)))
            else:
                p = tl.dot(x, tl.trans(codes.to(x.dtype)))
            xs = tl.sum(x.to(tl.float32), axis=1)                    # (BLOCK_M,)
            s1 = tl.reshape(s, (BLOCK_N,))
            z1 = tl.reshape(z, (BLOCK_N,))
            acc += (p - xs[:, None] * z1[None, :]) * s1[None, :]
        else:
            c = tl.reshape(codes.to(tl.float32), (BLOCK_N, NSUB, SUB))
            xv = tl.reshape(x.to(tl.float32), (NSUB, SUB))           # BLOCK_M == 1
            p = tl.sum(c * xv[None, :, :], axis=2)                    # (BLOCK_N, NSUB)
            xs = tl.sum(xv, axis=1)                                   # (NSUB,)
            acc += tl.sum((p - z * xs[None, :]) * s, axis=1)
    if USE_DOT:
        res = acc
    else:
        res = acc[None, :]
    out_mask = m_mask[:, None] & n_mask[None, :]
    if PARTIAL:
        off = (pid_k * M + ms.to(tl.int64))[:, None] * N + rows[None, :]
        tl.store(out_ptr + off, res, mask=out_mask)
    else:
        if HAS_BIAS:
            res += tl.load(b_ptr + rows, mask=n_mask, other=0.0).to(tl.float32)[None, :]
        off = ms.to(tl.int64)[:, None] * N + rows[None, :]
        tl.store(out_ptr + off, res.to(out_ptr.dtype.element_ty), mask=out_mask)


@triton.jit
def _combine_kernel(ws_ptr, b_ptr, out_ptr, MN, N, SPLIT: tl.constexpr, HAS_BIAS: tl.constexpr,
                    BLOCK: tl.constexpr):
    """out = sum over splits of the float32 partials (in split order), + bias, cast."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < MN
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in range(SPLIT):
        acc += tl.load(ws_ptr + s * MN + offs, mask=mask, other=0.0)
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs % N, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + offs, acc.to(out_ptr.dtype.element_ty), mask=mask)


_qlinear = TritonLauncher(_qlinear_kernel)
_combine = TritonLauncher(_combine_kernel)


@functools.lru_cache(maxsize=16)
def _sm_count(device_index) -> int:
    if triton_interpreting() or device_index is None:
        return 1   # the interpreter runs programs one by one: keep grids small
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def tile_config(p: LinearProblem) -> tuple[int, int, int, bool, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K, use_dot, num_warps, num_stages) for a problem.

    Decode, M = 1: 64 features x 256 columns of codes per step (int4: 8 KB of words per program
    step), FMA path. Decode, M 2..16: 16 padded rows, tl.dot, BLOCK_K the group (at most 128).
    Prefill: 64- or 128-row tiles by M, 128 features unless N is small, BLOCK_K = min(group, 64).
    """
    g = p.k if p.group >= p.k else p.group
    if p.m == 1:
        return 1, 64, 256 if p.bits == 4 else 128, False, 4, 3
    if p.m <= 16:
        return 16, 64, min(_pow2_le(g), 128), True, 4, 3
    block_m = 64 if p.m <= 64 else 128
    block_n = 128 if p.n >= 128 else 64
    return block_m, block_n, min(_pow2_le(g), 64), True, 8 if block_m == 128 else 4, 3


def _pow2_le(v: int) -> int:
    return 1 << (v.bit_length() - 1)


def launch(call: LinearCall) -> torch.Tensor:
    """Run the kernel for ``call`` (either variant: the tile config tells them apart)."""
    p = call.problem
    w = call.w
    x = call.x
    block_m, block_n, block_k, use_dot, warps, stages = tile_config(p)
    per_row = w.group_size == -1 or w.group >= p.k
    sub = block_k if per_row else min(w.group, block_k)
    m_tiles, n_tiles = cdiv(p.m, block_m), cdiv(p.n, block_n)
    tiles = m_tiles * n_tiles
    k_steps = cdiv(p.k, block_k)
    want = PROGRAMS_PER_SM * _sm_count(x.device.index if x.device.type == "cuda" else None)
    split = max(1, min(MAX_SPLIT, k_steps, want // tiles)) if tiles < want else 1
    k_per_split = cdiv(k_steps, split) * block_k
    split = cdiv(p.k, k_per_split)
    out = alloc.empty((p.m, p.n), x.dtype, x.device)
    bias = call.bias if call.bias is not None else w.scales_t
    zeros = w.zeros_t if w.zeros_t is not None else w.scales_t
    f32_dot = triton_interpreting()
    target = out if split == 1 else torch.empty((split, p.m, p.n), dtype=torch.float32, device=x.device)
    _qlinear((tiles, split), (x, w.packed, w.scales_t, zeros, bias, target, p.m, p.n, p.k, x.stride(0), k_per_split,
                              m_tiles, w.bits, w.group, per_row, w.symmetric, call.bias is not None, split > 1,
                              use_dot, f32_dot, sub, block_m, block_n, block_k),
             num_warps=warps, num_stages=stages)
    if split > 1:
        mn = p.m * p.n
        _combine((cdiv(mn, 1024),), (target, bias, out, mn, p.n, split, call.bias is not None, 1024), num_warps=4)
    return out.view(call.out_shape)


def _dtype_reason(p: LinearProblem):
    if p.dtype not in KERNEL_DTYPES:
        return (f"x is {str(p.dtype).replace('torch.', '')}; the quantized kernels take float16 or bfloat16 "
                "(float32 and float64 run on the torch path)")
    if p.dense:
        return "w is dense (torch's F.linear runs it)"
    if p.k < 16:
        return f"K={p.k} < 16 (tl.dot needs K tiles of at least 16)"
    return None


def supports_decode(p: LinearProblem):
    return _dtype_reason(p) or (None if p.decode else f"M={p.m} rows > 16: the prefill variant's")


def supports_prefill(p: LinearProblem):
    return _dtype_reason(p)


VARIANTS = (
    ("decode", supports_decode, launch, "M <= 16: packed weights streamed once, unpacked in registers, split K"),
    ("prefill", supports_prefill, launch, "M > 16: codes fed to tl.dot per group tile, scale/zero per group"),
)
