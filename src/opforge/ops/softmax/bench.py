"""Softmax, log_softmax and the activations as benchmark entries, and their suites.

Inputs are random (never zeros): logits are standard normal times 4 (peaked rows, as LLM
logits are); activation inputs standard normal. ``gate`` and ``up`` of the gated forms have
the entry's shape each: ``16384x11008`` stands for ``16384 x (2 x 11008)``.

Bytes that must move, with ``E`` elements per input and ``s`` bytes per element:

==================== ==================
softmax, log_softmax read x, write y: ``2*E*s``
gelu, silu, relu     read x, write y: ``2*E*s``
swiglu, geglu        read gate, up; write y: ``3*E*s``
==================== ==================

Suites (selected by name, e.g. ``opforge bench --suite softmax,activations``):

* ``softmax``: softmax bf16/fp16 at the ``llm`` shapes and 4096x131072, log_softmax bf16 at the
  same shapes; >= 90% of copy bandwidth and <= 3% behind the fastest peer.
* ``activations``: swiglu / geglu at 16384x11008 and gelu / silu / relu at 16384x4096, bf16;
  >= 90% of copy bandwidth.
* ``latency`` (the norms' suite) also takes softmax, log_softmax, silu and swiglu in bf16 at the
  latency shapes: wall time per call against torch eager's.
* ``latency_act``: wall time per call of softmax, silu and swiglu at the latency shapes; a chain
  of 10 calls eager vs CUDA graph; no slower than torch.
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
    Suite,
    SuiteEntry,
    numel,
    register_op,
    get_suite,
    register_suite,
)
from opforge.bench.suites.standard import HALF_DTYPES, LATENCY_SHAPES, LLM_SHAPES
from opforge.bench.targets import bandwidth_at_least, near_fastest_peer, no_slower_than

LONG_SOFTMAX_SHAPE = (4096, 131072)
GATED_SHAPES = ((16384, 11008),)
UNARY_SHAPES = ((16384, 4096),)


# -- inputs and bytes ------------------------------------------------------------------------------------


def _normal(shape: Shape, dtype: torch.dtype, device: torch.device, g: torch.Generator,
            scale: float = 1.0) -> torch.Tensor:
    t = torch.randn(shape, generator=g, device=device, dtype=torch.float32)
    if scale != 1.0:
        t.mul_(scale)
    return t.to(dtype)


def _logits(shape: Shape, dtype: torch.dtype, device: torch.device, g: torch.Generator) -> Inputs:
    return (_normal(shape, dtype, device, g, scale=4.0),)


def _one(shape: Shape, dtype: torch.dtype, device: torch.device, g: torch.Generator) -> Inputs:
    return (_normal(shape, dtype, device, g),)


def _two(shape: Shape, dtype: torch.dtype, device: torch.device, g: torch.Generator) -> Inputs:
    return (_normal(shape, dtype, device, g), _normal(shape, dtype, device, g))


def _bytes(streams: int) -> Callable[[Shape, torch.dtype], int]:
    def count(shape: Shape, dtype: torch.dtype) -> int:
        return streams * numel(shape) * dtype.itemsize

    return count


# -- float64 oracles and torch eager peers (also what torch.compile compiles) ------------------------------


def ref_softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, dim=-1)


def ref_log_softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(x, dim=-1)


def ref_gelu(x: torch.Tensor) -> torch.Tensor:
    """float64 exact GELU through erfc (no cancellation for very negative x)."""
    return 0.5 * x * torch.special.erfc(x * -(0.5 ** 0.5))


def ref_silu(x: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(x)


def ref_relu(x: torch.Tensor) -> torch.Tensor:
    return torch.relu(x)


def ref_swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return ref_silu(gate) * up


def ref_geglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return ref_gelu(gate) * up


def torch_softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, dim=-1)


def torch_log_softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(x, dim=-1)


def torch_gelu(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x)


def torch_silu(x: torch.Tensor) -> torch.Tensor:
    return F.silu(x)


def torch_relu(x: torch.Tensor) -> torch.Tensor:
    return torch.relu(x)


def torch_swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return F.silu(gate) * up


def torch_geglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return F.gelu(gate) * up


# -- Liger-Kernel (optional) ------------------------------------------------------------------------------


def liger_softmax(ctx: BuildContext) -> Callable[..., Any]:
    fn = liger_function(ctx, "LigerSoftmaxFunction")
    return lambda x: fn.apply(x)


def liger_swiglu(ctx: BuildContext) -> Callable[..., Any]:
    fn = liger_function(ctx, "LigerSiLUMulFunction")
    return lambda gate, up: fn.apply(gate, up)


def _liger_absent(reason: str) -> Callable[[BuildContext], Callable[..., Any]]:
    def build(ctx: BuildContext) -> Callable[..., Any]:
        raise Absent(reason)

    return build


# -- chaining (output feeds the next call) ----------------------------------------------------------------


def _feed_first(inputs: Inputs, outputs: Outputs) -> Inputs:
    return (outputs[0],) + tuple(inputs[1:])


def _spec(name: str, make: Callable[..., Inputs], streams: int, ref: Callable[..., Any],
          eager: Callable[..., Any], liger: Callable[[BuildContext], Callable[..., Any]]) -> OpSpec:
    return OpSpec(
        name=name,
        make_inputs=make,
        reference=ref,
        bytes_moved=_bytes(streams),
        impls={OPFORGE: opforge_impl(name), TORCH: eager_impl(eager), COMPILE: compiled_impl(eager), LIGER: liger},
        feed=_feed_first,
    )


SOFTMAX = register_op(_spec("softmax", _logits, 2, ref_softmax, torch_softmax, liger_softmax))
LOG_SOFTMAX = register_op(_spec("log_softmax", _logits, 2, ref_log_softmax, torch_log_softmax,
                                _liger_absent("Liger-Kernel has no log_softmax kernel")))
GELU = register_op(_spec("gelu", _one, 2, ref_gelu, torch_gelu, _liger_absent("Liger-Kernel has no plain GELU")))
SILU = register_op(_spec("silu", _one, 2, ref_silu, torch_silu, _liger_absent("Liger-Kernel has no plain SiLU")))
RELU = register_op(_spec("relu", _one, 2, ref_relu, torch_relu, _liger_absent("Liger-Kernel has no ReLU")))
SWIGLU = register_op(_spec("swiglu", _two, 3, ref_swiglu, torch_swiglu, liger_swiglu))
GEGLU = register_op(_spec("geglu", _two, 3, ref_geglu, torch_geglu,
                          _liger_absent("Liger-Kernel's GELU-mul is the tanh form only; this entry is exact GELU")))

SOFTMAX_SHAPES = tuple(LLM_SHAPES) + (LONG_SOFTMAX_SHAPE,)

SOFTMAX_SUITE = register_suite(
    Suite(
        name="softmax",
        description="softmax bf16/fp16 (log_softmax bf16) at the llm shapes and 4096x131072: share of copy",
        entries=[SuiteEntry("softmax", SOFTMAX_SHAPES, HALF_DTYPES),
                 SuiteEntry("log_softmax", SOFTMAX_SHAPES, (torch.bfloat16,))],
        impls=(OPFORGE, TORCH, COMPILE, LIGER),
        metric="gpu_us",
        targets=[bandwidth_at_least({"bf16": 90.0, "fp16": 90.0}), near_fastest_peer(0.03, "gpu_us")],
    )
)

ACTIVATIONS_SUITE = register_suite(
    Suite(
        name="activations",
        description="swiglu/geglu at 16384x(2x11008), gelu/silu/relu at 16384x4096, bf16: share of copy",
        entries=[SuiteEntry("swiglu", GATED_SHAPES, (torch.bfloat16,)),
                 SuiteEntry("geglu", GATED_SHAPES, (torch.bfloat16,)),
                 SuiteEntry("gelu", UNARY_SHAPES, (torch.bfloat16,)),
                 SuiteEntry("silu", UNARY_SHAPES, (torch.bfloat16,)),
                 SuiteEntry("relu", UNARY_SHAPES, (torch.bfloat16,))],
        impls=(OPFORGE, TORCH, COMPILE, LIGER),
        metric="gpu_us",
        targets=[bandwidth_at_least({"bf16": 90.0})],
    )
)

LATENCY_ACT_SUITE = register_suite(
    Suite(
        name="latency_act",
        description="wall time per call of softmax, silu, swiglu at small sizes; a chain of 10 eager vs CUDA graph",
        entries=[SuiteEntry(op, LATENCY_SHAPES, (torch.bfloat16, torch.float32))
                 for op in ("softmax", "silu", "swiglu")],
        impls=(OPFORGE, TORCH, COMPILE, LIGER),
        metric="wall_us",
        chain_len=10,
        chain_impls=(OPFORGE, TORCH, LIGER),
        targets=[no_slower_than(TORCH, "wall_us")],
    )
)

#: The host-overhead target covers every op with a Triton kernel: the latency suite
#: (wall time per call, interleaved rounds, torch eager as the peer) takes these too.
LATENCY_EXTRA_OPS = ("softmax", "log_softmax", "silu", "swiglu")
for _op in LATENCY_EXTRA_OPS:
    get_suite("latency").add(SuiteEntry(_op, LATENCY_SHAPES, (torch.bfloat16,)))
