"""The paged KV cache: append and attention over block tables, for ragged batches of sequences.

A layer's cache is one K and one V page pool, ``(num_blocks, block_size, Hkv, D)``, shared by all
sequences; row ``b`` of ``block_tables`` ``(B, max_blocks)`` lists the blocks of sequence ``b`` in
order (entry ``j`` holds its positions ``j * block_size .. (j + 1) * block_size - 1``), so blocks
can lie anywhere in the pool and several sequences can share one (a common prefix). The new
tokens of a step are packed ``(T, H, D)`` with ``cu_seqlens`` ``(B + 1,)``: sequence ``b`` owns
rows ``cu_seqlens[b] : cu_seqlens[b + 1]``, so one call serves decode tokens and prefill chunks.

Every call validates its arguments, asks the registry for a variant (Triton on CUDA/ROCm, Metal
on MPS, the torch path elsewhere), runs it and, inside ``opforge.trace()``, records it.
"""
from __future__ import annotations

import weakref
from typing import Any, Optional

import torch

from ...runtime import alloc, dispatch
from ...runtime.compile_support import compiled
from ...runtime.lru import LRU
from . import fakes, reference
from .problem import (OPS, AppendCall, AttentionCall, RotaryAppendCall, attention_wants_check, check_append_values,
                      check_attention_values, prepare_append, prepare_attention, prepare_rotary_append, signature,
                      wants_check)

# Signatures of calls that passed validation (with their problems): a later call with the same
# signature skips the metadata checks, which cost more host time than a decode step's kernel.
_valid_append: LRU[tuple, object] = LRU(4096, "paged_kv_cache_append.valid_signatures")
_valid_rotary_append: LRU[tuple, object] = LRU(4096, "paged_rotary_kv_cache_append.valid_signatures")
_valid_attention: LRU[tuple, tuple] = LRU(4096, "paged_attention.valid_signatures")


class _CheckedValues:
    """The index tensors whose values last passed an op's host check, with their version counters:
    a model calls an op once per layer with the same tables and lengths, so the check runs once
    per step. A tensor changed in place (its version moves) or a new tensor is checked again."""

    def __init__(self) -> None:
        self._last: tuple = (None, ())

    def seen(self, key: Any, tensors: tuple) -> bool:
        last_key, refs = self._last
        return last_key == key and len(refs) == len(tensors) and \
            all(ref() is t and t._version == version for (ref, version), t in zip(refs, tensors))

    def remember(self, key: Any, tensors: tuple) -> None:
        if any(t.is_inference() for t in tensors):    # no version counter: checked every call
            self._last = (None, ())
            return
        self._last = (key, tuple((weakref.ref(t), t._version) for t in tensors))


_checked_append, _checked_rotary_append, _checked_attention = _CheckedValues(), _CheckedValues(), _CheckedValues()


def _indices_as_given(call, block_tables, cache_seqlens, cu_seqlens) -> bool:
    """Validation kept the caller's index tensors (no contiguous copy): the signature may be reused."""
    return call.block_tables is block_tables and call.cache_seqlens is cache_seqlens and call.cu_seqlens is cu_seqlens


def _fast(call, problem) -> bool:
    """The fast torch forms apply: float32/half CPU tensors (whose indices the public function checked)."""
    return problem.device_type == "cpu" and problem.dtype != torch.float64


def _torch_launch(call):
    if isinstance(call, AttentionCall):
        attend = reference.fast_paged_attention if _fast(call, call.problem) else reference.paged_attention
        return attend(call.q, call.k_pages, call.v_pages, call.block_tables, call.cache_seqlens, call.cu_seqlens,
                      call.scale)
    if isinstance(call, RotaryAppendCall):
        app = call.app
        append = reference.fast_paged_rotary_kv_cache_append if _fast(call, call.problem) \
            else reference.paged_rotary_kv_cache_append
        return append(call.q, app.k, app.v, app.k_pages, app.v_pages, app.block_tables, app.cache_seqlens,
                      app.cu_seqlens, call.cos, call.sin, call.positions, call.problem.interleaved, call.inplace)
    return reference.paged_kv_cache_append(call.k_pages, call.v_pages, call.k, call.v, call.block_tables,
                                           call.cache_seqlens, call.cu_seqlens)


