"""Validation of the normalization ops' arguments, and the problem description variants see."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from ...runtime.errors import HALF_AND_SINGLE, check_eps, check_float_tensor, check_optional_vector, check_same_device, \
    check_same_shape
from ...runtime.lru import LRU
from ...runtime.plans import PlanCache
from ...runtime.problem import ProblemRecord
from ...runtime.rows import Rows, as_rows

OPS = ("layer_norm", "rms_norm", "add_layer_norm", "add_rms_norm")


@dataclass(frozen=True)
class NormProblem(ProblemRecord):
    """What the variants\' support predicates and launch heuristics read; every field is in the
    selection key (``ProblemRecord``)."""

    op: str
    dtype: torch.dtype
    n: int
    rows: int
    device_type: str
    weight_dtype: Optional[torch.dtype]
    bias_dtype: Optional[torch.dtype]


    @property
    def is_rms(self) -> bool:
        return "rms" in self.op

    @property
    def has_residual(self) -> bool:
        return self.op.startswith("add_")

    def describe(self) -> str:
        return f"x {str(self.dtype).replace('torch.', '')} ({self.rows} rows x N={self.n}) {self.device_type}"


class NormCall:
    """A validated call: the problem, the row views of the inputs, and the parameters.

    ``signature`` (see ``signature()``) is set where a launch plan may repeat this call."""

    __slots__ = ("problem", "x", "residual", "weight", "bias", "eps", "shape", "signature")

    def __init__(self, problem: NormProblem, x: Rows, residual: Optional[Rows], weight: Optional[torch.Tensor],
                 bias: Optional[torch.Tensor], eps: float, shape: torch.Size):
        self.problem, self.x, self.residual = problem, x, residual
        self.weight, self.bias, self.eps, self.shape = weight, bias, eps, shape
        self.signature = None

    @property
    def note(self) -> str:
        notes = [r.copied for r in (self.x, self.residual) if r is not None and r.copied]
        return "; ".join(notes)


# Launch plans of the norm family (runtime/plans.py), by signature().
PLANS = PlanCache()


def signature(op: str, x: object, residual: object, weight: object, bias: object) -> Optional[tuple]:
    """What a launch plan of this call depends on: op, x's shape, dtype and device, and the
    residual's, weight's and bias's; None unless every tensor given is packed (a plan passes only
    pointers), or for arguments that are not tensors (the general path reports those).

    Example:
        >>> import torch
        >>> x = torch.randn(4, 64)
        >>> signature("rms_norm", x, None, None, None) == ("rms_norm", x.shape, x.dtype, x.device, None, None, None)
        True
        >>> signature("rms_norm", x.t(), None, None, None) is None
        True
    """
    try:
        if not x.is_contiguous():
            return None
        sig = [op, x.shape, x.dtype, x.device]
        for t in (residual, weight, bias):
            if t is None:
                sig.append(None)
            elif t.is_contiguous():
                sig.append((t.shape, t.dtype, t.device))
            else:
                return None
        return tuple(sig)
    except AttributeError:
        return None


_ACCEPTED = frozenset(HALF_AND_SINGLE + (torch.float64,))
_problems: LRU[tuple, NormProblem] = LRU(4096, "norm.problems")


def _problem(op: str, dtype: torch.dtype, n: int, rows: int, device_type: str,
             w_dtype: Optional[torch.dtype], b_dtype: Optional[torch.dtype]) -> NormProblem:
    """Problems are interned per (op, dtype, N, weight/bias dtypes, device type) for the hot path."""
    key = (op, dtype, n, device_type, w_dtype, b_dtype)
    problem = _problems.get(key)
    if problem is None or problem.rows != rows:
        problem = NormProblem(op, dtype, n, rows, device_type, w_dtype, b_dtype)
        _problems[key] = problem
    return problem


def prepare(op: str, x: torch.Tensor, residual: Optional[torch.Tensor], weight: Optional[torch.Tensor],
            bias: Optional[torch.Tensor], eps: object) -> NormCall:
    """Check every argument (raising before anything is written) and describe the call.

    The common case (float x, matching parameters, one device) costs a few attribute reads;
    anything unusual goes through the detailed checks, which produce the error messages.
    """
    if not isinstance(x, torch.Tensor) or x.dtype not in _ACCEPTED or x.dim() == 0:
        _detailed_checks(op, x, residual, weight, bias, eps)
    shape = x.shape
    n = shape[-1]
    device = x.device
    dtype = x.dtype
    fast = n > 0 and type(eps) is float and 0.0 <= eps < float("inf")
    if fast and op[0] == "a":  # add_*: residual must match x exactly
        fast = isinstance(residual, torch.Tensor) and residual.dtype == dtype and residual.shape == shape \
            and residual.device == device
    w_dtype = b_dtype = None
    if fast and weight is not None:
        w_dtype = weight.dtype
        fast = weight.shape == (n,) and weight.device == device and w_dtype in _ACCEPTED \
            and (w_dtype != torch.float64 or dtype == torch.float64)
    if fast and bias is not None:
        b_dtype = bias.dtype
        fast = bias.shape == (n,) and bias.device == device and b_dtype in _ACCEPTED \
            and (b_dtype != torch.float64 or dtype == torch.float64)
    if not fast:
        eps = _detailed_checks(op, x, residual, weight, bias, eps)
    if weight is not None and not weight.is_contiguous():
        weight = weight.contiguous()
    if bias is not None and not bias.is_contiguous():
        bias = bias.contiguous()
    problem = _problem(op, dtype, n, x.numel() // n, device.type, w_dtype, b_dtype)
    return NormCall(problem, as_rows(x, "x"), as_rows(residual, "residual") if residual is not None else None,
                    weight, bias, eps, shape)


def _detailed_checks(op: str, x: object, residual: object, weight: object, bias: object, eps: object) -> float:
    """The full validation, with messages naming the argument; returns eps as a float."""
    check_float_tensor("x", x)
    if x.dim() == 0:
        raise ValueError("x must have at least one dimension (..., N), got a 0-d tensor")
    n = x.shape[-1]
    if n == 0:
        raise ValueError("x's last dimension N must be >= 1, got N=0")
    device = x.device
    if op.startswith("add_"):
        check_float_tensor("residual", residual)
        check_same_shape("residual", residual, x.shape)
        check_same_device("residual", residual, device)
        if residual.dtype != x.dtype:
            raise TypeError(f"residual must have x's dtype {x.dtype}, got {residual.dtype}")
    for name, t in (("weight", weight), ("bias", bias)):
        check_optional_vector(name, t, n, device)
        if t is not None and t.dtype == torch.float64 and x.dtype != torch.float64:
            raise TypeError(f"{name} may be float64 only when x is float64, got {name} float64 with x {x.dtype}")
    return check_eps(eps)
