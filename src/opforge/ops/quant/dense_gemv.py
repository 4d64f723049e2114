"""A Triton GEMV for ``linear`` with a dense fp16/bf16 weight and a few rows of x (decode).

Why: at batch 1 a decode step reads every weight once, and cuBLAS's ``F.linear`` reads the
1B/8B Llama projections (N, K of 2048..16384) at 47-72% of copy bandwidth on the H100 (at 980a81d,
``benchmarks/results/h100/2026-11-23-980a81d``). This kernel streams the (N, K) weight once with 16-byte
loads along K in (BLOCK_N, BLOCK_K) tiles, multiplies by x in float32 registers, reduces once at
the end, and splits K when N alone gives too few programs (the last split of a tile adds the
float32 partials in split order: the same ``_store`` as the quantized GEMV).

``linear`` runs it for one row of x with a dense fp16/bf16 weight on CUDA (traced as
``triton``/``dense_gemv``), also with ``activation="swiglu"``, which it applies to each program's
gate and up sums (no written product, no swiglu launch: the 1B bf16 decode step 1104 -> 1076 us,
``benchmarks/results/h100/2026-11-27-1ed549a``); more rows go to cuBLAS. Measured (H100, at
b634a74, CUDA graphs over L2-cold weights,
``benchmarks/results/h100/2026-11-23-b634a74/breakdown_run1.json``): the 1B model's bf16 decode step
1369 -> 1223 us (graph replay), each decode GEMV shape 1.06-1.27x cuBLAS.
"""
from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from ...runtime import alloc
from ...runtime.triton import pdl
from ...runtime.triton.launch import TritonLauncher, cdiv
from .config import _split
from .triton_kernels import _counters, _store

#: (BLOCK_N, BLOCK_K, num_warps, programs per SM) when no config is given.
DEFAULT_CONFIG = (32, 256, 4, 4)
#: Bytes of weight per program step in ``config_for`` (16-byte loads, all in flight at once).
STEP_BYTES = 16384


