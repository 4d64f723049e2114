"""Quantized-weight ``linear`` as benchmark entries, and the ``quant`` suite.

An entry's shape is ``(M, N, K)``: x (M, K) times a weight (N, K) quantized from random normal
data (int4 group 128 asymmetric, or int8 per-channel symmetric). The ``torch`` peer is cuBLAS
``F.linear`` on the same weight dequantized to x's dtype (dense: what the quantization saves
against), so both compute the same function and are judged by one oracle,
``x.double() @ w.dequantize(float64).T``.

Bytes that must move: x and the output once, and the weight as the implementation stores it;
``bytes_moved`` counts opforge's packed bytes (int4: N*K/2 codes + 2 float16 per group and row;
int8: N*K + 2 bytes per row), so the % of copy shown is that of the quantized format.

Suite: ``quant`` (``opforge bench --suite quant``): bf16 x at M = 1, 16, 64, 4096 and the
weight shapes 4096x4096, 14336x4096, 4096x14336, 28672x8192, 128256x2048.
Targets (GPU time against cuBLAS on the dense bf16 weight): int4 g128 >= 3x and >= 80% of copy at
M = 1, >= 2x at M = 16, never slower at M = 64, >= 0.8x at M = 4096; int8 >= 1.8x at M = 1 and 16.

Suite: ``decode_gemv`` (``opforge bench --suite decode_gemv``): one row of bf16 x against the
projection shapes of the Llama-3.2-1B and Llama-3-8B decoders, for int4 g128, int8 per-channel
and a dense bf16 weight (``linear_dense``: ``opforge.linear`` with a dense weight, which on CUDA
runs opforge's dense GEMV at M = 1, against cuBLAS ``F.linear``). It repeats in the harness what
``opforge bench --suite model`` measures inside the whole decode step in CUDA graphs; its calls are eager, so
the small shapes are host-bound (first GPU run: at fed7445, ``benchmarks/results/h100/2026-11-23-fed7445/run6``).

Suite: ``quant_batch`` (``opforge bench --suite quant_batch``): int4 g128 at the row counts of
batched decode (M = 1 .. 128) on the same nine projection shapes, the weight in the layout
opforge loads it in on CUDA (``planes``, op ``linear_int4_g128_planes``) against the same weight
in the rows layout (``opforge-rows``) and cuBLAS bf16 (``torch``). Targets: the speed issue's
int4 goals, 3.0x cuBLAS at M = 1, 2.2x at 16, 1.6x at 64.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F

from opforge.bench.impls import eager_impl
from opforge.bench.targets import speedup_at_least
from opforge.bench.spec import OPFORGE, ROWS_LAYOUT, TORCH, BuildContext, Inputs, OpSpec, Shape, Suite, SuiteEntry, \
    register_op, register_suite

WEIGHT_SHAPES = ((4096, 4096), (14336, 4096), (4096, 14336), (28672, 8192), (128256, 2048))
ROWS = (1, 16, 64, 4096)


def _inputs(bits: int, group_size: int, symmetric: bool) -> Callable[..., Inputs]:
    def make(shape: Shape, dtype: torch.dtype, device: torch.device, g: torch.Generator) -> Inputs:
        import opforge
        m, n, k = shape
        w = torch.randn((n, k), generator=g, device=device, dtype=torch.float32).mul_(0.02)
        qw = opforge.quantize_weight(w, bits, group_size, symmetric)
        x = torch.randn((m, k), generator=g, device=device, dtype=torch.float32).to(dtype)
        return (x, qw, qw.dequantize(dtype))

    return make


def _bytes(bits: int, group_size: int, symmetric: bool) -> Callable[[Shape, torch.dtype], int]:
    def count(shape: Shape, dtype: torch.dtype) -> int:
        m, n, k = shape
        groups = 1 if group_size == -1 else k // group_size
        weight = n * k * bits // 8 + n * groups * 2 * (1 if symmetric else 2)
        return weight + (m * k + m * n) * dtype.itemsize

    return count


def reference(x: torch.Tensor, qw: Any, dense: torch.Tensor) -> torch.Tensor:
    """float64 ``x @ W.T`` for the weight the QuantizedWeight holds."""
    return x @ qw.dequantize(torch.float64).T


def _opforge(ctx: BuildContext) -> Callable[..., Any]:
    import opforge
    return lambda x, qw, dense: opforge.linear(x, qw)


def _dense(x: torch.Tensor, qw: Any, dense: torch.Tensor) -> torch.Tensor:
    return F.linear(x, dense)


def _spec(name: str, bits: int, group_size: int, symmetric: bool) -> OpSpec:
    return OpSpec(name=name, make_inputs=_inputs(bits, group_size, symmetric), reference=reference,
                  bytes_moved=_bytes(bits, group_size, symmetric),
                  impls={OPFORGE: _opforge, TORCH: eager_impl(_dense)})


def _dense_inputs(shape: Shape, dtype: torch.dtype, device: torch.device, g: torch.Generator) -> Inputs:
    m, n, k = shape
    w = torch.randn((n, k), generator=g, device=device, dtype=torch.float32).mul_(0.02).to(dtype)
    return (torch.randn((m, k), generator=g, device=device, dtype=torch.float32).to(dtype), w)


def _dense_bytes(shape: Shape, dtype: torch.dtype) -> int:
    m, n, k = shape
    return (n * k + m * k + m * n) * dtype.itemsize


def _opforge_dense(ctx: BuildContext) -> Callable[..., Any]:
    import opforge
    return lambda x, w: opforge.linear(x, w)


LINEAR_DENSE = register_op(OpSpec(name="linear_dense", make_inputs=_dense_inputs,
                                  reference=lambda x, w: x @ w.T, bytes_moved=_dense_bytes,
                                  impls={OPFORGE: _opforge_dense, TORCH: eager_impl(F.linear)}))
LINEAR_INT4 = register_op(_spec("linear_int4_g128", 4, 128, False))
LINEAR_INT8 = register_op(_spec("linear_int8", 8, -1, True))

QUANT_SUITE = register_suite(
    Suite(
        name="quant",
        description="linear with int4 g128 / int8 weights vs cuBLAS bf16 on the same weight, M = 1..4096",
        entries=[SuiteEntry("linear_int4_g128", tuple((m, n, k) for n, k in WEIGHT_SHAPES for m in ROWS),
                            (torch.bfloat16,)),
                 SuiteEntry("linear_int8", tuple((m, n, k) for n, k in WEIGHT_SHAPES for m in (1, 16)),
                            (torch.bfloat16,))],
        impls=(OPFORGE, TORCH),
        metric="gpu_us",
        targets=[speedup_at_least(TORCH, {("linear_int4_g128", 1): 3.0, ("linear_int4_g128", 16): 2.0,
                                          ("linear_int4_g128", 64): 1.0, ("linear_int4_g128", 4096): 0.8,
                                          ("linear_int8", 1): 1.8, ("linear_int8", 16): 1.8},
                                  share_of_copy={("linear_int4_g128", 1): 80.0})],
    )
)

#: (N, K) of the decode projections: 1B qkv, o, gate_up, down, lm_head; 8B qkv, o, gate_up, down
DECODE_SHAPES = ((3072, 2048), (2048, 2048), (16384, 2048), (2048, 8192), (128256, 2048),
                 (6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336))

DECODE_GEMV_SUITE = register_suite(
    Suite(
        name="decode_gemv",
        description="one row of x (batch-1 decode) on the 1B/8B projection shapes: dense, int4 g128, int8",
        entries=[SuiteEntry(op, tuple((1, n, k) for n, k in DECODE_SHAPES), (torch.bfloat16,))
                 for op in ("linear_dense", "linear_int4_g128", "linear_int8")],
        impls=(OPFORGE, TORCH),
        metric="gpu_us",
    )
)


def _planes_inputs(shape: Shape, dtype: torch.dtype, device: torch.device, g: torch.Generator) -> Inputs:
    import opforge
    x, qw, dense = _inputs(4, 128, False)(shape, dtype, device, g)
    return (x, opforge.repack(qw, "planes"), qw, dense)


def _planes_bytes(shape: Shape, dtype: torch.dtype) -> int:
    m, n, k = shape
    return _bytes(4, 128, False)(shape, dtype) + n * (k // 128) * 4    # + the group words the kernel reads


def _opforge_planes(ctx: BuildContext) -> Callable[..., Any]:
    import opforge
    return lambda x, pw, qw, dense: opforge.linear(x, pw)


def _opforge_rows(ctx: BuildContext) -> Callable[..., Any]:
    import opforge
    return lambda x, pw, qw, dense: opforge.linear(x, qw)


LINEAR_INT4_PLANES = register_op(OpSpec(
    name="linear_int4_g128_planes", make_inputs=_planes_inputs,
    reference=lambda x, pw, qw, dense: x @ qw.dequantize(torch.float64).T, bytes_moved=_planes_bytes,
    impls={OPFORGE: _opforge_planes, ROWS_LAYOUT: _opforge_rows,
           TORCH: eager_impl(lambda x, pw, qw, dense: F.linear(x, dense))}))

#: Rows of x in batched decode (a serving engine's decode steps run 1..128 sequences at once).
BATCH_ROWS = (1, 2, 4, 8, 16, 32, 64, 96, 128)

QUANT_BATCH_SUITE = register_suite(
    Suite(
        name="quant_batch",
        description="int4 g128 at decode batch sizes (M = 1..128): planes layout vs rows layout vs cuBLAS bf16",
        entries=[SuiteEntry("linear_int4_g128_planes", tuple((m, n, k) for n, k in DECODE_SHAPES for m in BATCH_ROWS),
                            (torch.bfloat16,))],
        impls=(OPFORGE, ROWS_LAYOUT, TORCH),
        metric="gpu_us",
        targets=[speedup_at_least(TORCH, {("linear_int4_g128_planes", 1): 3.0, ("linear_int4_g128_planes", 16): 2.2,
                                          ("linear_int4_g128_planes", 64): 1.6})],
    )
)
