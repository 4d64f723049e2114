"""Checks of the activations against the float64 oracle, used by ``opforge verify`` and tests."""
from __future__ import annotations

from typing import Any, Optional

import torch

from ...testing import Case, random_layout, verify_grid
from . import geglu, gelu, reference, relu, silu, swiglu
from .problem import GATED, OPS

PUBLIC = {"gelu": gelu, "silu": silu, "relu": relu, "swiglu": swiglu, "geglu": geglu}


def random_input(shape: tuple, dtype: torch.dtype, device: Any, layout: str = "packed",
                 scale: float = 2.0) -> torch.Tensor:
    """Random data (never zeros) of ``shape`` in a layout: packed, strided (rows), transposed, or sliced
    (every other element: the layout no kernel reads in place)."""
    return random_layout(shape, dtype, device, layout).mul_(scale)


def oracle(op: str, args: tuple, kwargs: dict) -> torch.Tensor:
    """The float64 result the kernels are judged against."""
    x = args[0].double()
    up = args[1].double() if op in GATED else None
    return reference.run(op, x, up, kwargs.get("approximate"))


def make_case(op: str, shape: tuple, dtype: torch.dtype, layout: str = "packed",
              approximate: Optional[str] = None, up_layout: Optional[str] = None) -> Case:
    """A Case for ``op`` at ``shape``; gated ops get an ``up`` in ``up_layout`` (default: x's layout)."""

    def make(device):
        x = random_input(shape, dtype, device, layout)
        args = (x, random_input(shape, dtype, device, up_layout or layout, scale=1.0)) if op in GATED else (x,)
        return args, ({"approximate": approximate} if approximate is not None else {})

    label = layout if approximate is None else f"{layout} approximate={approximate}"
    return Case(op, tuple(shape), dtype, label, make, PUBLIC[op], lambda a, k: oracle(op, a, k))


def verify_cases(device_type: str, quick: bool = False) -> list[Case]:
    """Odd and large sizes, every dtype; strided rows (gate/up halves) and the tanh GELU.

    No single-element case: its norm-wise error is that one element's, and a float16 GELU tail
    value rounds to a subnormal (or to 0) with far less relative precision than the tolerance.
    The tests cover 0-d and 1-element tensors with an elementwise check that allows for that.
    """
    if device_type == "cpu":   # Triton's interpreter costs ~1 ms per program: small tensors
        shapes = [(7,), (3, 77), (2, 3, 1000), (5000,)]
    else:
        shapes = [(7,), (64, 77), (4096, 4096), (1024, 11008), (3, 1000003)]
    strided, small = shapes[2], shapes[1]

    def extras(op: str, _shapes: list) -> list[Case]:
        tanh = [make_case(op, small, torch.float32, approximate="tanh")] if op in ("gelu", "geglu") else []
        return [make_case(op, strided, torch.bfloat16, layout="strided")] + tanh

    return verify_grid(make_case, OPS, shapes, quick, extras)
