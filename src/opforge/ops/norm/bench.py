"""The normalization ops as benchmark entries (inputs, float64 oracle, bytes, peers), in the shared
``seed``, ``llm`` and ``latency`` suites.

The oracle is opforge's torch reference (``opforge.ops.norm.reference``) on float64
copies of the inputs.

Inputs are random (never zeros): ``x`` and ``residual`` standard normal, ``weight``
around 1 and ``bias`` around 0, all in the case's dtype (weights in the activation
dtype, as in inference).

Bytes that must move, with ``M`` rows, ``N`` columns and ``s`` bytes per element:

============== ==========================
layer_norm     read x, w, b; write y: ``2*M*N*s + 2*N*s``
rms_norm       read x, w; write y: ``2*M*N*s + N*s``
add_layer_norm read x, r, w, b; write y, x+r: ``4*M*N*s + 2*N*s``
add_rms_norm   read x, r, w; write y, x+r: ``4*M*N*s + N*s``
============== ==========================
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F

from opforge.bench.impls import compiled_impl, eager_impl, liger_function, opforge_impl
from opforge.bench.spec import (
    COMPILE,
    LIGER,
    OPFORGE,
    TORCH,
    Absent,
    BuildContext,
    Inputs,
    OpSpec,
    Outputs,
    Shape,
    SuiteEntry,
    numel,
    register_op,
)
from opforge.bench.standard import ALL_DTYPES, HALF_DTYPES, LATENCY, LATENCY_SHAPES, LLM, LLM_SHAPES, SEED, \
    SEED_SHAPES
from opforge.ops.norm import reference

LN_EPS = 1e-5
RMS_EPS = 1e-6


# -- inputs -------------------------------------------------------------------------


def _normal(shape: Shape, dtype: torch.dtype, device: torch.device, g: torch.Generator, scale: float = 1.0,
            shift: float = 0.0) -> torch.Tensor:
    t = torch.randn(shape, generator=g, device=device, dtype=torch.float32)
    if scale != 1.0:
        t.mul_(scale)
    if shift != 0.0:
        t.add_(shift)
    return t.to(dtype)


def _norm_inputs(residual: bool, bias: bool) -> Callable[..., Inputs]:
    def make(shape: Shape, dtype: torch.dtype, device: torch.device, g: torch.Generator) -> Inputs:
        n = shape[-1]
        args: list[torch.Tensor] = [_normal(shape, dtype, device, g)]
        if residual:
            args.append(_normal(shape, dtype, device, g))
        args.append(_normal((n,), dtype, device, g, scale=0.5, shift=1.0))
        if bias:
            args.append(_normal((n,), dtype, device, g, scale=0.5))
        return tuple(args)

    return make


def _bytes(streams: int, vectors: int) -> Callable[[Shape, torch.dtype], int]:
    def count(shape: Shape, dtype: torch.dtype) -> int:
        s = dtype.itemsize
        return streams * numel(shape) * s + vectors * shape[-1] * s

    return count


# -- float64 oracle: opforge's own torch reference, fed float64 inputs ------------------


def ref_layer_norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Oracle for layer_norm. Example: ``ref_layer_norm(x.double(), w.double(), b.double())``."""
    return reference.layer_norm(x, w, b, LN_EPS)


def ref_rms_norm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Oracle for rms_norm. Example: ``ref_rms_norm(x.double(), w.double())``."""
    return reference.rms_norm(x, w, RMS_EPS)


def ref_add_layer_norm(x: torch.Tensor, r: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> Outputs:
    """Oracle for add_layer_norm: ``(y, x + r)``. Example: ``ref_add_layer_norm(*upcast(inputs))``."""
    return reference.add_layer_norm(x, r, w, b, LN_EPS)


def ref_add_rms_norm(x: torch.Tensor, r: torch.Tensor, w: torch.Tensor) -> Outputs:
    """Oracle for add_rms_norm: ``(y, x + r)``. Example: ``ref_add_rms_norm(*upcast(inputs))``."""
    return reference.add_rms_norm(x, r, w, RMS_EPS)


# -- torch eager peers (also what torch.compile compiles) ----------------------------


def torch_layer_norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The torch eager peer. Example: ``torch_layer_norm(torch.randn(4, 64), w, b)``."""
    return F.layer_norm(x, (x.shape[-1],), w, b, LN_EPS)


