"""Checks of apply_delay and revert_delay against the torch oracle, used by ``opforge verify`` and tests."""
from __future__ import annotations

from typing import Any

import torch

from ...testing import Case
from . import apply_delay, reference, revert_delay

BOS, PAD = 1025, 1024


def dia_delays(c: int) -> list[int]:
    """Dia-like delays for C codebooks: 0, then 8, 9, 10, ... (cycled for large C)."""
    return [0] + [8 + (i % 8) for i in range(c - 1)]


def random_codes(shape: tuple, dtype: torch.dtype, device: Any, layout: str = "packed") -> torch.Tensor:
    """Random codes in [0, 1024), packed or ``strided`` (every other batch, time offset, every other codebook)."""
    b, t, c = shape
    if layout == "strided":
        return torch.randint(0, 1024, (2 * b, t + 3, 2 * c), dtype=dtype, device=device)[::2, 3:, ::2]
    return torch.randint(0, 1024, shape, dtype=dtype, device=device)


def make_case(op: str, shape: tuple, dtype: torch.dtype, layout: str = "packed") -> Case:
    delays = dia_delays(shape[2])

    def make(device):
        codes = random_codes(shape, dtype, device, layout)
        return (codes, delays), ({"bos_id": BOS, "pad_id": PAD} if op == "apply_delay" else {"pad_id": PAD})

    def oracle(args, kwargs):
        d = torch.tensor(args[1])
        if op == "apply_delay":
            return reference.apply_delay(args[0].cpu(), d, kwargs["bos_id"], kwargs["pad_id"])
        return reference.revert_delay(args[0].cpu(), d, kwargs["pad_id"])

    return Case(op, shape, dtype, layout, make, apply_delay if op == "apply_delay" else revert_delay, oracle)


def verify_cases(device_type: str, quick: bool = False) -> list[Case]:
    """Dia's sizes on a GPU (C = 9 and 32, T = 3072), small ones under the interpreter; a strided view."""
    shapes = [(2, 40, 9), (1, 17, 33)] if device_type == "cpu" else [(1, 3072, 9), (8, 3072, 9), (32, 3072, 32)]
    if quick:
        shapes = shapes[:1]
    return [make_case(op, s, dt, layout)
            for op in ("apply_delay", "revert_delay") for s in shapes for dt in (torch.int32, torch.int64)
            for layout in ("packed",)] + \
        [make_case(op, shapes[0], torch.int64, "strided") for op in ("apply_delay", "revert_delay")]
