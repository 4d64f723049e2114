"""The torch path on a CPU: ``opforge bench --device cpu --suite torch_path``.

Every op opforge runs on a CPU tensor goes through its torch path (PyTorch's own fused functions
behind opforge's validation and dispatch). This suite times each op against the PyTorch
composite it stands for (``F.rms_norm``, ``F.layer_norm``, ``torch.softmax``, ``F.silu``...,
``F.linear``, SDPA with grouped heads over the valid slots), in wall time per call (interleaved
rounds), at one row (decode) and 512 rows (prefill) of SmolLM2-135M's sizes, float32 and bfloat16.
Target: opforge within 1.2x of PyTorch. The model's decode, end to end, is
``opforge bench --suite torch_path_decode`` (``opforge.bench.suites.cpu_decode``).
"""
from __future__ import annotations

import torch

from opforge.bench.results import CaseResult
from opforge.bench.spec import OPFORGE, TORCH, Suite, SuiteEntry, Target, register_suite
from opforge.bench.targets import compare_times

#: The largest slowdown against PyTorch's composite that meets the target.
MAX_RATIO = 1.2
DTYPES = (torch.float32, torch.bfloat16)
HIDDEN, FFN, HEADS, KV_HEADS, HEAD_DIM, CONTEXT = 576, 1536, 9, 3, 64, 256
ROWS = (1, 512)


def within(peer: str, factor: float, metric: str = "wall_us") -> Target:
    """opforge's ``metric`` is at most ``factor`` times ``peer``'s.

    Example:
        >>> within("torch", 1.2).name
        'wall time per call within 1.2x of torch'
    """
    def check(case: CaseResult) -> tuple[bool, str] | None:
        return compare_times(case, peer, metric, lambda mine, theirs: (
            mine <= theirs * factor, f"{mine:.1f} vs {theirs:.1f} us ({mine / theirs:.2f}x)"))

    return Target(f"wall time per call within {factor:g}x of {peer}", check)


def _rows(n: int) -> tuple[tuple[int, int], ...]:
    return tuple((m, n) for m in ROWS)


ENTRIES = [SuiteEntry(op, _rows(HIDDEN), DTYPES) for op in ("rms_norm", "add_rms_norm", "layer_norm",
                                                            "add_layer_norm")]
ENTRIES += [SuiteEntry(op, _rows(FFN), DTYPES) for op in ("silu", "gelu", "relu", "swiglu", "geglu")]
ENTRIES += [SuiteEntry(op, _rows(1024), DTYPES) for op in ("softmax", "log_softmax")]
ENTRIES += [SuiteEntry("linear_dense", tuple((m, FFN, HIDDEN) for m in ROWS), DTYPES),
            SuiteEntry("decode_attention", ((1, HEADS, KV_HEADS, CONTEXT, HEAD_DIM),), DTYPES),
            SuiteEntry("attention_causal", tuple((1, HEADS, s, HEAD_DIM) for s in ROWS), DTYPES)]

TORCH_PATH = register_suite(
    Suite(
        name="torch_path",
        description="CPU: each op's torch path vs the PyTorch composite, 1 and 512 rows, fp32/bf16 (wall time)",
        entries=ENTRIES,
        impls=(OPFORGE, TORCH),
        metric="wall_us",
        targets=[within(TORCH, MAX_RATIO)],
    )
)
