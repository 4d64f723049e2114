"""Rotary position embeddings and KV-cache append, the per-token glue around attention.

Every call validates its arguments, asks the registry for a variant (Triton on CUDA/ROCm,
Metal on MPS, the torch path elsewhere), runs it and, inside ``opforge.trace()``, records it.
"""
from __future__ import annotations

from typing import Optional

import torch

from ...runtime import dispatch
from ...runtime.compile_support import compiled
from ...runtime.lru import LRU
from . import fakes, reference
from .problem import (OPS, AppendCall, FusedCall, RotaryCall, append_signature, check_append_range,
                      check_append_writes, check_rotary_writes, check_table_range, fused_signature, prepare_append,
                      prepare_fused, prepare_rotary, rotary_signature)

# Signatures of calls that passed validation, with their problems: a later call with the same
# signature skips validation (its outcome is decided by the signature; CPU value checks still run).
_valid_rotary: LRU[tuple, object] = LRU(4096, "rotary.valid_signatures")
_valid_append: LRU[tuple, object] = LRU(4096, "kv_cache_append.valid_signatures")
_valid_fused: LRU[tuple, tuple] = LRU(4096, "rotary_kv_cache_append.valid_signatures")


def _remember(cache: LRU, sig, problem) -> None:
    if sig is not None:
        cache.put(sig, problem)


def _torch_launch(call):
    if call.problem.dtype != torch.float64 and call.problem.device_type == "cpu":
        return _fast_launch(call)  # positions and lengths were checked on the host
    if isinstance(call, FusedCall):
        rot, app = call.rot, call.app
        return reference.rotary_kv_cache_append(rot.q, rot.k, app.v, app.k_cache, app.v_cache, app.cache_seqlens,
                                                rot.cos, rot.sin, call.positions(), call.problem.interleaved,
                                                rot.inplace)
    if isinstance(call, RotaryCall):
        return reference.rotary_embedding(call.q, call.k, call.cos, call.sin, call.positions,
                                          call.problem.interleaved, call.inplace)
    return reference.kv_cache_append(call.k_cache, call.v_cache, call.k, call.v, call.cache_seqlens)


def _fast_launch(call):
    if isinstance(call, FusedCall):
        rot, app = call.rot, call.app
        return reference.fast_rotary_kv_cache_append(rot.q, rot.k, app.v, app.k_cache, app.v_cache,
                                                     app.cache_seqlens, rot.cos, rot.sin, rot.positions,
                                                     call.problem.interleaved, rot.inplace)
    if isinstance(call, RotaryCall):
        return reference.fast_rotary_embedding(call.q, call.k, call.cos, call.sin, call.positions,
                                               call.problem.interleaved, call.inplace)
    return reference.fast_kv_cache_append(call.k_cache, call.v_cache, call.k, call.v, call.cache_seqlens)


def _problem_builder(op: str):
    def build(*args, **kwargs):
        if op == "rotary_embedding":
            return prepare_rotary(*args, **kwargs).problem
        kwargs.pop("check", None)
        if op == "rotary_kv_cache_append":
            return prepare_fused(*args, **kwargs).problem
        return prepare_append(*args, **kwargs).problem

    return build


def _register() -> None:
    dispatch.register_family(OPS, dispatch.kernel_tables(__name__), _torch_launch,
                             "torch composite ops, float32 compute (float64 for float64 inputs)", _problem_builder)