def _problem_builder(op: str):
    """``explain``'s problem for an op, from the op's own arguments."""
    def append(k_pages, v_pages, k, v, block_tables, cache_seqlens, cu_seqlens, *, check=None):
        return prepare_append(k_pages, v_pages, k, v, block_tables, cache_seqlens, cu_seqlens).problem

    def rotary_append(q, k, v, k_pages, v_pages, block_tables, cache_seqlens, cu_seqlens, cos, sin, positions=None, *,
                      interleaved=False, inplace=False, check=None):
        return prepare_rotary_append(q, k, v, k_pages, v_pages, block_tables, cache_seqlens, cu_seqlens, cos, sin,
                                     positions, interleaved, inplace).problem

    def attention(q, k_pages, v_pages, block_tables, cache_seqlens, cu_seqlens, *, max_query_len, scale=None):
        return prepare_attention(q, k_pages, v_pages, block_tables, cache_seqlens, cu_seqlens, max_query_len,
                                 scale).problem

    return {"paged_kv_cache_append": append, "paged_rotary_kv_cache_append": rotary_append,
            "paged_attention": attention}[op]


def _register() -> None:
    tables = dispatch.kernel_tables(__name__)   # per backend: a table per op, None where not importable
    for op in OPS:
        dispatch.register_family((op,), [(name, None if table is None else table.get(op, ()))
                                         for name, table in tables], _torch_launch,
                                 "torch composite ops over each sequence's own slots (host loop), float32 compute "
                                 "(float64 for float64 inputs)", _problem_builder)


@compiled("paged_kv_cache_append", fakes.paged_kv_cache_append, mutates=("k_pages", "v_pages"))
def paged_kv_cache_append(k_pages: torch.Tensor, v_pages: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                          block_tables: torch.Tensor, cache_seqlens: torch.Tensor, cu_seqlens: torch.Tensor, *,
                          check: Optional[bool] = None) -> None:
    """Write a step's new keys and values into the page pools, each at its sequence's next positions.

    Token ``cu_seqlens[b] + i`` of k and v goes to position ``cache_seqlens[b] + i`` of sequence
    ``b``: block ``block_tables[b, p // block_size]``, slot ``p % block_size``. In place; the caller
    advances ``cache_seqlens`` afterwards (by ``cu_seqlens[b + 1] - cu_seqlens[b]``).

    Args:
        k_pages, v_pages: (num_blocks, block_size, Hkv, D) float32, float16 or bfloat16 (float64
            on the torch path), one shape and dtype, contiguous last dimension. Any block size
            from 1 runs; 16 is the usual one (the kernels tile keys independently of it).
        k, v: (T, Hkv, D) new tokens in the pools' dtype, packed by sequence.
        block_tables: (B, max_blocks) int32 (or int64): the blocks of each sequence, in order.
        cache_seqlens: (B,) int32 (or int64): the positions of each sequence filled before the call.
        cu_seqlens: (B + 1,) int32 (or int64): 0, then the running sum of new tokens per
            sequence (``cu_seqlens[-1] == T``).
        check: read the index tensors on the host and raise before anything is written if
            ``cu_seqlens`` is not 0 .. T non-decreasing (``ValueError``), or a new position lies
            past its table row's capacity ``max_blocks * block_size`` or below 0, or a table entry
            it needs is not a block of the pool (``IndexError``). Always on CPU; on a GPU by
            default except while a CUDA graph is being captured; ``check=False`` on a hot path.
            Unchecked, the kernels never write outside the pools: such tokens are skipped.

    Example:
        >>> import torch, opforge
        >>> kp, vp = torch.zeros(4, 2, 1, 8), torch.zeros(4, 2, 1, 8)     # 4 blocks of 2 slots
        >>> tables = torch.tensor([[3, 0], [1, 2]], dtype=torch.int32)
        >>> lens = torch.tensor([1, 0], dtype=torch.int32)                 # sequence 0 holds 1 token
        >>> cu = torch.tensor([0, 1, 4], dtype=torch.int32)                # 1 new token, then 3
        >>> k = torch.arange(1.0, 5.0).view(4, 1, 1).repeat(1, 1, 8)
        >>> opforge.paged_kv_cache_append(kp, vp, k, k, tables, lens, cu)
        >>> kp[:, :, 0, 0].tolist()     # seq 0 -> block 3 slot 1; seq 1 -> block 1 slots 0-1, block 2 slot 0
        [[0.0, 0.0], [2.0, 3.0], [4.0, 0.0], [0.0, 1.0]]
    """
    sig = signature(k_pages, v_pages, k, v, block_tables, cache_seqlens, cu_seqlens)
    problem = _valid_append.get(sig)
    if problem is not None:
        call = AppendCall(problem, k_pages, v_pages, k, v, block_tables, cache_seqlens, cu_seqlens)
    else:
        call = prepare_append(k_pages, v_pages, k, v, block_tables, cache_seqlens, cu_seqlens)
        if _indices_as_given(call, block_tables, cache_seqlens, cu_seqlens):
            _valid_append.put(sig, call.problem)
    if wants_check(check, call.problem.device_type):
        indices = (call.block_tables, call.cache_seqlens, call.cu_seqlens)
        if not _checked_append.seen(call.problem, indices):
            check_append_values(call)
            _checked_append.remember(call.problem, indices)
    if call.k.numel() == 0:
        return None
    dispatch.run("paged_kv_cache_append", call, call.k)
    return None


