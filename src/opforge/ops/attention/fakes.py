"""Fake implementations for torch.compile: the shapes, dtypes and strides attention returns."""
from __future__ import annotations

from typing import Optional

import torch


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
              scale: Optional[float] = None) -> torch.Tensor:
    return q.new_empty(q.shape[:3] + v.shape[3:])  # packed; v's head dim (== q's today)


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cache_seqlens: torch.Tensor,
                     *, scale: Optional[float] = None) -> torch.Tensor:
    return q.new_empty(q.shape[:3] + v_cache.shape[3:])
