"""torch.compile support for rotary and the KV-cache append: fakes, and the in-place variants.

``kv_cache_append`` writes its caches: one op that declares them mutated. ``inplace=True`` makes
``rotary_embedding`` write q and k (and ``rotary_kv_cache_append`` write q), which one schema
cannot say, so while compiling ``route_*`` sends ``inplace=True`` to an op that declares those
writes (``opforge::rotary_embedding_``, ``opforge::rotary_kv_cache_append_``) and returns the
written inputs, and the rest to the functional op.
"""
from __future__ import annotations

from typing import Any, Optional

import torch

from ...runtime.compile_support import library_op


def rotary_embedding(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                     positions: torch.Tensor, *, interleaved: bool = False,
                     inplace: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    return q.new_empty(q.shape), k.new_empty(k.shape)


def kv_cache_append(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    cache_seqlens: torch.Tensor, *, check: Optional[bool] = None) -> None:
    return None


def rotary_kv_cache_append(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                           v_cache: torch.Tensor, cache_seqlens: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                           positions: Optional[torch.Tensor] = None, *, interleaved: bool = False,
                           inplace: bool = False, check: Optional[bool] = None) -> torch.Tensor:
    return q.new_empty(q.shape)


#: The family's public functions, handed over by the package once they exist (``bind``): the
#: custom ops run their ``.eager`` form.
_public: dict[str, Any] = {}


def bind(**functions: Any) -> None:
    """Give this module the family's public functions (the package calls it after defining them)."""
    _public.update(functions)


def _rotary_inplace(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                    positions: torch.Tensor, interleaved: bool) -> None:
    _public["rotary_embedding"].eager(q, k, cos, sin, positions, interleaved=interleaved, inplace=True)


def _fused_inplace(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                   v_cache: torch.Tensor, cache_seqlens: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                   positions: Optional[torch.Tensor], interleaved: bool, check: Optional[bool]) -> None:
    _public["rotary_kv_cache_append"].eager(q, k, v, k_cache, v_cache, cache_seqlens, cos, sin, positions,
                                           interleaved=interleaved, inplace=True, check=check)


_rotary_inplace_op = library_op("rotary_embedding_", _rotary_inplace, lambda *a: None, mutates=("q", "k"))
_fused_inplace_op = library_op("rotary_kv_cache_append_", _fused_inplace, lambda *a: None,
                               mutates=("q", "k_cache", "v_cache"))


def route_rotary_embedding(q, k, cos, sin, positions, *, interleaved=False, inplace=False):
    if inplace:
        _rotary_inplace_op(q, k, cos, sin, positions, interleaved)
        return q, k
    return torch.ops.opforge.rotary_embedding(q, k, cos, sin, positions, interleaved=interleaved)


def route_rotary_kv_cache_append(q, k, v, k_cache, v_cache, cache_seqlens, cos, sin, positions=None, *,
                                 interleaved=False, inplace=False, check=None):
    if inplace:
        _fused_inplace_op(q, k, v, k_cache, v_cache, cache_seqlens, cos, sin, positions, interleaved, check)
        return q
    return torch.ops.opforge.rotary_kv_cache_append(q, k, v, k_cache, v_cache, cache_seqlens, cos, sin, positions,
                                                    interleaved=interleaved, check=check)
