"""The check every Metal norm test uses: run an op (through the public API, or one variant
directly) on fresh random data and compare it with the float64 oracle."""
from __future__ import annotations

from typing import Optional

import torch

import opforge
from opforge.ops.norm import cases
from opforge.ops.norm import metal as norm_metal
from opforge.ops.norm.problem import prepare
from opforge.runtime.trace import TraceEvent
from opforge.testing import TOLERANCE, max_rel_error

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
VARIANTS = ("multirow", "row", "looped")
# Row lengths per variant: N=1, ragged tails (N not a multiple of 4 or 32), and each
# variant's boundaries.  Every variant runs every N it supports, not only the N it is chosen for.
SIZES = {
    "multirow": (1, 3, 31, 32, 33, 77, 255, norm_metal.MULTIROW_MAX_N),
    "row": (1, 6, 33, norm_metal.MULTIROW_MAX_N + 1, 1000, norm_metal.ROW_MAX_N - 1, norm_metal.ROW_MAX_N),
    "looped": (1, 77, 1025, norm_metal.ROW_MAX_N + 1, 5003),
}
# Rows per check: enough for a ragged last threadgroup in multirow (8 rows per threadgroup).
ROWS = {"multirow": 11, "row": 3, "looped": 2}


def expected_variant(n: int) -> str:
    if n <= norm_metal.MULTIROW_MAX_N:
        return "multirow"
    return "row" if n <= norm_metal.ROW_MAX_N else "looped"


def default_eps(op: str) -> float:
    return 1e-5 if "layer" in op else 1e-6


def run(op: str, shape: tuple, dtype: torch.dtype, device: str = "cpu", variant: Optional[str] = None,
        tol_scale: float = 1.0, **case_kwargs) -> Optional[TraceEvent]:
    """Run one case on the metal backend and assert it matches the oracle.

    With ``variant`` the variant's launcher is called directly (bypassing selection) and
    None is returned; otherwise the public function runs under ``opforge.backend("metal")``
    and its trace event is returned (after checking it names the metal backend).
    """
    case = cases.make_case(op, shape, dtype, **case_kwargs)
    args, kwargs = case.make(device)
    event = None
    if variant is None:
        with opforge.backend("metal"), opforge.trace() as t:
            out = case.call(*args, **kwargs)
        assert len(t) == 1 and t[0].backend == "metal" and t[0].op == op, list(t)
        event = t[0]
    else:
        residual = args[1] if op.startswith("add_") else None
        call = prepare(op, args[0], residual, kwargs.get("weight"), kwargs.get("bias"),
                       kwargs.get("eps", default_eps(op)))
        out = getattr(norm_metal, f"launch_{variant}")(call)
    err = max_rel_error(out, case.oracle(args, kwargs))
    limit = TOLERANCE[dtype] * tol_scale
    assert err <= limit, f"{op} {variant or ''} {case.label} {dtype}: rel err {err:.3e} > {limit:.1e}"
    return event
