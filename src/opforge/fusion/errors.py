"""Errors of the fusion compiler, and finding the line of the user's function an op came from."""
from __future__ import annotations

import linecache
import sys
from dataclasses import dataclass
from types import CodeType
from typing import Optional


class FusionError(RuntimeError):
    """A function given to ``opforge.fuse`` cannot be compiled as written.

    Example:
        >>> import torch
        >>> from opforge.fusion import fuse
        >>> f = fuse(lambda x: 2.0)
        >>> f(torch.ones(2))   # doctest: +SKIP
        opforge.fusion.errors.FusionError: <lambda> returned no tensor ...
    """


class UnfusableError(FusionError):
    """An operation inside a fused function has no pointwise kernel form (a reduction, indexing...).

    Attributes:
        operation: what was attempted, e.g. ``"torch.sum"`` or ``".view()"``.
        where: the line of the user's function, e.g. ``"model.py:12: return x.sum()"``.
    """

    def __init__(self, operation: str, detail: str, where: Optional["SourceLine"]):
        self.operation = operation
        self.where = where
        message = f"{operation} cannot be fused: {detail}"
        if where is not None:
            message += f" (at {where})"
        super().__init__(message)


@dataclass(frozen=True)
class SourceLine:
    """A line of user code: file, number and text."""

    filename: str
    lineno: int
    function: str

    @property
    def text(self) -> str:
        return linecache.getline(self.filename, self.lineno).strip()

    def __str__(self) -> str:
        text = self.text
        return f"{self.filename}:{self.lineno} in {self.function}" + (f": {text}" if text else "")


def user_line(code: Optional[CodeType], skip: int = 1) -> Optional[SourceLine]:
    """The line now running in the frame of ``code`` (the function being traced), if on the stack.

    Example:
        >>> def f():
        ...     return user_line(f.__code__, skip=0).lineno
        >>> f() > 0
        True
    """
    if code is None:
        return None
    frame = sys._getframe(skip)
    while frame is not None:
        if frame.f_code is code:
            return SourceLine(code.co_filename, frame.f_lineno, code.co_name)
        frame = frame.f_back
    return None


def in_place_detail(name: str) -> Optional[str]:
    """Why an in-place spelling (``torch.relu_``, ``x.add_``, ``x += y``) is refused, naming the
    out-of-place one; None for any other name.

    Example:
        >>> in_place_detail("torch.relu_")
        'it writes its input in place; a fused function computes new tensors: write torch.relu(...) instead'
        >>> in_place_detail("torch.sum") is None
        True
    """
    method = name.endswith("()")
    head, _, base = name.removesuffix("()").rpartition(".")
    if base.startswith("__i") and base.endswith("__"):
        instead = f"x.__{base[3:]}(y) (x = x op y)"
    elif base.endswith("_") and not base.endswith("__"):
        instead = f"{head}.{base[:-1]}(...)" if head else f".{base[:-1]}()"
    else:
        return None
    return f"it writes its input in place; a fused function computes new tensors: write {instead} instead"