def torch_rms_norm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The torch eager peer (``F.rms_norm``). Example: ``torch_rms_norm(torch.randn(4, 64), w)``."""
    return F.rms_norm(x, (x.shape[-1],), w, RMS_EPS)


def torch_add_layer_norm(x: torch.Tensor, r: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> Outputs:
    """The torch eager peer: add, then ``F.layer_norm``. Example: ``y, s = torch_add_layer_norm(x, r, w, b)``."""
    s = x + r
    return F.layer_norm(s, (s.shape[-1],), w, b, LN_EPS), s


def torch_add_rms_norm(x: torch.Tensor, r: torch.Tensor, w: torch.Tensor) -> Outputs:
    """The torch eager peer: add, then ``F.rms_norm``. Example: ``y, s = torch_add_rms_norm(x, r, w)``."""
    s = x + r
    return F.rms_norm(s, (s.shape[-1],), w, RMS_EPS), s


# -- Liger-Kernel (optional) --------------------------------------------------------


def liger_layer_norm(ctx: BuildContext) -> Callable[..., Any]:
    """Liger-Kernel factory (absent off CUDA or without the package). Example: ``fn = liger_layer_norm(ctx)``."""
    fn = liger_function(ctx, "LigerLayerNormFunction")
    return lambda x, w, b: fn.apply(x, w, b, LN_EPS)


def liger_rms_norm(ctx: BuildContext) -> Callable[..., Any]:
    """Liger-Kernel factory. Example: ``fn = liger_rms_norm(ctx); y = fn(x, w)``."""
    # offset 0, "llama" casting (Liger's default), in_place only concerns backward.
    fn = liger_function(ctx, "LigerRMSNormFunction")
    return lambda x, w: fn.apply(x, w, RMS_EPS, 0.0, "llama", False)


def liger_add_rms_norm(ctx: BuildContext) -> Callable[..., Any]:
    """Liger-Kernel's fused add + RMS norm. Example: ``y, s = liger_add_rms_norm(ctx)(x, r, w)``."""
    fn = liger_function(ctx, "LigerFusedAddRMSNormFunction")
    return lambda x, r, w: fn.apply(x, r, w, RMS_EPS, 0.0, "llama", False)


def liger_add_layer_norm(ctx: BuildContext) -> Callable[..., Any]:
    """Always absent: Liger-Kernel has no such kernel. Example: ``liger_add_layer_norm(ctx)`` raises Absent."""
    raise Absent("Liger-Kernel has no fused residual-add + layer norm")


# -- chaining (output feeds the next call) -------------------------------------------


def _feed_plain(inputs: Inputs, outputs: Outputs) -> Inputs:
    return (outputs[0],) + tuple(inputs[1:])


def _feed_residual(inputs: Inputs, outputs: Outputs) -> Inputs:
    return (outputs[0], outputs[1]) + tuple(inputs[2:])


def _spec(name: str, residual: bool, bias: bool, ref: Callable[..., Any], eager: Callable[..., Any],
          liger: Callable[[BuildContext], Callable[..., Any]]) -> OpSpec:
    streams = 4 if residual else 2
    vectors = 2 if bias else 1
    return OpSpec(
        name=name,
        make_inputs=_norm_inputs(residual, bias),
        reference=ref,
        bytes_moved=_bytes(streams, vectors),
        impls={
            OPFORGE: opforge_impl(name),
            TORCH: eager_impl(eager),
            COMPILE: compiled_impl(eager),
            LIGER: liger,
        },
        feed=_feed_residual if residual else _feed_plain,
    )


LAYER_NORM = register_op(_spec("layer_norm", False, True, ref_layer_norm, torch_layer_norm, liger_layer_norm))
RMS_NORM = register_op(_spec("rms_norm", False, False, ref_rms_norm, torch_rms_norm, liger_rms_norm))
ADD_LAYER_NORM = register_op(
    _spec("add_layer_norm", True, True, ref_add_layer_norm, torch_add_layer_norm, liger_add_layer_norm)
)
ADD_RMS_NORM = register_op(
    _spec("add_rms_norm", True, False, ref_add_rms_norm, torch_add_rms_norm, liger_add_rms_norm)
)

NORM_OPS = ("layer_norm", "rms_norm", "add_layer_norm", "add_rms_norm")

for _op in ("layer_norm", "rms_norm"):
    SEED.add(SuiteEntry(_op, SEED_SHAPES, ALL_DTYPES))
for _op in NORM_OPS:
    LLM.add(SuiteEntry(_op, LLM_SHAPES, HALF_DTYPES))
for _op in NORM_OPS:
    LATENCY.add(SuiteEntry(_op, LATENCY_SHAPES, (torch.bfloat16, torch.float32)))
