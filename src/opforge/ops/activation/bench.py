"""The activations as benchmark entries, the ``activations`` suite and the shared ``latency_act``.

Inputs are random, standard normal. ``gate`` and ``up`` of the gated forms have the entry's
shape each: ``16384x11008`` stands for ``16384 x (2 x 11008)``.

Bytes that must move, with ``E`` elements per input and ``s`` bytes per element:

==================== ==================
gelu, silu, relu     read x, write y: ``2*E*s``
swiglu, geglu        read gate, up; write y: ``3*E*s``
==================== ==================

Suites (selected by name, e.g. ``opforge bench --suite activations``):

* ``activations``: swiglu / geglu at 16384x11008 and gelu / silu / relu at 16384x4096, bf16;
  >= 90% of copy bandwidth.
* ``latency`` (shared) also takes silu and swiglu in bf16 at the latency shapes.
* ``latency_act`` (shared; softmax adds itself): wall time per call of softmax, silu and swiglu at
  the latency shapes; a chain of 10 calls eager vs CUDA graph; no slower than torch.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F

from opforge.bench.impls import liger_function
from opforge.bench.pointwise import liger_absent, normal, pointwise_spec
from opforge.bench.spec import COMPILE, LIGER, OPFORGE, TORCH, BuildContext, Inputs, Shape, Suite, SuiteEntry, \
    register_op, register_suite, registered_suite
from opforge.bench.standard import LATENCY, LATENCY_ACT, LATENCY_SHAPES
from opforge.bench.targets import bandwidth_at_least

GATED_SHAPES = ((16384, 11008),)
UNARY_SHAPES = ((16384, 4096),)


def _one(shape: Shape, dtype: torch.dtype, device: torch.device, g: torch.Generator) -> Inputs:
    return (normal(shape, dtype, device, g),)


def _two(shape: Shape, dtype: torch.dtype, device: torch.device, g: torch.Generator) -> Inputs:
    return (normal(shape, dtype, device, g), normal(shape, dtype, device, g))


# -- float64 oracles and torch eager peers (also what torch.compile compiles) ------------------------------


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


def liger_swiglu(ctx: BuildContext) -> Callable[..., Any]:
    fn = liger_function(ctx, "LigerSiLUMulFunction")
    return lambda gate, up: fn.apply(gate, up)


GELU = register_op(pointwise_spec("gelu", _one, 2, ref_gelu, torch_gelu, liger_absent("Liger-Kernel has no plain GELU")))
SILU = register_op(pointwise_spec("silu", _one, 2, ref_silu, torch_silu, liger_absent("Liger-Kernel has no plain SiLU")))
RELU = register_op(pointwise_spec("relu", _one, 2, ref_relu, torch_relu, liger_absent("Liger-Kernel has no ReLU")))
SWIGLU = register_op(pointwise_spec("swiglu", _two, 3, ref_swiglu, torch_swiglu, liger_swiglu))
GEGLU = register_op(pointwise_spec("geglu", _two, 3, ref_geglu, torch_geglu,
                                   liger_absent("Liger-Kernel's GELU-mul is the tanh form only; this entry is exact GELU")))

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

for _op in ("silu", "swiglu"):
    LATENCY.add(SuiteEntry(_op, LATENCY_SHAPES, (torch.bfloat16,)))
    LATENCY_ACT.add(SuiteEntry(_op, LATENCY_SHAPES, (torch.bfloat16, torch.float32)))
register_suite(LATENCY_ACT)