@compiled("rotary_embedding", fakes.rotary_embedding, route=fakes.route_rotary_embedding)
def rotary_embedding(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                     positions: torch.Tensor, *, interleaved: bool = False,
                     inplace: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q and k by the angles of their tokens' positions (rotary position embedding).

    For every head, pairs of the first R features are rotated:
    ``(x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin)`` with ``cos = cos[positions[b, s], i]``.
    Rotate-half pairs ``(i, i + R/2)`` by default (Llama, Mistral, Qwen, GPT-NeoX);
    ``interleaved=True`` pairs ``(2i, 2i + 1)`` (GPT-J). Features R..D-1 pass through
    unchanged (partial rotary).

    Args:
        q: (B, Hq, S, D) float32, float16 or bfloat16 (float64 on the torch path). Any strides
            with a contiguous last dim: a (B, S, H, D) buffer viewed with ``.transpose(1, 2)``
            is read in place.
        k: (B, Hkv, S, D), q's dtype, device, B, S and D.
        cos, sin: float32 tables (max_positions, R/2); R = 2 * columns <= D.
        positions: int32 or int64, (B, S) or (S,) (shared by the batch).
        interleaved: GPT-J pairing instead of rotate-half.
        inplace: write into q and k and return them (no allocation: the decode path).

    Returns:
        ``(q_out, k_out)``, new packed tensors in q's dtype (q and k themselves when ``inplace``).
        Computed in float32.

    Positions must lie in ``[0, max_positions)``. On CPU tensors that is checked and an
    ``IndexError`` raised before anything is written. On a GPU it is the caller's contract and is
    not checked (a check would synchronize): the kernels never read outside the tables, and a
    token whose position is out of range gets zeros in its rotated features.

    Example:
        >>> import torch, opforge
        >>> q, k = torch.randn(1, 4, 3, 8), torch.randn(1, 2, 3, 8)
        >>> angles = torch.arange(16.0)[:, None] * torch.tensor([1.0, 0.1, 0.01, 0.001])
        >>> cos, sin = angles.cos(), angles.sin()
        >>> q2, k2 = opforge.rotary_embedding(q, k, cos, sin, torch.tensor([5, 6, 7]))
        >>> torch.allclose(q2.norm(dim=-1), q.norm(dim=-1), atol=1e-5)   # a rotation keeps norms
        True
    """
    sig = rotary_signature(q, k, cos, sin, positions, interleaved, inplace)
    problem = _valid_rotary.get(sig) if sig is not None else None
    if problem is not None and type(interleaved) is bool and type(inplace) is bool:
        check_rotary_writes(q, k, cos, sin, positions, inplace)
        if problem.device_type == "cpu":
            check_table_range(positions, cos.shape[0])
        return dispatch.run("rotary_embedding", RotaryCall(problem, q, k, cos, sin, positions, inplace, sig), q)
    call = prepare_rotary(q, k, cos, sin, positions, interleaved, inplace)
    check_rotary_writes(q, k, cos, sin, positions, inplace)
    if q.numel() == 0 and k.numel() == 0:
        return (q, k) if inplace else (torch.empty_like(q), torch.empty_like(k))
    call.sig = sig
    out = dispatch.run("rotary_embedding", call, q)
    _remember(_valid_rotary, sig, call.problem)
    return out


@compiled("kv_cache_append", fakes.kv_cache_append, mutates=("k_cache", "v_cache"))
def kv_cache_append(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    cache_seqlens: torch.Tensor, *, check: Optional[bool] = None) -> None:
    """Write k and v into the caches at positions ``cache_seqlens[b] .. cache_seqlens[b] + S_new - 1``.

    In place; the caller advances ``cache_seqlens`` afterwards (``cache_seqlens += S_new``).

    Args:
        k_cache, v_cache: (B, Hkv, S_max, D), one float dtype (the same for k and v), any
            strides with a contiguous last dim.
        k, v: (B, Hkv, S_new, D), the caches' dtype; any strides with a contiguous last dim.
        cache_seqlens: int32 or int64 (B,): how many positions of each sequence are filled.
        check: read ``cache_seqlens`` on the host and raise ``IndexError`` naming the first
            sequence whose new positions leave ``[0, S_max)``, before anything is written.
            On CPU tensors the check always runs. On a GPU it costs a synchronization, so the
            default is to check except while a CUDA graph is being captured
            (``torch.cuda.is_current_stream_capturing()``); pass ``check=False`` on a hot path.
            Unchecked, the kernel still never writes outside the caches: the positions past
            ``S_max`` (or below 0) are skipped and the others are written.

    Example:
        >>> import torch, opforge
        >>> kc, vc = torch.zeros(2, 1, 4, 8), torch.zeros(2, 1, 4, 8)
        >>> lens = torch.tensor([0, 2])
        >>> opforge.kv_cache_append(kc, vc, torch.ones(2, 1, 2, 8), torch.ones(2, 1, 2, 8), lens)
        >>> kc[:, 0, :, 0].tolist()
        [[1.0, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, 1.0]]
    """
    sig = append_signature(k_cache, v_cache, k, v, cache_seqlens)
    problem = _valid_append.get(sig) if sig is not None else None
    if problem is not None:
        call = AppendCall(problem, k_cache, v_cache, k, v, cache_seqlens, sig)
    else:
        call = prepare_append(k_cache, v_cache, k, v, cache_seqlens)
        if k.numel() == 0:
            return None
        call.sig = sig
    check_append_writes(k_cache, v_cache, k, v, cache_seqlens)
    device_type = call.problem.device_type
    if check is None:
        check = device_type != "cuda" or not torch.cuda.is_current_stream_capturing()
    if check or device_type == "cpu":
        check_append_range(call)
    dispatch.run("kv_cache_append", call, k)
    if problem is None:
        _remember(_valid_append, sig, call.problem)
    return None


@compiled("rotary_kv_cache_append", fakes.rotary_kv_cache_append, mutates=("k_cache", "v_cache"),
          route=fakes.route_rotary_kv_cache_append)
def rotary_kv_cache_append(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                           v_cache: torch.Tensor, cache_seqlens: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                           positions: Optional[torch.Tensor] = None, *, interleaved: bool = False,
                           inplace: bool = False, check: Optional[bool] = None) -> torch.Tensor:
    """``rotary_embedding`` of q and k, then ``kv_cache_append`` of the rotated k and of v, in one pass.

    On CUDA one kernel reads q, k and v once and writes the rotated q, and the rotated k and v
    straight into the caches: the rotated k never goes through memory (the two-call sequence
    writes it and reads it back), and there is one launch instead of two. On Metal and the torch
    path it runs as the two steps.

    Args:
        q, k, cos, sin, interleaved: as in ``rotary_embedding``.
        v, k_cache, v_cache, cache_seqlens: as in ``kv_cache_append`` (k and v: (B, Hkv, S, D)).
        positions: rotation positions, (B, S) or (S,); by default ``cache_seqlens[b] + s``, the
            positions the tokens get in the cache.
        inplace: rotate q in place and return it (k is never modified).
        check: as in ``kv_cache_append``: read ``cache_seqlens`` on the host and raise
            ``IndexError`` before anything is written if a cache position leaves ``[0, S_max)``
            or (with default positions) a position leaves the cos/sin table. Always on CPU; on a
            GPU by default except while a CUDA graph is being captured. Unchecked, out-of-range
            cache positions are not written and out-of-table positions rotate to zeros.

    Returns:
        The rotated q (new, or q itself when ``inplace``). The caller advances ``cache_seqlens``.

    Example:
        >>> import torch, opforge
        >>> q, k, v = torch.randn(1, 4, 2, 8), torch.randn(1, 2, 2, 8), torch.randn(1, 2, 2, 8)
        >>> kc, vc = torch.zeros(1, 2, 6, 8), torch.zeros(1, 2, 6, 8)
        >>> angles = torch.arange(16.0)[:, None] * torch.tensor([1.0, 0.1, 0.01, 0.001])
        >>> lens = torch.tensor([3])
        >>> q_rot = opforge.rotary_kv_cache_append(q, k, v, kc, vc, lens, angles.cos(), angles.sin())
        >>> q2, k2 = opforge.rotary_embedding(q, k, angles.cos(), angles.sin(), torch.tensor([3, 4]))
        >>> (torch.allclose(q_rot, q2, atol=1e-6) and torch.allclose(kc[:, :, 3:5], k2, atol=1e-6)
        ...  and torch.equal(vc[:, :, 3:5], v))
        True
    """
    sig = fused_signature(q, k, v, k_cache, v_cache, cache_seqlens, cos, sin, positions, interleaved, inplace)
    problems = _valid_fused.get(sig) if sig is not None else None
    if problems is not None and type(interleaved) is bool and type(inplace) is bool:
        call = FusedCall(RotaryCall(problems[0], q, k, cos, sin, positions, inplace),
                         AppendCall(problems[1], k_cache, v_cache, k, v, cache_seqlens), sig)
        if problems[0].device_type == "cpu" and positions is not None:
            check_table_range(positions, cos.shape[0])
    else:
        problems = None
        call = prepare_fused(q, k, v, k_cache, v_cache, cache_seqlens, cos, sin, positions, interleaved, inplace)
        if k.numel() == 0 and q.numel() == 0:
            return q if inplace else torch.empty_like(q)
        call.sig = sig
    check_append_writes(k_cache, v_cache, k, v, cache_seqlens, q, inplace, cos, sin, positions)
    device_type = call.problem.device_type
    if check is None:
        check = device_type != "cuda" or not torch.cuda.is_current_stream_capturing()
    if check or device_type == "cpu":
        check_append_range(call.app)
        if positions is None and k.shape[2]:
            last = max(cache_seqlens.tolist(), default=0) + k.shape[2] - 1
            if last >= cos.shape[0]:
                raise IndexError(f"positions must be in [0, {cos.shape[0]}) (the rows of cos/sin), got {last}")
    out = dispatch.run("rotary_kv_cache_append", call, q)
    if problems is None:
        _remember(_valid_fused, sig, (call.rot.problem, call.app.problem))
    return out


fakes.bind(rotary_embedding=rotary_embedding, rotary_kv_cache_append=rotary_kv_cache_append)
_register()

__all__ = ["rotary_embedding", "kv_cache_append", "rotary_kv_cache_append"]
