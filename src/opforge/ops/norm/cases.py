"""Checks of the normalization ops against the float64 oracle, used by ``opforge verify`` and tests."""
from __future__ import annotations

from typing import Any, Optional

import torch

from ...testing import Case, random_layout, verify_grid
from . import add_layer_norm, add_rms_norm, layer_norm, rms_norm, reference
from .problem import OPS

PUBLIC = {"layer_norm": layer_norm, "rms_norm": rms_norm, "add_layer_norm": add_layer_norm,
          "add_rms_norm": add_rms_norm}


def random_input(shape: tuple, dtype: torch.dtype, device: Any, layout: str = "packed",
                 offset: float = 0.0) -> torch.Tensor:
    """Fresh random data (never zeros) in the requested layout: packed, strided or transposed."""
    x = random_layout(shape, dtype, device, layout)
    return x.add_(offset) if offset else x


def oracle(op: str, args: tuple, kwargs: dict):
    """The float64 result the kernels are judged against; for add_* ops y is the norm of the rounded sum."""
    x, *rest = args
    f64 = {k: (v.double() if isinstance(v, torch.Tensor) else v) for k, v in kwargs.items()}
    if op.startswith("add_"):
        residual = rest[0]
        total = reference.residual_sum(x, residual)
        norm = reference.layer_norm if op == "add_layer_norm" else reference.rms_norm
        return norm(total.double(), **f64), x.double() + residual.double()
    return getattr(reference, op)(x.double(), **f64)


def judge_by_stored_sum(op: str, args: tuple, kwargs: dict, out: tuple):
    """For add_* ops: y against the norm of the sum the op stored (its contract: the rounded sum is
    stored, and that is what gets normalized), and that sum against the exact one rounded once to
    the dtype. Unlike ``oracle``, this holds whatever rounding the backend's float-to-half
    conversion uses (Triton's interpreter truncates bf16), which tiny rows would otherwise amplify
    into a failure; and a sum that nearly cancels (a float16 subnormal, whose last place is a large
    share of it) is judged against what rounding must give, not against its exact value."""
    x, residual = args
    f64 = {k: (v.double() if isinstance(v, torch.Tensor) else v) for k, v in kwargs.items()}
    norm = reference.layer_norm if op == "add_layer_norm" else reference.rms_norm
    return norm(out[1].double(), **f64), (x.double() + residual.double()).to(x.dtype).double()


def make_case(op: str, shape: tuple, dtype: torch.dtype, layout: str = "packed", affine: bool = True,
              weight_dtype: Optional[torch.dtype] = None, offset: float = 0.0) -> Case:
    """A Case for ``op`` at ``shape``: random x (and residual), random weight and bias."""
    n = shape[-1]

    def make(device):
        x = random_input(shape, dtype, device, layout, offset)
        args = (x, random_input(shape, dtype, device, layout)) if op.startswith("add_") else (x,)
        kwargs = {}
        if affine:
            wd = weight_dtype or dtype
            kwargs["weight"] = torch.randn(n, dtype=wd, device=device)
            if "layer" in op:
                kwargs["bias"] = torch.randn(n, dtype=wd, device=device)
        return args, kwargs

    judge = (lambda a, k, out: judge_by_stored_sum(op, a, k, out)) if op.startswith("add_") else None
    return Case(op, tuple(shape), dtype, layout, make, PUBLIC[op], lambda a, k: oracle(op, a, k), judge)


def verify_cases(device_type: str, quick: bool = False) -> list[Case]:
    """Shapes that reach every variant: narrow, mid and wide rows, ragged N, strided rows, fp32 weights."""
    interpreted = device_type == "cpu"
    if interpreted:   # Triton's interpreter costs ~1 ms per program: few rows
        shapes = [(3, 1), (2, 3, 77), (4, 1024), (2, 1500), (1, 20000)]
    else:
        shapes = [(7, 1), (64, 77), (4096, 768), (256, 4096), (64, 16384), (8, 65536), (2, 131072)]

    def extras(op: str, shapes: list) -> list[Case]:
        return [make_case(op, shapes[1], torch.bfloat16, layout="strided", weight_dtype=torch.float32),
                make_case(op, shapes[-1], torch.float32, offset=1e4)]

    return verify_grid(make_case, OPS, shapes, quick, extras)