@compiled("paged_rotary_kv_cache_append", fakes.paged_rotary_kv_cache_append, mutates=("k_pages", "v_pages"),
          route=fakes.route_paged_rotary_kv_cache_append)
def paged_rotary_kv_cache_append(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_pages: torch.Tensor,
                                 v_pages: torch.Tensor, block_tables: torch.Tensor, cache_seqlens: torch.Tensor,
                                 cu_seqlens: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                                 positions: Optional[torch.Tensor] = None, *, interleaved: bool = False,
                                 inplace: bool = False, check: Optional[bool] = None) -> torch.Tensor:
    """Rotary embedding of q and k, and ``paged_kv_cache_append`` of the rotated k and of v, in one pass.

    Args:
        q: (T, Hq, D) new queries, the pools' dtype, packed as k.
        k, v, k_pages, v_pages, block_tables, cache_seqlens, cu_seqlens, check: as in
            ``paged_kv_cache_append`` (the check also covers default positions against the
            cos/sin table: ``IndexError``).
        cos, sin: float32 tables (max_positions, R/2), R = 2 * columns <= D; features R..D-1 pass
            through. Rotate-half pairs ``(i, i + R/2)``; ``interleaved=True`` pairs ``(2i, 2i + 1)``.
        positions: (T,) int32/int64 rotation positions; by default each token's cache position
            ``cache_seqlens[b] + i``. A position outside the table rotates to zeros (on CPU
            tensors it raises first).
        inplace: write the rotated q into q and return it (k is never modified).

    Returns:
        The rotated q, (T, Hq, D) (q itself when ``inplace``). The caller advances ``cache_seqlens``.

    Example:
        >>> import torch, opforge
        >>> q, k, v = torch.randn(3, 4, 8), torch.randn(3, 2, 8), torch.randn(3, 2, 8)
        >>> kp, vp = torch.zeros(4, 4, 2, 8), torch.zeros(4, 4, 2, 8)
        >>> angles = torch.arange(16.0)[:, None] * torch.tensor([1.0, 0.1, 0.01, 0.001])
        >>> tables, lens = torch.tensor([[2], [0]], dtype=torch.int32), torch.tensor([3, 0], dtype=torch.int32)
        >>> cu = torch.tensor([0, 1, 3], dtype=torch.int32)
        >>> q_rot = opforge.paged_rotary_kv_cache_append(q, k, v, kp, vp, tables, lens, cu, angles.cos(), angles.sin())
        >>> pos = torch.tensor([3, 0, 1])
        >>> q2, k2 = opforge.rotary_embedding(q.transpose(0, 1)[None], k.transpose(0, 1)[None], angles.cos(),
        ...                                   angles.sin(), pos)
        >>> (torch.allclose(q_rot, q2[0].transpose(0, 1), atol=1e-6)
        ...  and torch.allclose(kp[2, 3], k2[0, :, 0], atol=1e-6))
        True
        >>> torch.equal(vp[0, :2], v[1:])
        True
    """
    sig = signature(q, k, v, k_pages, v_pages, block_tables, cache_seqlens, cu_seqlens, cos, sin, positions,
                    interleaved, inplace)
    problem = _valid_rotary_append.get(sig)
    if problem is not None:
        app = AppendCall(problem, k_pages, v_pages, k, v, block_tables, cache_seqlens, cu_seqlens)
        call = RotaryAppendCall(problem, app, q, cos, sin, positions, inplace)
    else:
        call = prepare_rotary_append(q, k, v, k_pages, v_pages, block_tables, cache_seqlens, cu_seqlens, cos, sin,
                                     positions, interleaved, inplace)
        if _indices_as_given(call.app, block_tables, cache_seqlens, cu_seqlens) and call.positions is positions:
            _valid_rotary_append.put(sig, call.problem)
    if wants_check(check, call.problem.device_type):
        app = call.app
        indices = (app.block_tables, app.cache_seqlens, app.cu_seqlens) + \
            ((call.positions,) if call.positions is not None else ())
        key = (call.problem, call.cos.shape[0], call.positions is None)
        if not _checked_rotary_append.seen(key, indices):
            check_append_values(app)
            _check_positions(call)
            _checked_rotary_append.remember(key, indices)
    if call.q.numel() == 0 and call.app.k.numel() == 0:
        return q if inplace else torch.empty_like(q)
    return dispatch.run("paged_rotary_kv_cache_append", call, call.q)


