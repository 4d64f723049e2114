"""torch.compile support for the paged-cache ops: fakes, and the in-place rotary append.

The appends write the page pools: ops that declare them mutated. ``inplace=True`` makes
``paged_rotary_kv_cache_append`` write q too, which one schema cannot say, so while compiling
``route_paged_rotary_kv_cache_append`` sends it to ``opforge::paged_rotary_kv_cache_append_``
(q, k_pages and v_pages declared mutated) and returns q.
"""
from __future__ import annotations

from typing import Optional

import torch

from ...runtime.compile_support import library_op


def paged_kv_cache_append(k_pages: torch.Tensor, v_pages: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                          block_tables: torch.Tensor, cache_seqlens: torch.Tensor, cu_seqlens: torch.Tensor, *,
                          check: Optional[bool] = None) -> None:
    return None


def paged_rotary_kv_cache_append(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_pages: torch.Tensor,
                                 v_pages: torch.Tensor, block_tables: torch.Tensor, cache_seqlens: torch.Tensor,
                                 cu_seqlens: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                                 positions: Optional[torch.Tensor] = None, *, interleaved: bool = False,
                                 inplace: bool = False, check: Optional[bool] = None) -> torch.Tensor:
    return q.new_empty(q.shape)


def paged_attention(q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor, block_tables: torch.Tensor,
                    cache_seqlens: torch.Tensor, cu_seqlens: torch.Tensor, *, max_query_len: int,
                    scale: Optional[float] = None) -> torch.Tensor:
    return q.new_empty(q.shape[:2] + v_pages.shape[3:])


def _public():
    from .. import paged  # the package's public functions (this module is imported before they exist)
    return paged


def _rotary_append_inplace(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_pages: torch.Tensor,
                           v_pages: torch.Tensor, block_tables: torch.Tensor, cache_seqlens: torch.Tensor,
                           cu_seqlens: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                           positions: Optional[torch.Tensor], interleaved: bool, check: Optional[bool]) -> None:
    _public().paged_rotary_kv_cache_append.eager(q, k, v, k_pages, v_pages, block_tables, cache_seqlens, cu_seqlens,
                                                 cos, sin, positions, interleaved=interleaved, inplace=True,
                                                 check=check)


_rotary_append_inplace_op = library_op("paged_rotary_kv_cache_append_", _rotary_append_inplace, lambda *a: None,
                                       mutates=("q", "k_pages", "v_pages"))


def route_paged_rotary_kv_cache_append(q, k, v, k_pages, v_pages, block_tables, cache_seqlens, cu_seqlens, cos, sin,
                                       positions=None, *, interleaved=False, inplace=False, check=None):
    if inplace:
        _rotary_append_inplace_op(q, k, v, k_pages, v_pages, block_tables, cache_seqlens, cu_seqlens, cos, sin,
                                  positions, interleaved, check)
        return q
    return torch.ops.opforge.paged_rotary_kv_cache_append(q, k, v, k_pages, v_pages, block_tables, cache_seqlens,
                                                          cu_seqlens, cos, sin, positions, interleaved=interleaved,
                                                          check=check)
