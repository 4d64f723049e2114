"""The paged-cache ops as benchmark entries of the ``attention`` suite, against opforge's own
kernels on the contiguous cache (the ``opforge-contiguous`` implementation).

Shapes (bf16 by default; block placement shuffled across the pool, as a server's pool is):

* ``paged_decode``: ``(B, Hq, Hkv, ctx, D, block_size)``: one new token per sequence over ``ctx``
  positions. Peer: ``decode_attention`` on packed (B, Hkv, ctx, D) caches holding the same values.
  Bytes: K and V read, q read, out written. Target: >= 0.95x the contiguous kernel.
* ``paged_prefill``: ``(B, Hq, Hkv, prefix, chunk, D, block_size)``: ``chunk`` new tokens per
  sequence after ``prefix`` cached ones. Peer: causal ``attention`` of (B, Hq, chunk, D) queries
  over (B, Hkv, prefix + chunk, D) keys and values. Target: >= 0.9x.
* ``paged_kv_cache_append``: ``(B, chunk, Hkv, D, block_size)``: ``chunk`` new tokens of each of
  B sequences written into a pool. Bytes: k and v read, their slots written. Target: >= 85% of
  the measured copy bandwidth. No peer.

Outputs are compared in the contiguous ops' layouts: the paged outputs are viewed (no copy) as
(B, Hq, Sq, D), so neither side pays for a layout change. Total positions per case stay at or
below 256K (the float64 oracle of the pools must fit next to them on one GPU).
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from opforge.bench.results import CaseResult
from opforge.bench.spec import CONTIGUOUS, OPFORGE, BuildContext, Inputs, OpSpec, Shape, SuiteEntry, Target, \
    register_op

DECODE_SHAPES = ((1, 32, 8, 1024, 128, 16), (1, 32, 8, 8192, 128, 16), (1, 32, 8, 32768, 128, 16),
                 (8, 32, 8, 8192, 128, 16), (8, 32, 8, 32768, 128, 16), (32, 32, 8, 1024, 128, 16),
                 (32, 32, 8, 8192, 128, 16), (64, 32, 8, 1024, 128, 16), (64, 32, 8, 4096, 128, 16))
PREFILL_SHAPES = ((1, 32, 8, 0, 2048, 128, 16), (4, 32, 8, 0, 512, 128, 16), (2, 32, 8, 2048, 1024, 128, 16),
                  (1, 32, 8, 8192, 2048, 128, 16), (4, 32, 8, 4096, 512, 128, 16))
APPEND_SHAPES = ((1, 2048, 8, 128, 16), (4, 2048, 8, 128, 16), (16, 512, 8, 128, 16))
DECODE_GOAL, PREFILL_GOAL, APPEND_COPY_PCT = 0.95, 0.90, 85.0


def _normal(shape: Shape, dtype: torch.dtype, device: torch.device, g: torch.Generator) -> torch.Tensor:
    return torch.randn(shape, generator=g, device=device, dtype=torch.float32).to(dtype)


def _shuffled_tables(batch: int, blocks_per_seq: int, device: torch.device, g: torch.Generator) -> torch.Tensor:
    """(B, blocks_per_seq) int32: every block of the pool used once, in random order."""
    perm = torch.randperm(batch * blocks_per_seq, generator=g, device="cpu")
    return perm.view(batch, blocks_per_seq).to(device=device, dtype=torch.int32)


def _paged_copy(dense: torch.Tensor, tables: torch.Tensor, block_size: int) -> torch.Tensor:
    """The pages of packed (B, Hkv, S, D) caches under ``tables``: (num_blocks, block_size, Hkv, D)."""
    b, hkv, s, d = dense.shape
    blocks = dense.transpose(1, 2).reshape(b * (s // block_size), block_size, hkv, d)
    pages = torch.empty_like(blocks)
    pages[tables.flatten().long()] = blocks
    return pages


def _cache_inputs(b: int, hkv: int, s: int, d: int, bs: int, dtype, device, g) -> tuple[torch.Tensor, ...]:
    kc, vc = _normal((b, hkv, s, d), dtype, device, g), _normal((b, hkv, s, d), dtype, device, g)
    tables = _shuffled_tables(b, s // bs, device, g)
    return kc, vc, tables, _paged_copy(kc, tables, bs), _paged_copy(vc, tables, bs)


def _decode_inputs(shape: Shape, dtype: torch.dtype, device: torch.device, g: torch.Generator) -> Inputs:
    b, hq, hkv, ctx, d, bs = shape
    kc, vc, tables, kp, vp = _cache_inputs(b, hkv, ctx, d, bs, dtype, device, g)
    lens = torch.full((b,), ctx, dtype=torch.int32, device=device)
    cu = torch.arange(b + 1, dtype=torch.int32, device=device)
    return _normal((b, hq, d), dtype, device, g), kp, vp, tables, lens, cu, kc, vc


def _decode_bytes(shape: Shape, dtype: torch.dtype) -> int:
    b, hq, hkv, ctx, d, bs = shape
    return (2 * b * hkv * ctx * d + 2 * b * hq * d) * dtype.itemsize + b * (ctx // bs) * 4


def _decode_paged(ctx: BuildContext) -> Callable[..., Any]:
    import opforge

    def run(q, kp, vp, tables, lens, cu, kc, vc):
        return opforge.paged_attention(q, kp, vp, tables, lens, cu, max_query_len=1).unsqueeze(2)
    return run


def _decode_contiguous(ctx: BuildContext) -> Callable[..., Any]:
    import opforge
    return lambda q, kp, vp, tables, lens, cu, kc, vc: opforge.decode_attention(q.unsqueeze(2), kc, vc, lens)


def _decode_ref(q, kp, vp, tables, lens, cu, kc, vc):
    from opforge.ops.paged import reference
    return reference.paged_attention(q, kp, vp, tables, lens, cu, q.shape[-1] ** -0.5).unsqueeze(2)


def _prefill_inputs(shape: Shape, dtype: torch.dtype, device: torch.device, g: torch.Generator) -> Inputs:
    b, hq, hkv, prefix, chunk, d, bs = shape
    total = prefix + chunk
    kc, vc, tables, kp, vp = _cache_inputs(b, hkv, total, d, bs, dtype, device, g)
    lens = torch.full((b,), total, dtype=torch.int32, device=device)
    cu = torch.arange(0, b * chunk + 1, chunk, dtype=torch.int32, device=device)
    q = _normal((b, hq, chunk, d), dtype, device, g)
    q_packed = q.transpose(1, 2).reshape(b * chunk, hq, d)
    return q_packed, kp, vp, tables, lens, cu, q, kc, vc


def _prefill_bytes(shape: Shape, dtype: torch.dtype) -> int:
    b, hq, hkv, prefix, chunk, d, bs = shape
    return (2 * b * hkv * (prefix + chunk) * d + 2 * b * hq * chunk * d) * dtype.itemsize


def _as_heads(out: torch.Tensor, b: int) -> torch.Tensor:
    """(B * chunk, Hq, D) viewed as (B, Hq, chunk, D): no copy."""
    t, hq, d = out.shape
    return out.view(b, t // b, hq, d).transpose(1, 2)


def _prefill_paged(ctx: BuildContext) -> Callable[..., Any]:
    import opforge
    b, chunk = ctx.shape[0], ctx.shape[4]

    def run(qp, kp, vp, tables, lens, cu, q, kc, vc):
        return _as_heads(opforge.paged_attention(qp, kp, vp, tables, lens, cu, max_query_len=chunk), b)
    return run


def _prefill_contiguous(ctx: BuildContext) -> Callable[..., Any]:
    import opforge
    return lambda qp, kp, vp, tables, lens, cu, q, kc, vc: opforge.attention(q, kc, vc, causal=True)


def _prefill_ref(qp, kp, vp, tables, lens, cu, q, kc, vc):
    from opforge.ops.paged import reference
    return _as_heads(reference.paged_attention(qp, kp, vp, tables, lens, cu, qp.shape[-1] ** -0.5), q.shape[0])


def _append_inputs(shape: Shape, dtype: torch.dtype, device: torch.device, g: torch.Generator) -> Inputs:
    b, chunk, hkv, d, bs = shape
    blocks = -(-chunk // bs)
    tables = _shuffled_tables(b, blocks, device, g)
    kp = _normal((b * blocks, bs, hkv, d), dtype, device, g)
    vp = _normal((b * blocks, bs, hkv, d), dtype, device, g)
    lens = torch.zeros(b, dtype=torch.int32, device=device)
    cu = torch.arange(0, b * chunk + 1, chunk, dtype=torch.int32, device=device)
    return kp, vp, _normal((b * chunk, hkv, d), dtype, device, g), _normal((b * chunk, hkv, d), dtype, device, g), \
        tables, lens, cu


def _append_bytes(shape: Shape, dtype: torch.dtype) -> int:
    b, chunk, hkv, d, bs = shape
    return 4 * b * chunk * hkv * d * dtype.itemsize


def _append(ctx: BuildContext) -> Callable[..., Any]:
    import opforge

    def run(kp, vp, k, v, tables, lens, cu):
        opforge.paged_kv_cache_append(kp, vp, k, v, tables, lens, cu, check=False)
        return kp, vp
    return run


def _append_ref(kp, vp, k, v, tables, lens, cu):
    from opforge.ops.paged import reference
    kp, vp = kp.clone(), vp.clone()
    reference.paged_kv_cache_append(kp, vp, k, v, tables, lens, cu)
    return kp, vp


PAGED_DECODE = register_op(OpSpec("paged_decode", _decode_inputs, _decode_ref, _decode_bytes,
                                  {OPFORGE: _decode_paged, CONTIGUOUS: _decode_contiguous}))
PAGED_PREFILL = register_op(OpSpec("paged_prefill", _prefill_inputs, _prefill_ref, _prefill_bytes,
                                   {OPFORGE: _prefill_paged, CONTIGUOUS: _prefill_contiguous}))
PAGED_APPEND = register_op(OpSpec("paged_kv_cache_append", _append_inputs, _append_ref, _append_bytes,
                                  {OPFORGE: _append}))

ENTRIES = [SuiteEntry("paged_decode", DECODE_SHAPES, (torch.bfloat16,)),
           SuiteEntry("paged_prefill", PREFILL_SHAPES, (torch.bfloat16,)),
           SuiteEntry("paged_kv_cache_append", APPEND_SHAPES, (torch.bfloat16,))]


def _versus_contiguous(op: str, goal: float) -> Target:
    def check(case: CaseResult) -> tuple[bool, str] | None:
        if case.op != op:
            return None
        mine, theirs = case.time(OPFORGE, "gpu_us"), case.time(CONTIGUOUS, "gpu_us")
        if mine is None or theirs is None:
            return (False, "no opforge time") if mine is None and theirs is not None else None
        return theirs / mine >= goal, f"{theirs / mine:.2f}x the contiguous kernel (goal {goal:g}x)"

    return Target(f"{op} >= {goal:g}x opforge on the contiguous cache (GPU time)", check)


def _append_bandwidth() -> Target:
    def check(case: CaseResult) -> tuple[bool, str] | None:
        if case.op != "paged_kv_cache_append":
            return None
        r = case.results.get(OPFORGE)
        if r is None or r.pct_copy is None:
            return None
        return r.pct_copy >= APPEND_COPY_PCT, f"{r.pct_copy:.1f}% of copy (goal {APPEND_COPY_PCT:g}%)"

    return Target(f"paged_kv_cache_append >= {APPEND_COPY_PCT:g}% of copy bandwidth", check)


TARGETS = [_versus_contiguous("paged_decode", DECODE_GOAL), _versus_contiguous("paged_prefill", PREFILL_GOAL),
           _append_bandwidth()]