def _check_positions(call: RotaryAppendCall) -> None:
    rows = call.cos.shape[0]
    app = call.app
    if call.positions is not None:
        pos = call.positions.to("cpu", torch.int64)
    else:
        _, pos, _ = reference.token_slots(app.block_tables.cpu(), app.cache_seqlens.cpu(), app.cu_seqlens.cpu(),
                                          app.k.shape[0], app.problem.block_size)
    if pos.numel() == 0:
        return
    lo, hi = int(pos.min()), int(pos.max())
    if lo < 0 or hi >= rows:
        raise IndexError(f"positions must be in [0, {rows}) (the rows of cos/sin), got {lo if lo < 0 else hi}; "
                         "nothing was written")


@compiled("paged_attention", fakes.paged_attention)
def paged_attention(q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor, block_tables: torch.Tensor,
                    cache_seqlens: torch.Tensor, cu_seqlens: torch.Tensor, *, max_query_len: int,
                    scale: Optional[float] = None) -> torch.Tensor:
    """Causal attention of a step's packed queries over each sequence's paged keys and values.

    Sequence ``b``'s ``n = cu_seqlens[b + 1] - cu_seqlens[b]`` queries are the last ``n`` of its
    ``cache_seqlens[b]`` positions (the new tokens are already appended: here ``cache_seqlens``
    counts them, as in ``decode_attention``): query ``i`` sees positions ``j <= cache_seqlens[b] -
    n + i``, the whole prefix and the new tokens up to itself. A query that sees no position
    returns zeros.

    Args:
        q: (T, Hq, D) float32, float16 or bfloat16 (float64 on the torch path), the pools' dtype;
            Hq a multiple of Hkv (query head h reads key/value head ``h // (Hq // Hkv)``).
        k_pages, v_pages, block_tables, cu_seqlens: as in ``paged_kv_cache_append``.
        cache_seqlens: (B,) int32 (or int64): each sequence's length, new tokens included.
        max_query_len: a host int >= the most new tokens of any sequence. It picks the kernel
            (split-KV decode up to 16, tiled prefill above) and sizes the launch, so the call never
            reads a device tensor on the host: capturable in a CUDA graph, replayed with new
            lengths and tables. Above 16, the sequences of the step with at most 16 new tokens
            still run the decode kernel. Rows of a sequence with more queries than
            ``max_query_len`` are not computed.
        scale: multiplies the scores; ``1 / sqrt(D)`` by default.

    Returns:
        (T, Hq, D) in q's dtype. Scores and the softmax are float32 with a running maximum.

    Positions past a sequence's length and blocks not in its table are never read. On CPU tensors
    (or with ``OPFORGE_CHECK_SEQLENS=1``, which syncs) ``cu_seqlens``, the lengths against the
    tables' capacity, the block ids used and ``max_query_len`` are checked first; on a GPU the
    kernels clamp lengths to the capacity and read keys of an out-of-pool block id as zeros.

    Example:
        >>> import torch, opforge
        >>> kp, vp = torch.randn(6, 4, 2, 16), torch.randn(6, 4, 2, 16)      # 6 blocks of 4 slots
        >>> tables = torch.tensor([[5, 1], [2, 0]], dtype=torch.int32)
        >>> lens = torch.tensor([6, 3], dtype=torch.int32)
        >>> cu = torch.tensor([0, 1, 4], dtype=torch.int32)   # 1 query (decode), then 3 (a prefill)
        >>> q = torch.randn(4, 8, 16)
        >>> out = opforge.paged_attention(q, kp, vp, tables, lens, cu, max_query_len=3)
        >>> k1, v1 = kp[2, :3].transpose(0, 1)[None], vp[2, :3].transpose(0, 1)[None]  # sequence 1
        >>> ref = opforge.attention(q[1:].transpose(0, 1)[None], k1, v1, causal=True)
        >>> torch.allclose(out[1:], ref[0].transpose(0, 1), atol=1e-5)
        True
    """
    sig = signature(q, k_pages, v_pages, block_tables, cache_seqlens, cu_seqlens, max_query_len, scale)
    known = _valid_attention.get(sig)
    if known is not None:
        call = AttentionCall(known[0], q, k_pages, v_pages, block_tables, cache_seqlens, cu_seqlens, known[1])
    else:
        call = prepare_attention(q, k_pages, v_pages, block_tables, cache_seqlens, cu_seqlens, max_query_len, scale)
        if _indices_as_given(call, block_tables, cache_seqlens, cu_seqlens):
            _valid_attention.put(sig, (call.problem, call.scale))
    if attention_wants_check(call.problem.device_type):
        indices = (call.block_tables, call.cache_seqlens, call.cu_seqlens)
        if not _checked_attention.seen(call.problem, indices):
            check_attention_values(call)
            _checked_attention.remember(call.problem, indices)
    p = call.problem
    if p.tokens * p.q_heads * p.head_dim == 0:
        return alloc.empty((p.tokens, p.q_heads, p.head_dim), q.dtype, q.device)
    return dispatch.run("paged_attention", call, call.q)


_register()
fakes.bind(paged_rotary_kv_cache_append=paged_rotary_kv_cache_append)

__all__ = ["paged_kv_cache_append", "paged_rotary_kv_cache_append", "paged_attention"]
