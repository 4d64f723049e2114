"""Validation of softmax / log_softmax arguments, and the problem description variants see."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from ...runtime.errors import HALF_AND_SINGLE, check_float_tensor
from ...runtime.lru import LRU
from ...runtime.plans import PlanCache
from ...runtime.problem import ProblemRecord
from ...runtime.rows import Rows, as_rows

OPS = ("softmax", "log_softmax")

#: At most this many rows counts as "few": a long row is then split across several programs
#: (the ``split`` variant) so the whole GPU works on it; more rows keep one program per row.
FEW_ROWS = 96
#: Row indices are 32-bit in the kernels (a block of rows past the last must still fit).
MAX_ROWS = 2**31 - 2**16


@dataclass(frozen=True)
class SoftmaxProblem(ProblemRecord):
    """What the variants\' support predicates and launch heuristics read; every field is in the
    selection key (``ProblemRecord``)."""

    op: str
    dtype: torch.dtype
    n: int
    rows: int
    device_type: str

    @property
    def few_rows(self) -> bool:
        return self.rows <= FEW_ROWS


    @property
    def is_log(self) -> bool:
        return self.op == "log_softmax"

    def describe(self) -> str:
        return f"x {str(self.dtype).replace('torch.', '')} ({self.rows} rows x N={self.n}) {self.device_type}"


class SoftmaxCall:
    """A validated call: the problem, the rows the kernel reads, and how to give the result x's shape.

    ``shape`` is the shape of the (possibly dim-moved) tensor the kernels see, with the softmax
    dimension last; ``dim`` is where that dimension goes back to in the result (or None when it
    already was the last one).
    """

    __slots__ = ("problem", "x", "shape", "dim", "note", "scalar", "signature")

    def __init__(self, problem: SoftmaxProblem, x: Rows, shape: torch.Size, dim: Optional[int], note: str,
                 scalar: bool = False):
        self.problem, self.x, self.shape, self.dim, self.note, self.scalar = problem, x, shape, dim, note, scalar
        self.signature = None  # set where a launch plan may repeat this call (see ``signature()``)

    def finish(self, y: torch.Tensor) -> torch.Tensor:
        """Give a packed result of ``shape`` the caller's shape (dim moved back, 0-d restored)."""
        if self.scalar:
            return y.reshape(())
        return y if self.dim is None else y.movedim(-1, self.dim)


#: Launch plans of softmax and log_softmax (``runtime.plans``).
PLANS = PlanCache()


def signature(op: str, x: object, dim: object) -> Optional[tuple]:
    """What a launch plan of this call depends on: op, x's shape, dtype and device; None unless x
    is a packed tensor of at least one dimension normalized over its last (a plan passes only
    x's pointer and returns the packed output as it is).

    Example:
        >>> x = torch.randn(4, 64)
        >>> signature("softmax", x, -1) == ("softmax", x.shape, x.dtype, x.device)
        True
        >>> signature("softmax", x, 0) is None, signature("softmax", x.t(), -1) is None
        (True, True)
    """
    try:
        shape = x.shape
        if type(dim) is not int or not (dim == -1 or dim == len(shape) - 1) or not shape or not x.is_contiguous():
            return None
        return (op, shape, x.dtype, x.device)
    except AttributeError:
        return None


_ACCEPTED = frozenset(HALF_AND_SINGLE + (torch.float64,))
_problems: LRU[tuple, SoftmaxProblem] = LRU(4096, "softmax.problems")


def _problem(op: str, dtype: torch.dtype, n: int, rows: int, device_type: str) -> SoftmaxProblem:
    """Problems are interned for the hot path (a frozen dataclass costs a microsecond to build)."""
    key = (op, dtype, n, rows, device_type)
    problem = _problems.get(key)
    if problem is None:
        problem = _problems[key] = SoftmaxProblem(op, dtype, n, rows, device_type)
    return problem


def check_dim(dim: object, ndim: int) -> int:
    """Return ``dim`` as a non-negative index into a tensor of ``ndim`` dims (a 0-d tensor has one slot)."""
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise TypeError(f"dim must be an int, got {type(dim).__name__}")
    slots = max(ndim, 1)
    if not -slots <= dim < slots:
        raise IndexError(f"dim must be in [{-slots}, {slots - 1}] for a {ndim}-d x, got {dim}")
    return dim % slots


def prepare(op: str, x: torch.Tensor, dim: object) -> SoftmaxCall:
    """Check every argument (raising before anything is written) and describe the call.

    The common case (a packed float tensor, softmax over its last dimension) costs a few
    attribute reads; anything else goes through the detailed path, which also makes the errors.
    """
    if isinstance(x, torch.Tensor) and x.dtype in _ACCEPTED and type(dim) is int and x.is_contiguous():
        shape = x.shape
        ndim = len(shape)
        if ndim and (dim == -1 or dim == ndim - 1) and shape[-1]:
            n = shape[-1]
            rows = x.numel() // n
            if rows:
                return SoftmaxCall(_problem(op, x.dtype, n, rows, x.device.type), Rows(x, rows, 0, n, ""),
                                   shape, None, "")
    return _prepare_detailed(op, x, dim)


def _prepare_detailed(op: str, x: torch.Tensor, dim: object) -> SoftmaxCall:
    check_float_tensor("x", x)
    d = check_dim(dim, x.dim())
    moved_dim = None
    note = ""
    scalar = x.dim() == 0
    if scalar:
        x = x.reshape(1)
    elif d != x.dim() - 1:
        x = x.movedim(d, -1)
        moved_dim = d
    n = x.shape[-1]
    rows = x.numel() // n if n else 0
    problem = _problem(op, x.dtype, n, rows, x.device.type)
    if rows == 0:
        return SoftmaxCall(problem, Rows(x, 1, 0, 0, ""), x.shape, moved_dim, "", scalar)
    r = as_rows(x, "x")
    if r.copied:
        note = f"x copied: softmax over dim {d}, which is not the last dimension" if moved_dim is not None \
            else r.copied
    return SoftmaxCall(problem, r, x.shape, moved_dim, note, scalar)
