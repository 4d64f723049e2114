"""Validation of the activations' arguments, how their tensors are laid out for a kernel, and
the problem description variants see.

A pointwise kernel needs no particular shape, only addresses. Three layouts run in place:

* ``flat``: every input is contiguous; the kernel walks ``numel`` elements.
* ``dense``: every input has the same dense, non-overlapping layout (a transposed or permuted
  tensor): the kernel walks the storage, and the output gets that same layout.
* ``rows``: rows addressed with two strides and a contiguous last dimension (``big[:, :N]``,
  e.g. the gate and up halves of a fused projection): the output is packed.

Anything else is copied to a packed tensor first, and the trace says so.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from ...runtime.errors import HALF_AND_SINGLE, check_float_tensor
from ...runtime.lru import LRU
from ...runtime.plans import PlanCache
from ...runtime.problem import ProblemRecord
from ...runtime.rows import Rows, as_rows
from .reference import APPROXIMATIONS

OPS = ("gelu", "silu", "relu", "swiglu", "geglu")
GATED = ("swiglu", "geglu")


@dataclass(frozen=True)
class ActivationProblem(ProblemRecord):
    """What the variants\' support predicates and launch heuristics read; every field is in the
    selection key (``ProblemRecord``)."""

    op: str
    dtype: torch.dtype
    numel: int
    device_type: str
    approximate: Optional[str]
    shape: tuple


    @property
    def gated(self) -> bool:
        return self.op in GATED

    def describe(self) -> str:
        name = "gate" if self.gated else "x"
        extra = f", approximate={self.approximate!r}" if self.approximate is not None else ""
        shape = "x".join(map(str, self.shape)) or "()"
        return f"{name} {str(self.dtype).replace('torch.', '')} ({shape}{extra}) {self.device_type}"


class ActivationCall:
    """A validated call: the original tensors (for the torch path) and their kernel layout.

    ``layout`` is ``"flat"``, ``"dense"`` or ``"rows"``; ``rows`` holds, per input, what the
    kernel reads and how its rows are addressed.
    """

    __slots__ = ("problem", "x", "up", "approximate", "layout", "rows", "note", "signature")

    def __init__(self, problem: ActivationProblem, x: torch.Tensor, up: Optional[torch.Tensor],
                 approximate: Optional[str], layout: str, rows: tuple, note: str):
        self.problem, self.x, self.up, self.approximate = problem, x, up, approximate
        self.layout, self.rows, self.note = layout, rows, note
        self.signature = None  # set where a launch plan may repeat this call (see ``signature()``)


#: Launch plans of the activations (``runtime.plans``).
PLANS = PlanCache()


def signature(op: str, x: object, up: object, approximate: object) -> Optional[tuple]:
    """What a launch plan of this call depends on: op, ``approximate``, x's shape, dtype and device
    (up must match them); None unless every tensor is packed (a kernel's plan passes only
    pointers) and ``approximate`` is a string or None. On the CPU, where plans call torch's own
    functions, strided inputs (the two halves of a fused gate|up projection) have a signature
    too, with their strides.

    Example:
        >>> x = torch.randn(4, 64)
        >>> signature("silu", x, None, None) == ("silu", None, x.shape, x.dtype, x.device)
        True
        >>> signature("swiglu", x, x.t(), None) is None
        True
        >>> h = torch.randn(4, 128)
        >>> signature("swiglu", h[:, :64], h[:, 64:], None)[-2:]
        ((128, 1), (128, 1))
    """
    if approximate is not None and type(approximate) is not str:
        return None
    try:
        packed = x.is_contiguous() and (up is None or up.is_contiguous())
        if up is not None and not (up.shape == x.shape and up.dtype == x.dtype and up.device == x.device):
            return None
        if packed:
            return (op, approximate, x.shape, x.dtype, x.device)
        if x.device.type != "cpu":
            return None
        return (op, approximate, x.shape, x.dtype, x.device, x.stride(), None if up is None else up.stride())
    except AttributeError:
        return None


_ACCEPTED = frozenset(HALF_AND_SINGLE + (torch.float64,))
_problems: LRU[tuple, ActivationProblem] = LRU(4096, "activation.problems")


def _problem(op: str, dtype: torch.dtype, shape: tuple, device_type: str,
             approximate: Optional[str]) -> ActivationProblem:
    """Problems are interned for the hot path (a frozen dataclass costs a microsecond to build)."""
    key = (op, dtype, shape, device_type, approximate)
    problem = _problems.get(key)
    if problem is None:
        numel = 1
        for d in shape:
            numel *= d
        problem = _problems[key] = ActivationProblem(op, dtype, numel, device_type, approximate, shape)
    return problem


def is_dense(t: torch.Tensor) -> bool:
    """True if ``t``'s elements fill ``numel`` consecutive slots of its storage, in some order."""
    expected = 1
    for stride, size in sorted((st, sz) for sz, st in zip(t.shape, t.stride()) if sz != 1):
        if stride != expected:
            return False
        expected *= size
    return True


