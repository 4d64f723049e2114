"""The shared suites and shapes: ``seed`` (the users' table), ``llm``, ``latency``, ``latency_act``.

They start empty; each op family's ``bench`` module adds its entries (the norms fill ``seed``,
``llm`` and ``latency``), the way it registers its kernel variants::

    from opforge.bench.standard import LLM, LLM_SHAPES
    LLM.add(SuiteEntry("softmax", LLM_SHAPES, (torch.bfloat16, torch.float16)))

``latency_act`` is registered by the activation family, after its own suite, so that the
suites list in the same order as they always did.
"""

from __future__ import annotations

import torch

from opforge.bench.spec import COMPILE, CPU, LIGER, OPFORGE, TORCH, Suite, register_suite
from opforge.bench.targets import bandwidth_at_least, near_fastest_peer, no_slower_than

#: The users' layer-norm table: small, BERT-base, BERT-large, XLarge (batch, seq, hidden).
SEED_SHAPES = ((2, 32, 256), (8, 128, 768), (8, 128, 1024), (4, 64, 4096))
#: rows x N of LLM activations, from many short rows to few very long ones.
LLM_SHAPES = (
    (32768, 1024),
    (16384, 4096),
    (8192, 8192),
    (4096, 16384),
    (2048, 32768),
    (1024, 65536),
    (262144, 128),
)
#: Host-overhead-bound sizes: the two smallest seed shapes and two decode steps.
LATENCY_SHAPES = ((2, 32, 256), (8, 128, 768), (1, 1, 4096), (1, 1, 8192))

ALL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
HALF_DTYPES = (torch.bfloat16, torch.float16)

SEED = register_suite(
    Suite(
        name="seed",
        description="the users' layer-norm table: 4 shapes x fp32/fp16/bf16, GPU vs CPU",
        entries=[],
        impls=(OPFORGE, TORCH, COMPILE, LIGER, CPU),
        metric="gpu_us",
        targets=[no_slower_than(TORCH, "gpu_us")],
    )
)

LLM = register_suite(
    Suite(
        name="llm",
        description="LLM activation shapes (rows x N) in bf16/fp16: share of copy bandwidth",
        entries=[],
        impls=(OPFORGE, TORCH, COMPILE, LIGER),
        metric="gpu_us",
        targets=[
            bandwidth_at_least({"bf16": 90.0, "fp16": 90.0, "fp32": 85.0}),
            near_fastest_peer(0.03, "gpu_us"),
        ],
    )
)


def _latency_suite(name: str, description: str) -> Suite:
    """A wall-time suite at small sizes, with a chain of 10 calls eager vs CUDA graph."""
    return Suite(name=name, description=description, entries=[], impls=(OPFORGE, TORCH, COMPILE, LIGER),
                 metric="wall_us", chain_len=10, chain_impls=(OPFORGE, TORCH, LIGER),
                 targets=[no_slower_than(TORCH, "wall_us")])


LATENCY = register_suite(_latency_suite(
    "latency", "wall time per call at small sizes; a chain of 10 norms eager vs CUDA graph"))


#: Wall time per call of softmax, silu and swiglu (their families add them); registered by the
#: activation family after its ``activations`` suite.
LATENCY_ACT = _latency_suite(
    "latency_act", "wall time per call of softmax, silu, swiglu at small sizes; a chain of 10 eager vs CUDA graph")
