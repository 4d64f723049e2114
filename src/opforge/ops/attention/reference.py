"""The torch path for attention and decode_attention: the fallback everywhere and, in float64, the oracle.

Two forms:

* the careful composites (``attention``, ``decode_attention``): key/value heads repeated for
  grouped-query attention, scores computed and soft-maxed in float32 (float64 for float64
  inputs) with the row maximum subtracted; a query row that sees no key gives zeros. Call them
  on ``.double()`` tensors for the oracle. They read no tensor value on the host, so a decode
  step stays capturable.
* ``fast_attention`` / ``fast_decode_attention``: PyTorch's ``scaled_dot_product_attention``
  with grouped heads, over the valid cache slots only (the lengths are read on the host when
  they are CPU tensors); the torch path for float32 and half inputs (``run_attention``,
  ``run_decode``).

Either way a cache slot at or past a sequence's length never reaches the output: a NaN or inf
there changes nothing.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F


#: ``attention`` computes the scores of this many (query, key) pairs at most at once.
SCORE_CHUNK_ELEMENTS = 1 << 27


def _compute_dtype(t: torch.Tensor) -> torch.dtype:
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def _expand_heads(kv: torch.Tensor, q_heads: int) -> torch.Tensor:
    group = q_heads // kv.shape[1]
    return kv if group == 1 else kv.repeat_interleave(group, dim=1)


def masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: Optional[torch.Tensor],
                     scale: float) -> torch.Tensor:
    """softmax(scale * q kᵀ over visible keys) v in float32 (float64 for float64 q); rows that
    see no key give zeros. ``visible`` broadcasts to (B, Hq, Sq, Sk), or None for all keys.

    Example:
        >>> import torch
        >>> q, k, v = torch.zeros(1, 1, 1, 2), torch.zeros(1, 1, 2, 2), torch.tensor([[[[1.0, 0], [3, 0]]]])
        >>> masked_attention(q, k, v, None, 1.0).tolist()
        [[[[2.0, 0.0]]]]
    """
    ct = _compute_dtype(q)
    if k.shape[2] == 0:  # no keys at all: every row sees nothing
        return torch.zeros(q.shape[:-1] + v.shape[-1:], dtype=q.dtype, device=q.device)
    qf, kf, vf = q.to(ct), _expand_heads(k, q.shape[1]).to(ct), _expand_heads(v, q.shape[1]).to(ct)
    s = torch.matmul(qf, kf.transpose(-1, -2)) * scale
    if visible is not None:
        s = s.masked_fill(~visible, float("-inf"))
    m = s.amax(dim=-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))  # a row with no key: exp(-inf) = 0
    p = torch.exp(s - m)
    total = p.sum(dim=-1, keepdim=True)
    out = torch.matmul(p, vf) / torch.where(total > 0, total, torch.ones_like(total))
    return out.to(q.dtype)


def causal_mask(sq: int, sk: int, device: torch.device) -> torch.Tensor:
    """(Sq, Sk) bool: query i sees key j iff j <= i + Sk - Sq (the mask aligned to the end)."""
    i = torch.arange(sq, device=device)[:, None]
    j = torch.arange(sk, device=device)[None, :]
    return j <= i + (sk - sq)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
              scale: Optional[float] = None) -> torch.Tensor:
    """Prefill attention with grouped heads; ``causal`` aligns the mask to the end of the keys.

    Example:
        >>> import torch
        >>> q, k, v = torch.randn(1, 4, 5, 8), torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8)
        >>> ref = torch.nn.functional.scaled_dot_product_attention(
        ...     q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), is_causal=True)
        >>> torch.allclose(attention(q, k, v, causal=True), ref, atol=1e-5)
        True
    """
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    visible = causal_mask(q.shape[2], k.shape[2], q.device) if causal else None
    # query rows in chunks whose score matrix stays near SCORE_CHUNK_ELEMENTS (rows are independent):
    # the float64 oracle at 1x32x16384 would otherwise hold 64 GiB of scores
    b, hq, sq = q.shape[:3]
    rows = max(1, SCORE_CHUNK_ELEMENTS // max(1, b * hq * k.shape[2]))
    if rows >= sq:
        return masked_attention(q, k, v, visible, scale)
    return torch.cat([masked_attention(q[:, :, r:r + rows], k, v, None if visible is None else visible[r:r + rows],
                                       scale) for r in range(0, sq, rows)], dim=2)


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cache_seqlens: torch.Tensor,
                     scale: Optional[float] = None) -> torch.Tensor:
    """The Sq queries are the last Sq positions of each sequence: query i of sequence b sees keys
    j <= cache_seqlens[b] - Sq + i (lengths clamped to [0, S_max], as the kernels do).

    Example:
        >>> import torch
        >>> q, kc, vc = torch.randn(2, 4, 1, 8), torch.randn(2, 1, 6, 8), torch.randn(2, 1, 6, 8)
        >>> out = decode_attention(q, kc, vc, torch.tensor([6, 3]))
        >>> torch.allclose(out[1:], attention(q[1:], kc[1:, :, :3], vc[1:, :, :3]), atol=1e-6)
        True
    """
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    sq, s_max = q.shape[2], k_cache.shape[2]
    lens = cache_seqlens.to(torch.int64).clamp(0, s_max)
    i = torch.arange(sq, device=q.device)[:, None]
    j = torch.arange(s_max, device=q.device)[None, :]
    visible = j[None] <= (lens[:, None, None] - sq + i[None])      # (B, Sq, S_max)
    # a masked score is replaced by -inf whatever k held; v of a slot past the length is zeroed
    # so that 0 * NaN cannot reach the output
    v_valid = torch.where((j < lens[:, None])[:, None, :, None], v_cache, 0)
    return masked_attention(q, k_cache, v_valid, visible[:, None], scale)


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor], causal: bool,
          scale: float) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=scale,
                                          enable_gqa=k.shape[1] != q.shape[1])


def fast_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                   scale: Optional[float] = None) -> torch.Tensor:
    """``attention`` through PyTorch's SDPA with grouped heads (no repeated k/v); the careful form
    where some query row sees no key (no keys, or causal with Sq > Sk), which must give zeros.

    Example:
        >>> import torch
        >>> q, k, v = torch.randn(1, 4, 3, 8), torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8)
        >>> torch.allclose(fast_attention(q, k, v, True), attention(q, k, v, True), atol=1e-5)
        True
    """
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    sq, sk = q.shape[2], k.shape[2]
    if sk == 0 or (causal and sq > sk):
        return attention(q, k, v, causal, scale)
    if causal and sq != sk:  # SDPA's is_causal aligns the mask to the start of the keys
        return _sdpa(q, k, v, causal_mask(sq, sk, q.device), False, scale)
    return _sdpa(q, k, v, None, causal, scale)


def fast_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                          cache_seqlens: torch.Tensor, scale: Optional[float] = None) -> torch.Tensor:
    """``decode_attention`` through SDPA over the first ``max(cache_seqlens)`` slots only.

    The lengths are read on the host where they are CPU tensors (free there); on another device
    that would synchronize and defeat graph capture, so the careful form runs instead. Sequences
    of unequal lengths, or fewer keys than queries, also take the careful form over the slots up
    to the longest length.

    Example:
        >>> import torch
        >>> q, kc, vc = torch.randn(1, 6, 1, 8), torch.randn(1, 2, 9, 8), torch.randn(1, 2, 9, 8)
        >>> kc[:, :, 5:] = float("nan")                 # slots past the length are never read
        >>> out = fast_decode_attention(q, kc, vc, torch.tensor([5]))
        >>> torch.allclose(out, attention(q, kc[:, :, :5], vc[:, :, :5]), atol=1e-5)
        True
    """
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    if cache_seqlens.device.type != "cpu":
        return decode_attention(q, k_cache, v_cache, cache_seqlens, scale)
    sq, s_max = q.shape[2], k_cache.shape[2]
    lengths = cache_seqlens.tolist()
    longest = min(max(lengths), s_max)
    k, v = k_cache[:, :, :longest], v_cache[:, :, :longest]
    if min(lengths) < longest or longest < sq:
        return decode_attention(q, k, v, cache_seqlens.clamp(0, longest), scale)
    mask = None if sq == 1 else causal_mask(sq, longest, q.device)
    return _sdpa(q, k, v, mask, False, scale)
