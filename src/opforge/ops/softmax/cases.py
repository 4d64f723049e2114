"""Checks of softmax and log_softmax against the float64 oracle, used by ``opforge verify`` and tests."""
from __future__ import annotations

from typing import Any

import torch

from ...testing import Case, random_layout, verify_grid
from . import log_softmax, reference, softmax
from .problem import OPS

PUBLIC = {"softmax": softmax, "log_softmax": log_softmax}


def random_logits(shape: tuple, dtype: torch.dtype, device: Any, layout: str = "packed",
                  scale: float = 4.0) -> torch.Tensor:
    """Random logits (never zeros) of ``shape`` in the requested layout: packed, strided or transposed.

    ``scale`` spreads them: 4 gives peaked rows, 1e4 gives rows whose exp would overflow without
    subtracting the maximum.
    """
    return random_layout(shape, dtype, device, layout).mul_(scale)


def oracle(op: str, args: tuple, kwargs: dict) -> torch.Tensor:
    """The float64 result the kernels are judged against."""
    x = args[0]
    return reference.run(op, x.double(), kwargs.get("dim", -1))


def make_case(op: str, shape: tuple, dtype: torch.dtype, layout: str = "packed", dim: int = -1,
              scale: float = 4.0) -> Case:
    """A Case for ``op`` on random logits of ``shape`` along ``dim``."""

    def make(device):
        return (random_logits(shape, dtype, device, layout, scale),), ({"dim": dim} if dim != -1 else {})

    label_layout = layout if dim == -1 else f"{layout} dim={dim}"
    return Case(op, tuple(shape), dtype, label_layout, make, PUBLIC[op], lambda a, k: oracle(op, a, k))


def verify_cases(device_type: str, quick: bool = False) -> list[Case]:
    """Shapes that reach every variant: narrow, mid and long rows, one long row, strided rows, dim=0."""
    interpreted = device_type == "cpu"
    if interpreted:   # Triton's interpreter costs ~1 ms per program: few rows
        shapes = [(3, 1), (2, 3, 77), (4, 1024), (2, 1500), (1, 40000), (97, 33000)]
    else:
        shapes = [(7, 1), (64, 77), (262144, 128), (4096, 1024), (256, 4096), (64, 32768), (512, 65536),
                  (2, 262144), (1, 1048576)]
    strided, huge_logits = shapes[1], shapes[2]

    def extras(op: str, _shapes: list) -> list[Case]:
        return [make_case(op, strided, torch.bfloat16, layout="strided"),
                make_case(op, huge_logits, torch.float32, scale=1e4),
                make_case(op, (8, 33), torch.float16, dim=0)]

    return verify_grid(make_case, OPS, shapes, quick, extras)