@triton.jit
def _swiglu_rows(pid_n, N, BLOCK_N: tl.constexpr):
    """The weight rows of a SwiGLU program (one row of x): its BLOCK_N / 2 features ``f`` interleaved
    with their up rows, gate row ``f`` then up row ``N / 2 + f``, and the mask of both."""
    r = tl.arange(0, BLOCK_N)
    feature = pid_n * (BLOCK_N // 2) + r // 2
    return feature + (r % 2) * (N // 2), feature < N // 2


@triton.jit
def _store_swiglu(res, rows, n_mask, pid_n, N, b_ptr, out_ptr, HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr):
    """Write ``silu(gate) * up`` of one row's (BLOCK_N,) float32 sums over ``_swiglu_rows``' rows
    (bias added first), cast once: BLOCK_N / 2 outputs."""
    if HAS_BIAS:
        res += tl.load(b_ptr + rows, mask=n_mask, other=0.0).to(tl.float32)
    gate, up = tl.split(tl.reshape(res, (BLOCK_N // 2, 2)))
    y = gate / (1.0 + tl.exp(-gate)) * up
    features = pid_n * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2)
    tl.store(out_ptr + features, y.to(out_ptr.dtype.element_ty), mask=features < N // 2)


@triton.jit
def _dense_gemv_kernel(x_ptr, w_ptr, b_ptr, out_ptr, ws_ptr, cnt_ptr, M, N, K, stride_xm, stride_w, k_per_split,
                       n_splits, HAS_BIAS: tl.constexpr, PARTIAL: tl.constexpr, FIXUP: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                       PDL: tl.constexpr = False, SWIGLU: tl.constexpr = False):
    """(BLOCK_M, BLOCK_N) outputs over K range ``pid_k * k_per_split ..``; float32 products kept
    per (row, k) lane and reduced once at the end. SWIGLU (one row, no K split): the tile's rows
    are gate and up rows of BLOCK_N / 2 features (``_swiglu_rows``), written as silu(gate) * up."""
    pdl.wait_for_previous(PDL)
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    if SWIGLU:
        rows, n_mask = _swiglu_rows(pid_n, N, BLOCK_N)
    else:
        rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        n_mask = rows < N
    ms = tl.arange(0, BLOCK_M)
    m_mask = ms < M
    kk = tl.arange(0, BLOCK_K)
    w_rows = w_ptr + rows.to(tl.int64)[:, None] * stride_w
    k_end = tl.minimum(K, pid_k * k_per_split + k_per_split)
    # loop over tile indices: k0 is then a known multiple of BLOCK_K (16-byte loads)
    if BLOCK_M == 1:
        acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
        for kt in range(pid_k * (k_per_split // BLOCK_K), tl.cdiv(k_end, BLOCK_K)):
            ks = kt * BLOCK_K + kk
            k_mask = ks < k_end
            w = tl.load(w_rows + ks[None, :], mask=n_mask[:, None] & k_mask[None, :], other=0.0)
            x = tl.load(x_ptr + ks, mask=k_mask, other=0.0)
            acc += w.to(tl.float32) * x.to(tl.float32)[None, :]
        res = tl.sum(acc, axis=1)[None, :]
    else:
        acc3 = tl.zeros((BLOCK_M, BLOCK_N, BLOCK_K), dtype=tl.float32)
        x_rows = x_ptr + ms.to(tl.int64)[:, None, None] * stride_xm
        for kt in range(pid_k * (k_per_split // BLOCK_K), tl.cdiv(k_end, BLOCK_K)):
            ks = kt * BLOCK_K + kk
            k_mask = ks < k_end
            w = tl.load(w_rows + ks[None, :], mask=n_mask[:, None] & k_mask[None, :], other=0.0)
            x = tl.load(x_rows + ks[None, None, :], mask=m_mask[:, None, None] & k_mask[None, None, :], other=0.0)
            acc3 += w.to(tl.float32)[None, :, :] * x.to(tl.float32)
        res = tl.sum(acc3, axis=2)
    if SWIGLU:
        _store_swiglu(tl.reshape(res, (BLOCK_N,)), rows, n_mask, pid_n, N, b_ptr, out_ptr, HAS_BIAS, BLOCK_N)
    else:
        _store(res, ms, m_mask, rows, n_mask, pid_k, pid_n, M, N, b_ptr, out_ptr, ws_ptr, cnt_ptr, n_splits,
               HAS_BIAS, PARTIAL, FIXUP)


_dense_gemv = TritonLauncher(_dense_gemv_kernel)


def config_for(n: int, k: int, itemsize: int) -> tuple[int, int, int, int]:
    """(BLOCK_N, BLOCK_K, warps, programs per SM) for an (N, K) weight: up to 2048 columns (4 KB
    of a 16-bit row) per step, ``STEP_BYTES`` per program step, 4 warps. H100 sweep (at b634a74):
    (4, 2048) beat cuBLAS on all nine 1B/8B decode shapes (1B qkv/o/gate_up/down/lm_head 6.3/5.0/
    24.3/13.8/167.8 us vs 7.0/6.3/26.1/16.4/189.5).

    Example:
        >>> config_for(3072, 2048, 2)
        (4, 2048, 4, 4)
    """
    block_k = min(2048, 1 << (max(k, 16).bit_length() - 1))
    block_n = max(4, min(64, STEP_BYTES // (block_k * itemsize)))
    return block_n, block_k, 4, 4


def supported(x: torch.Tensor, w: torch.Tensor, m: int) -> bool:
    """Whether ``linear`` sends this dense call here: one row, fp16/bf16 on CUDA,
    a weight with unit last stride, compiled Triton (not the interpreter)."""
    from ...runtime.backends import triton_interpreting
    return m == 1 and x.is_cuda and x.dtype in (torch.float16, torch.bfloat16) \
        and w.stride(-1) == 1 and not triton_interpreting()


def dense_gemv(x: torch.Tensor, w: torch.Tensor, bias: Optional[torch.Tensor] = None,
               config: Optional[tuple] = None, swiglu: bool = False) -> torch.Tensor:
    """``x @ w.T + bias`` for x (M <= 16, K) with unit last stride and a row-major (N, K) weight;
    with ``swiglu`` (one row of x; w stacks gate rows over up rows) ``silu(h1) * h2`` of the two
    halves of that product, (1, N/2).

    ``config`` = (BLOCK_N, BLOCK_K, num_warps, programs per SM), default ``config_for``. Float32
    accumulation; the weight may be a row slice (any row stride). SwiGLU runs without a K split
    (a program needs the whole sums of its gate and up rows).

    Example:
        >>> import os; interp = os.environ.get("TRITON_INTERPRET") == "1"
        >>> x, w = torch.randn(1, 64), torch.randn(48, 64)
        >>> out = dense_gemv(x, w, config=(16, 32, 1, 1)) if interp else x @ w.T
        >>> torch.allclose(out, x @ w.T, atol=1e-4)
        True
    """
    m, k = x.shape
    n = w.shape[0]
    if m > 16 or x.stride(-1) != 1 or w.stride(-1) != 1:
        raise ValueError("dense_gemv takes M <= 16 rows with unit last strides")
    if swiglu and (m != 1 or n % 2):
        raise ValueError(f"dense_gemv applies SwiGLU to one row of x and an even N, got M={m}, N={n}")
    block_n, block_k, warps, programs_per_sm = config or config_for(n, k, w.element_size())
    block_m = 1 << (m - 1).bit_length()
    tiles = cdiv(n, block_n)
    split, k_per_split = (1, cdiv(k, block_k) * block_k) if swiglu else \
        _split(tiles, k, block_k, x.device, programs_per_sm)
    out = alloc.empty((m, n // 2 if swiglu else n), x.dtype, x.device)
    has_bias = bias is not None
    ws = out if split == 1 else torch.empty((split, m, n), dtype=torch.float32, device=x.device)
    counters = _counters(x.device, tiles) if split > 1 else ws
    _dense_gemv((tiles, split), (x, w, bias if has_bias else w, out, ws, counters, m, n, k, x.stride(0), w.stride(0),
                                 k_per_split, split, has_bias, split > 1, True, block_m, block_n, block_k,
                                 pdl.on(x.device), swiglu),
                num_warps=warps, num_stages=1)
    return out
