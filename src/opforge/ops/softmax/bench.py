"""softmax and log_softmax as benchmark entries, and the ``softmax`` suite.

Inputs are random: logits are standard normal times 4 (peaked rows, as LLM logits are).
Bytes that must move, with ``E`` elements and ``s`` bytes per element: read x, write y, ``2*E*s``.

Suites (selected by name, e.g. ``opforge bench --suite softmax``):

* ``softmax``: softmax bf16/fp16 at the ``llm`` shapes and 4096x131072, log_softmax bf16 at the
  same shapes; >= 90% of copy bandwidth and <= 3% behind the fastest peer.
* ``latency`` (shared) also takes softmax and log_softmax in bf16 at the latency shapes, and
  ``latency_act`` softmax in bf16/fp32: wall time per call against torch eager's.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from opforge.bench.impls import liger_function
from opforge.bench.pointwise import liger_absent, normal, pointwise_spec
from opforge.bench.spec import COMPILE, LIGER, OPFORGE, TORCH, BuildContext, Inputs, Shape, Suite, SuiteEntry, \
    register_op, register_suite, registered_suite
from opforge.bench.standard import HALF_DTYPES, LATENCY, LATENCY_ACT, LATENCY_SHAPES, LLM_SHAPES
from opforge.bench.targets import bandwidth_at_least, near_fastest_peer

LONG_SOFTMAX_SHAPE = (4096, 131072)


def _logits(shape: Shape, dtype: torch.dtype, device: torch.device, g: torch.Generator) -> Inputs:
    return (normal(shape, dtype, device, g, scale=4.0),)


# -- float64 oracles and torch eager peers (also what torch.compile compiles) ------------------------------


def ref_softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, dim=-1)


def ref_log_softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(x, dim=-1)


def torch_softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, dim=-1)


def torch_log_softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(x, dim=-1)


def liger_softmax(ctx: BuildContext) -> Callable[..., Any]:
    fn = liger_function(ctx, "LigerSoftmaxFunction")
    return lambda x: fn.apply(x)


SOFTMAX = register_op(pointwise_spec("softmax", _logits, 2, ref_softmax, torch_softmax, liger_softmax))
LOG_SOFTMAX = register_op(pointwise_spec("log_softmax", _logits, 2, ref_log_softmax, torch_log_softmax,
                                         liger_absent("Liger-Kernel has no log_softmax kernel")))

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

#: The host-overhead target covers every op with a Triton kernel: the shared wall-time suites
#: (interleaved rounds, torch eager as the peer) take these too.
for _op in ("softmax", "log_softmax"):
    LATENCY.add(SuiteEntry(_op, LATENCY_SHAPES, (torch.bfloat16,)))
LATENCY_ACT.add(SuiteEntry("softmax", LATENCY_SHAPES, (torch.bfloat16, torch.float32)))
