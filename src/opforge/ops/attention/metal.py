"""Metal kernels for attention (prefill) and decode_attention: launch wrappers and the ``metal`` variants.

The kernels are in ``attention.metal`` next to this file:

* ``prefill`` (``attention``): one threadgroup of 4 simdgroups per (batch, query head, tile of 32
  query rows), 8 rows per simdgroup; K/V blocks of 8 keys staged once per threadgroup;
  S = Q K^T and P V by ``simdgroup_matrix`` 8x8 multiply-accumulates, online softmax in
  float32, causal blocks past the tile's last row skipped.
* ``split_kv`` (``decode_attention``): one threadgroup per (batch, kv head, query, KV split)
  holding one simdgroup per query head of the GQA group (up to 8), so the group reads each
  cache row together; each lane scores one key of a block of 32 (``simd_max`` / ``simd_sum`` across the block), the
  split writes a normalised partial output and its log-sum-exp, and a combine kernel merges
  the splits.

``prefill`` and ``decode`` take plain tensors; ``launch_prefill`` / ``launch_decode`` take the
family's ``AttentionCall`` / ``DecodeCall`` (``problem.py``). On MPS tensors the kernels run
through ``torch.mps.compile_shader``; on CPU tensors, with ``OPFORGE_METAL_EMULATE=1``, through
the MSL emulator of the tests (see ``opforge.runtime.metal``). Kernels bind raw storage, so the
launchers check every tensor they bind.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import torch

from ...runtime import alloc
from ...runtime.metal import library as metal_runtime
from ...runtime.errors import kernel_dtype_reason

SOURCE = Path(__file__).with_name("attention.metal")
SIMD_WIDTH = metal_runtime.SIMD_WIDTH
TYPE_NAMES = metal_runtime.TYPE_NAMES
MAX_HEAD_DIM = 256        # kMaxD in attention.metal
PREFILL_HEAD_DIMS = (64, 80, 96, 128, 256)   # ATTENTION_PREFILL_KERNELS in attention.metal
PREFILL_ROWS = 32         # kTileRows: query rows per prefill threadgroup
PREFILL_THREADS = 128     # kPrefillThreads: 4 simdgroups
DECODE_TARGET_GROUPS = 1024   # enough threadgroups to fill a large Apple GPU
MAX_SPLITS = 64
DECODE_MAX_HEADS = 8      # kDecodeHeads: query heads (simdgroups) per decode threadgroup
MIN_SPLIT_KEYS = 64


def kernel_name(kind: str, dtype: torch.dtype, head_dim: Optional[int] = None) -> str:
    """The MSL function for a kernel kind (prefill, decode, combine), dtype and, for prefill,
    head dimension (one prefill kernel per D in ``PREFILL_HEAD_DIMS``).

    Example:
        >>> kernel_name("prefill", torch.float16, 128), kernel_name("decode", torch.bfloat16)
        ('attention_prefill_half_d128', 'attention_decode_bfloat')
    """
    suffix = f"_d{head_dim}" if kind == "prefill" else ""
    return f"attention_{kind}_{TYPE_NAMES[dtype]}{suffix}"


def _strides(t: torch.Tensor) -> list[int]:
    return [t.stride(0), t.stride(1), t.stride(2)]


def prefill(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float) -> torch.Tensor:
    """Attention of q (B, Hq, Sq, D) over k, v (B, Hkv, Sk, D) with the prefill kernel.

    Arguments must already be valid (``problem.prepare_attention`` checks them); strides other
    than the last are read in place. Returns a packed (B, Hq, Sq, D) tensor.

    Example (emulated on CPU; needs the test emulator and g++):
        >>> import os, torch                                              # doctest: +SKIP
        >>> os.environ["OPFORGE_METAL_EMULATE"] = "1"                     # doctest: +SKIP
        >>> q = k = v = torch.randn(1, 2, 8, 64)                           # doctest: +SKIP
        >>> prefill(q, k, v, True, 0.125).shape                           # doctest: +SKIP
        torch.Size([1, 2, 8, 64])
    """
    b, hq, sq, d = q.shape
    device, dtype = q.device, q.dtype
    for name, t in (("q", q), ("k", k), ("v", v)):
        metal_runtime.check_rows_binding(name, t, dtype, device)
    out = alloc.empty((b, hq, sq, d), dtype, device)
    groups = b * hq * -(-sq // PREFILL_ROWS)
    if groups == 0:
        return out
    fn = metal_runtime.kernel(SOURCE, kernel_name("prefill", dtype, d), device.type)
    shape = [hq, hq // k.shape[1], sq, k.shape[2], d, int(causal),
             *_strides(q), *_strides(k), *_strides(v), *_strides(out)]
    fn(q, k, v, out, shape, float(scale), threads=groups * PREFILL_THREADS, group_size=PREFILL_THREADS)
    return out


def decode_heads_per_threadgroup(group: int) -> int:
    """Query heads (simdgroups) per decode threadgroup: the largest divisor of the GQA group
    size ``group`` = Hq / Hkv that is at most ``DECODE_MAX_HEADS``.

    Example:
        >>> decode_heads_per_threadgroup(1), decode_heads_per_threadgroup(6), decode_heads_per_threadgroup(12)
        (1, 6, 6)
    """
    return max(h for h in range(1, min(group, DECODE_MAX_HEADS) + 1) if group % h == 0)


def decode_splits(rows: int, s_max: int) -> int:
    """How many KV splits decode uses for ``rows`` = B * Hq * Sq query rows and caches of ``s_max``:
    enough threadgroups to fill the GPU, at most ``MAX_SPLITS``, at least ``MIN_SPLIT_KEYS`` keys each.

    Example:
        >>> decode_splits(rows=32, s_max=4096), decode_splits(rows=4096, s_max=4096), decode_splits(8, 100)
        (32, 1, 2)
    """
    want = -(-DECODE_TARGET_GROUPS // max(rows, 1))
    return max(1, min(want, MAX_SPLITS, -(-s_max // MIN_SPLIT_KEYS)))


def decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cache_seqlens: torch.Tensor,
           scale: float, n_split: Optional[int] = None) -> torch.Tensor:
    """Decode attention of q (B, Hq, Sq, D) against caches (B, Hkv, S_max, D) holding
    ``cache_seqlens[b]`` keys each (the Sq queries are the last Sq of them, causal among themselves).

    Arguments must already be valid (``problem.prepare_decode`` checks them). ``n_split`` fixes
    the number of KV splits (default: ``decode_splits``). Returns a packed (B, Hq, Sq, D) tensor.

    Example (emulated on CPU; needs the test emulator and g++):
        >>> import torch                                                   # doctest: +SKIP
        >>> q = torch.randn(2, 4, 1, 64); kc = vc = torch.randn(2, 2, 32, 64)  # doctest: +SKIP
        >>> decode(q, kc, vc, torch.tensor([5, 32], dtype=torch.int32), 0.125).shape  # doctest: +SKIP
        torch.Size([2, 4, 1, 64])
    """
    b, hq, sq, d = q.shape
    device, dtype = q.device, q.dtype
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        metal_runtime.check_rows_binding(name, t, dtype, device)
    s_max = k_cache.shape[2]
    seqlens = cache_seqlens.to(torch.int32).contiguous()
    out = alloc.empty((b, hq, sq, d), dtype, device)
    rows = b * hq * sq
    if rows == 0:
        return out
    n_split = n_split or decode_splits(rows, s_max)
    per_split = -(-s_max // n_split)
    chunk = max(SIMD_WIDTH, -(-per_split // SIMD_WIDTH) * SIMD_WIDTH)  # whole blocks of 32 keys
    part_o = torch.empty(rows * n_split * d, dtype=torch.float32, device=device)
    part_lse = torch.empty(rows * n_split, dtype=torch.float32, device=device)
    split_fn = metal_runtime.kernel(SOURCE, kernel_name("decode", dtype), device.type)
    combine_fn = metal_runtime.kernel(SOURCE, kernel_name("combine", dtype), device.type)
    group = hq // k_cache.shape[1]
    heads = decode_heads_per_threadgroup(group)
    shape = [hq, group, sq, s_max, d, n_split, chunk, heads,
             *_strides(q), *_strides(k_cache), *_strides(v_cache)]
    split_fn(q, k_cache, v_cache, seqlens, part_o, part_lse, shape, float(scale),
             threads=rows * n_split * SIMD_WIDTH, group_size=heads * SIMD_WIDTH)
    combine_fn(part_o, part_lse, out, [hq, sq, d, n_split, *_strides(out)],
               threads=rows * SIMD_WIDTH, group_size=SIMD_WIDTH)
    return out


def launch_prefill(call: Any) -> torch.Tensor:
    """Run an ``AttentionCall`` (see ``problem.py``) with the prefill kernel."""
    return prefill(call.q, call.k, call.v, call.causal, call.scale)


def launch_decode(call: Any) -> torch.Tensor:
    """Run a ``DecodeCall`` (see ``problem.py``) with the split-KV decode kernels."""
    return decode(call.q, call.k_cache, call.v_cache, call.cache_seqlens, call.scale)


def _dtype_reason(p: Any) -> Optional[str]:
    return kernel_dtype_reason("metal", p.dtype, "q") or \
        metal_runtime.bfloat_reason(p.dtype, p.device_type, SOURCE, kernel_name("combine", torch.bfloat16))


def supports_prefill(p: Any) -> Optional[str]:
    """None if the prefill kernel takes problem ``p``, else why not."""
    if p.head_dim not in PREFILL_HEAD_DIMS:
        return _dtype_reason(p) or f"head_dim={p.head_dim}: the Metal prefill kernels take D in {PREFILL_HEAD_DIMS}"
    return _dtype_reason(p)


def supports_decode(p: Any) -> Optional[str]:
    """None if the split-KV decode kernels take problem ``p``, else why not."""
    if not 0 < p.head_dim <= MAX_HEAD_DIM:
        return _dtype_reason(p) or f"head_dim={p.head_dim}: the Metal decode kernel takes up to {MAX_HEAD_DIM}"
    return _dtype_reason(p)


VARIANTS = {
    "attention": (
        ("prefill", supports_prefill, launch_prefill,
         "simdgroup 8x8 matrices: Q tile vs blocks of 8 keys, online softmax, causal blocks skipped"),
    ),
    "decode_attention": (
        ("split_kv", supports_decode, launch_decode,
         "split-KV decoding: a key per lane, simd_max/simd_sum, partials merged by a combine kernel"),
    ),
}
