"""The torch path for attention and decode_attention: the fallback everywhere and, in float64, the oracle.

Composite torch ops: key/value heads are repeated for grouped-query attention, scores are
computed and soft-maxed in float32 (float64 for float64 inputs) with the row maximum
subtracted, and a query row that sees no key gives zeros. Call them on ``.double()`` tensors
for the oracle. Nothing reads tensor values on the host, so the decode path stays capturable.
"""
from __future__ import annotations

from typing import Optional

import torch


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
    return masked_attention(q, k, v, visible, scale)


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
    return masked_attention(q, k_cache, v_cache, visible[:, None], scale)
