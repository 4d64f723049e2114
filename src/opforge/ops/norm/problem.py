"""Validation of the normalization ops' arguments, and the problem description variants see."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from ...runtime.errors import check_eps, check_float_tensor, check_optional_vector, check_same_device, \
    check_same_shape
from .rows import Rows, as_rows

HALF_AND_SINGLE = (torch.float32, torch.float16, torch.bfloat16)
OPS = ("layer_norm", "rms_norm", "add_layer_norm", "add_rms_norm")


@dataclass(frozen=True)
class NormProblem:
    """What a variant needs to decide whether it can run a call; ``key`` drives the selection cache."""

    op: str
    dtype: torch.dtype
    n: int
    rows: int
    device_type: str
    weight_dtype: Optional[torch.dtype]
    bias_dtype: Optional[torch.dtype]

    @property
    def key(self) -> tuple:
        return (self.dtype, self.n, self.weight_dtype, self.bias_dtype)

    @property
    def is_rms(self) -> bool:
        return "rms" in self.op

    @property
    def has_residual(self) -> bool:
        return self.op.startswith("add_")

    def describe(self) -> str:
        return f"x {str(self.dtype).replace('torch.', '')} ({self.rows} rows x N={self.n}) {self.device_type}"


@dataclass
class NormCall:
    """A validated call: the problem, the row views of the inputs, and the parameters."""

    problem: NormProblem
    x: Rows
    residual: Optional[Rows]
    weight: Optional[torch.Tensor]
    bias: Optional[torch.Tensor]
    eps: float
    shape: torch.Size

    @property
    def note(self) -> str:
        notes = [r.copied for r in (self.x, self.residual) if r is not None and r.copied]
        return "; ".join(notes)


def prepare(op: str, x: torch.Tensor, residual: Optional[torch.Tensor], weight: Optional[torch.Tensor],
            bias: Optional[torch.Tensor], eps: object) -> NormCall:
    """Check every argument (raising before anything is written) and describe the call."""
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
    eps = check_eps(eps)
    rows = x.numel() // n
    problem = NormProblem(op, x.dtype, n, rows, device.type,
                          None if weight is None else weight.dtype, None if bias is None else bias.dtype)
    x_rows = as_rows(x, "x")
    r_rows = as_rows(residual, "residual") if residual is not None else None
    if weight is not None and not weight.is_contiguous():
        weight = weight.contiguous()
    if bias is not None and not bias.is_contiguous():
        bias = bias.contiguous()
    return NormCall(problem, x_rows, r_rows, weight, bias, eps, x.shape)
