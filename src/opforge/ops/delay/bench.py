"""``apply_delay`` and ``revert_delay`` as benchmark ops, and the ``delay`` suite.

An entry's shape is ``(B, T, C)``: random codes in [0, 1024) of the entry's integer dtype, the
Dia-like delays of :func:`opforge.ops.delay.cases.dia_delays` (0, 8, 9, ...). Bytes that must
move: the codes read once and the output written once, ``2*B*T*C*s``. The ``torch`` peer is the
gather composite of :mod:`opforge.ops.delay.reference` (an index tensor per call, one gather,
two selects), which is also the oracle: on integers it is exact, and so must every
implementation be (tolerance 0).

Suite (``opforge bench --suite delay``): int64 and int32 at (32, 3072, 32), the size the
>= 85% of copy target is set for, and at (1, 3072, 9), a launch-bound size (its target is the
wall time of one eager op, judged from the report's wall-time column).

Example:
    >>> import torch
    >>> codes, delays = _inputs((1, 12, 2), torch.int32, torch.device("cpu"), torch.Generator())
    >>> tuple(codes.shape), tuple(delays.tolist())
    ((1, 12, 2), (0, 8))
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from opforge.bench.impls import eager_impl
from opforge.bench.spec import OPFORGE, TORCH, BuildContext, Inputs, OpSpec, Shape, Suite, SuiteEntry, numel, \
    register_op, register_suite
from opforge.bench.targets import bandwidth_at_least

from . import reference
from .cases import BOS, PAD, dia_delays

SHAPES = ((32, 3072, 32), (1, 3072, 9))
EXACT = {torch.int64: 0.0, torch.int32: 0.0}


def _inputs(shape: Shape, dtype: torch.dtype, device: torch.device, g: torch.Generator) -> Inputs:
    codes = torch.randint(0, 1024, shape, generator=g, device=device, dtype=torch.int64).to(dtype)
    return codes, torch.tensor(dia_delays(shape[2]), device=device)


def _bytes(shape: Shape, dtype: torch.dtype) -> int:
    return 2 * numel(shape) * dtype.itemsize


def _ref_apply(codes: torch.Tensor, delays: torch.Tensor) -> torch.Tensor:
    return reference.apply_delay(codes, delays, BOS, PAD)


def _ref_revert(codes: torch.Tensor, delays: torch.Tensor) -> torch.Tensor:
    return reference.revert_delay(codes, delays, PAD)


def _opforge_apply(ctx: BuildContext) -> Callable[..., Any]:
    import opforge
    return lambda codes, delays: opforge.apply_delay(codes, delays, bos_id=BOS, pad_id=PAD)


def _opforge_revert(ctx: BuildContext) -> Callable[..., Any]:
    import opforge
    return lambda codes, delays: opforge.revert_delay(codes, delays, pad_id=PAD)


APPLY_DELAY = register_op(OpSpec("apply_delay", _inputs, _ref_apply, _bytes,
                                 {OPFORGE: _opforge_apply, TORCH: eager_impl(_ref_apply)}, tolerance=EXACT))
REVERT_DELAY = register_op(OpSpec("revert_delay", _inputs, _ref_revert, _bytes,
                                  {OPFORGE: _opforge_revert, TORCH: eager_impl(_ref_revert)}, tolerance=EXACT))

DELAY_SUITE = register_suite(
    Suite(
        name="delay",
        description="apply_delay / revert_delay int64 and int32, 32x3072x32 and 1x3072x9: share of copy",
        entries=[SuiteEntry(op, SHAPES, (torch.int64, torch.int32)) for op in ("apply_delay", "revert_delay")],
        impls=(OPFORGE, TORCH),
        metric="gpu_us",
        targets=[bandwidth_at_least({"int64": 85.0, "int32": 85.0})],
    )
)