def _same_layout(a: torch.Tensor, b: torch.Tensor) -> bool:
    return all(sa == sb for sz, sa, sb in zip(a.shape, a.stride(), b.stride()) if sz != 1)


def check_approximate(approximate: object) -> str:
    """Return ``approximate`` if it is ``"none"`` or ``"tanh"``; else raise."""
    if not isinstance(approximate, str):
        raise TypeError(f"approximate must be 'none' or 'tanh', got {type(approximate).__name__}")
    if approximate not in APPROXIMATIONS:
        raise ValueError(f"approximate must be 'none' or 'tanh', got {approximate!r}")
    return approximate


def prepare(op: str, x: torch.Tensor, up: Optional[torch.Tensor] = None,
            approximate: Optional[str] = None) -> ActivationCall:
    """Check every argument (raising before anything is written) and plan the kernel's layout.

    The common case (packed float tensors, matching ``up``, a valid ``approximate``) costs a few
    attribute reads; anything else goes through the detailed path, which also makes the errors.
    """
    if isinstance(x, torch.Tensor) and x.dtype in _ACCEPTED and x.is_contiguous():
        gated = op in GATED
        fast = not gated or (isinstance(up, torch.Tensor) and up.dtype == x.dtype and up.shape == x.shape
                             and up.is_contiguous() and up.device == x.device)
        if op in ("gelu", "geglu"):
            fast = fast and type(approximate) is str and approximate in APPROXIMATIONS
        else:
            approximate = None
        if fast:
            problem = _problem(op, x.dtype, tuple(x.shape), x.device.type, approximate)
            rows = (Rows(x, 1, 0, 0, ""), Rows(up, 1, 0, 0, "")) if gated else (Rows(x, 1, 0, 0, ""),)
            return ActivationCall(problem, x, up if gated else None, approximate, "flat", rows, "")
    return _prepare_detailed(op, x, up, approximate)


def _prepare_detailed(op: str, x: torch.Tensor, up: Optional[torch.Tensor],
                      approximate: Optional[str]) -> ActivationCall:
    gated = op in GATED
    name = "gate" if gated else "x"
    check_float_tensor(name, x)
    if gated:
        check_float_tensor("up", up)
        if tuple(up.shape) != tuple(x.shape):
            raise ValueError(f"up must have gate's shape {tuple(x.shape)}, got {tuple(up.shape)}")
        if up.dtype != x.dtype:
            raise TypeError(f"up must have gate's dtype {x.dtype}, got {up.dtype}")
        if up.device != x.device:
            raise ValueError(f"up is on {up.device} but gate is on {x.device}: all tensors must be on one device")
    approximate = check_approximate(approximate) if op in ("gelu", "geglu") else None
    problem = _problem(op, x.dtype, tuple(x.shape), x.device.type, approximate)
    inputs = (x, up) if gated else (x,)
    layout, rows, note = _plan(inputs, (name, "up"))
    return ActivationCall(problem, x, up if gated else None, approximate, layout, rows, note)


def _plan(inputs: tuple, names: tuple) -> tuple[str, tuple, str]:
    numel = inputs[0].numel()
    if numel == 0 or all(t.is_contiguous() for t in inputs):
        return "flat", tuple(Rows(t, 1, 0, 0, "") for t in inputs), ""
    first = inputs[0]
    if is_dense(first) and all(_same_layout(first, t) for t in inputs[1:]):
        return "dense", tuple(Rows(t, 1, 0, 0, "") for t in inputs), ""
    rows = tuple(as_rows(t, n) for t, n in zip(inputs, names))
    note = "; ".join(r.copied for r in rows if r.copied)
    return "rows", rows, note

