"""Attention: prefill (``attention``) and decoding against a KV cache (``decode_attention``).

Every call validates its arguments, asks the registry for a variant (Triton on CUDA/ROCm,
Metal on MPS once its module is present, the torch path elsewhere), runs it and, inside
``opforge.trace()``, records it.

Backend modules of this family (``triton_kernels``, ``metal``) list their variants per op:
``VARIANTS = {"attention": (rows...), "decode_attention": (rows...)}``, each row
``(name, supports, launch, summary)``; ``launch`` takes an ``AttentionCall`` or a ``DecodeCall``
(see ``problem.py``) and returns the output.
"""
from __future__ import annotations

from typing import Optional

import torch

from ...runtime import alloc, dispatch
from ...runtime.compile_support import compiled
from . import fakes, reference
from .problem import OPS, AttentionCall, DecodeCall, check_cache_seqlens, prepare_attention, prepare_decode


def _torch_attention(call: AttentionCall) -> torch.Tensor:
    # the careful composite for float64 (the oracle), PyTorch's SDPA otherwise
    run = reference.attention if call.q.dtype == torch.float64 else reference.fast_attention
    return run(call.q, call.k, call.v, call.causal, call.scale)


def _torch_decode(call: DecodeCall) -> torch.Tensor:
    run = reference.decode_attention if call.q.dtype == torch.float64 else reference.fast_decode_attention
    return run(call.q, call.k_cache, call.v_cache, call.cache_seqlens, call.scale)


_TORCH = {"attention": _torch_attention, "decode_attention": _torch_decode}


def _per_op(table, op: str):
    return None if table is None else table.get(op, ())


def _register() -> None:
    tables = dispatch.kernel_tables(__name__)   # per backend: a table per op, None where not importable
    for op in OPS:
        dispatch.register_family((op,), [(backend, _per_op(table, op)) for backend, table in tables], _TORCH[op],
                                 "torch composite ops (repeated kv heads, masked softmax), float32 accumulation "
                                 "(float64 for float64 inputs)", _problem_builder)


def _problem_builder(op: str):
    if op == "attention":
        def build(q, k, v, causal=False, scale=None):
            return prepare_attention(q, k, v, causal, scale).problem
    else:
        def build(q, k_cache, v_cache, cache_seqlens, scale=None):
            return prepare_decode(q, k_cache, v_cache, cache_seqlens, scale).problem
    return build


@compiled("attention", fakes.attention)
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
              scale: Optional[float] = None) -> torch.Tensor:
    """Scaled dot-product attention ``softmax(scale * q kᵀ [+ causal mask]) v``, with grouped heads.

    Args:
        q: (B, Hq, Sq, D) float16, bfloat16 or float32 (float64 runs on the torch path).
        k, v: (B, Hkv, Sk, D), q's dtype and device; Hq must be a multiple of Hkv (query head h
            uses key/value head ``h // (Hq // Hkv)``: grouped-query and multi-query attention).
            Any batch / head / sequence strides are read in place (``x.view(B, S, H, D).transpose(1, 2)``
            costs no copy); a non-contiguous last dimension is copied (the trace says so).
        causal: mask aligned to the end of the keys: query i sees keys ``j <= i + Sk - Sq`` (as
            ``F.scaled_dot_product_attention(is_causal=True)`` when Sq == Sk). A query row that sees
            no key (Sq > Sk) returns zeros.
        scale: multiplies the scores; ``1 / sqrt(D)`` by default.

    Returns:
        (B, Hq, Sq, D) in q's dtype, packed. Scores and the softmax are in float32 with a running
        maximum, so huge logits do not overflow.

    Limits of the kernels (outside them the torch path runs: a fallback, traced, and strict mode
    or a forced backend raises ``NoKernelError``; ``opforge.explain`` names the limit):
    the Triton kernel takes D up to 256 (padded to a power of two); the Metal prefill kernels take
    D in (64, 80, 96, 128, 256) only.

    Example:
        >>> import torch, opforge
        >>> q, k, v = torch.randn(1, 8, 5, 64), torch.randn(1, 2, 5, 64), torch.randn(1, 2, 5, 64)
        >>> out = opforge.attention(q, k, v, causal=True)
        >>> ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        >>> torch.allclose(out, ref, atol=1e-5)
        True
    """
    call = prepare_attention(q, k, v, causal, scale)
    p = call.problem
    if p.batch * p.q_heads * p.q_len * p.head_dim == 0:
        return alloc.empty((p.batch, p.q_heads, p.q_len, p.head_dim), q.dtype, q.device)
    return dispatch.run("attention", call, q)


@compiled("decode_attention", fakes.decode_attention)
def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cache_seqlens: torch.Tensor,
                     *, scale: Optional[float] = None) -> torch.Tensor:
    """Attention of a decode step's new queries over a KV cache of per-sequence lengths.

    Args:
        q: (B, Hq, Sq, D) with 1 <= Sq <= 16: the new tokens, already appended to the caches.
        k_cache, v_cache: (B, Hkv, S_max, D), q's dtype and device, Hq a multiple of Hkv; any
            batch / head / sequence strides are read in place.
        cache_seqlens: (B,) int32 or int64 on q's device: each sequence's valid length, new
            tokens included. The Sq queries are the last Sq positions: query i of sequence b sees
            keys ``j <= cache_seqlens[b] - Sq + i``; a row that sees no key returns zeros.
        scale: multiplies the scores; ``1 / sqrt(D)`` by default.

    Returns:
        (B, Hq, Sq, D) in q's dtype, packed.

    Limits of the kernels (outside them the torch path runs as a fallback; ``opforge.explain``
    names the limit): Triton and Metal take D up to 256.

    On CUDA the call never reads ``cache_seqlens`` on the host and allocates by sizes only, so it
    can be captured in a CUDA graph and replayed with new lengths. For the same reason the
    lengths are range-checked (0 <= length <= S_max) only when they are CPU tensors, or with
    ``OPFORGE_CHECK_SEQLENS=1`` (which syncs; a debugging aid); the kernels clamp them otherwise.

    Example:
        >>> import torch, opforge
        >>> q = torch.randn(2, 8, 1, 64)
        >>> kc, vc = torch.randn(2, 2, 32, 64), torch.randn(2, 2, 32, 64)
        >>> out = opforge.decode_attention(q, kc, vc, torch.tensor([32, 5], dtype=torch.int32))
        >>> ref = opforge.attention(q[1:], kc[1:, :, :5], vc[1:, :, :5])
        >>> torch.allclose(out[1:], ref, atol=1e-5)
        True
    """
    call = prepare_decode(q, k_cache, v_cache, cache_seqlens, scale)
    p = call.problem
    if p.batch * p.q_heads * p.head_dim == 0:
        return alloc.empty((p.batch, p.q_heads, p.q_len, p.head_dim), q.dtype, q.device)
    return dispatch.run("decode_attention", call, q)


_register()

__all__ = ["attention", "decode_attention", "check_cache_seqlens"]
