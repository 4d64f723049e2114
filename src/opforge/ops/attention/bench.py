"""attention (prefill) and decode_attention as benchmark entries, and the ``attention`` suite.

Shapes:

* ``attention`` / ``attention_causal``: ``(B, H, S, D)``; q, k and v each (B, H, S, D), random normal.
  Compute-bound: the report's time ratio matters (TFLOP/s = 4 B H S² D / t, halved when causal);
  the bytes are q, k, v read and out written.
* ``decode_attention``: ``(B, Hq, Hkv, ctx, D)``; one query token per sequence over a cache of
  ``ctx`` tokens, every sequence at full length. Bytes: K and V read, q read, out written.

The ``torch`` peer is ``F.scaled_dot_product_attention`` with torch's own backend choice
(``enable_gqa=True`` for grouped heads; on an H100 in bf16 it picks flash or cuDNN). Targets: no
slower than SDPA, and decode at >= 85% of the measured copy bandwidth.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F

from opforge.bench.spec import OPFORGE, TORCH, BuildContext, Inputs, OpSpec, Shape, Suite, SuiteEntry, register_op, \
    register_suite
from opforge.bench.targets import bandwidth_at_least, no_slower_than

PREFILL_SHAPES = ((16, 32, 1024, 128), (4, 32, 4096, 128), (1, 32, 16384, 128), (16, 32, 1024, 64),
                  (4, 32, 4096, 64))
DECODE_SHAPES = ((1, 32, 8, 8192, 128), (1, 32, 8, 131072, 128), (8, 32, 8, 32768, 128), (32, 32, 8, 8192, 128),
                 (32, 8, 1, 32768, 128))


def _normal(shape: Shape, dtype: torch.dtype, device: torch.device, g: torch.Generator) -> torch.Tensor:
    return torch.randn(shape, generator=g, device=device, dtype=torch.float32).to(dtype)


def _prefill_inputs(shape: Shape, dtype: torch.dtype, device: torch.device, g: torch.Generator) -> Inputs:
    return tuple(_normal(shape, dtype, device, g) for _ in range(3))


def _decode_inputs(shape: Shape, dtype: torch.dtype, device: torch.device, g: torch.Generator) -> Inputs:
    b, hq, hkv, ctx, d = shape
    lens = torch.full((b,), ctx, dtype=torch.int32, device=device)
    return (_normal((b, hq, 1, d), dtype, device, g), _normal((b, hkv, ctx, d), dtype, device, g),
            _normal((b, hkv, ctx, d), dtype, device, g), lens)


def _prefill_bytes(shape: Shape, dtype: torch.dtype) -> int:
    b, h, s, d = shape
    return 4 * b * h * s * d * dtype.itemsize


def _decode_bytes(shape: Shape, dtype: torch.dtype) -> int:
    b, hq, hkv, ctx, d = shape
    return (2 * b * hkv * ctx * d + 2 * b * hq * d) * dtype.itemsize


def _opforge(causal: bool) -> Callable[[BuildContext], Callable[..., Any]]:
    def build(ctx: BuildContext) -> Callable[..., Any]:
        import opforge
        return lambda q, k, v: opforge.attention(q, k, v, causal=causal)

    return build


def _sdpa(causal: bool) -> Callable[[BuildContext], Callable[..., Any]]:
    def build(ctx: BuildContext) -> Callable[..., Any]:
        return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    return build


def _opforge_decode(ctx: BuildContext) -> Callable[..., Any]:
    import opforge
    return opforge.decode_attention


def _sdpa_decode(ctx: BuildContext) -> Callable[..., Any]:
    return lambda q, kc, vc, lens: F.scaled_dot_product_attention(q, kc, vc, enable_gqa=True)


def _prefill_ref(causal: bool) -> Callable[..., Any]:
    def ref(q, k, v):
        from opforge.ops.attention import reference
        return reference.attention(q, k, v, causal=causal)

    return ref


def _decode_ref(q, kc, vc, lens):
    from opforge.ops.attention import reference
    return reference.decode_attention(q, kc, vc, lens)


ATTENTION = register_op(OpSpec("attention", _prefill_inputs, _prefill_ref(False), _prefill_bytes,
                               {OPFORGE: _opforge(False), TORCH: _sdpa(False)}))
ATTENTION_CAUSAL = register_op(OpSpec("attention_causal", _prefill_inputs, _prefill_ref(True), _prefill_bytes,
                                      {OPFORGE: _opforge(True), TORCH: _sdpa(True)}))
DECODE_ATTENTION = register_op(OpSpec("decode_attention", _decode_inputs, _decode_ref, _decode_bytes,
                                      {OPFORGE: _opforge_decode, TORCH: _sdpa_decode}))

ATTENTION_SUITE = register_suite(
    Suite(
        name="attention",
        description="prefill bf16 (B,H,S,D) causal and not, decode bf16 (B,Hq,Hkv,ctx,D) vs torch SDPA",
        entries=[SuiteEntry("attention", PREFILL_SHAPES, (torch.bfloat16,)),
                 SuiteEntry("attention_causal", PREFILL_SHAPES, (torch.bfloat16,)),
                 SuiteEntry("decode_attention", DECODE_SHAPES, (torch.bfloat16,))],
        impls=(OPFORGE, TORCH),
        metric="gpu_us",
        targets=[no_slower_than(TORCH, "gpu_us"), bandwidth_at_least({"bf16": 85.0}, ops=("decode_attention",))],
    )
)
