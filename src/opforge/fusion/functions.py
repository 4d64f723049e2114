"""Pointwise math for fused functions that also works eagerly.

Inside a function traced by ``opforge.fuse`` these record graph nodes; on real tensors they
call torch (``opforge.exp(x)`` is ``torch.exp(x)``); on Python numbers they compute in Python
with IEEE results (``opforge.log(0.0)`` is ``-inf``).

Example:
    >>> import torch
    >>> from opforge.fusion import functions as F
    >>> torch.equal(F.exp(torch.zeros(2)), torch.ones(2))
    True
    >>> F.maximum(2, 3.5)
    3.5
"""
from __future__ import annotations

import builtins
from typing import Any

import torch

from . import scalar_math

_Number = (bool, int, float)


def _symbolic(*values: Any) -> Any:
    for v in values:
        if getattr(v, "_opforge_symbolic_", False):
            return v
    return None


def _unary(name: str, torch_fn: Any, x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return torch_fn(x)
    sym = _symbolic(x)
    if sym is not None:
        return sym._opforge_apply_(name, (x,), {})
    if isinstance(x, _Number):
        return scalar_math.evaluate(name, (x,))
    raise TypeError(f"opforge.{name} takes a tensor or a Python number, got {type(x).__name__}")


def exp(x: Any) -> Any:
    """``e ** x``.

    Example:
        >>> import torch
        >>> exp(torch.tensor([0.0])).item()
        1.0
    """
    return _unary("exp", torch.exp, x)


def log(x: Any) -> Any:
    """Natural logarithm (``-inf`` at 0, ``nan`` below).

    Example:
        >>> log(1.0)
        0.0
    """
    return _unary("log", torch.log, x)


def sqrt(x: Any) -> Any:
    """Square root (``nan`` below 0).

    Example:
        >>> import torch
        >>> sqrt(torch.tensor([4.0])).item()
        2.0
    """
    return _unary("sqrt", torch.sqrt, x)


def rsqrt(x: Any) -> Any:
    """``1 / sqrt(x)`` (``inf`` at 0).

    Example:
        >>> rsqrt(4.0)
        0.5
    """
    return _unary("rsqrt", torch.rsqrt, x)


def tanh(x: Any) -> Any:
    """Hyperbolic tangent.

    Example:
        >>> tanh(0.0)
        0.0
    """
    return _unary("tanh", torch.tanh, x)


def erf(x: Any) -> Any:
    """The error function.

    Example:
        >>> import torch
        >>> erf(torch.tensor([0.0])).item()
        0.0
    """
    return _unary("erf", torch.erf, x)


def sigmoid(x: Any) -> Any:
    """``1 / (1 + exp(-x))``.

    Example:
        >>> sigmoid(0.0)
        0.5
    """
    return _unary("sigmoid", torch.sigmoid, x)


def abs(x: Any) -> Any:
    """Absolute value.

    Example:
        >>> import torch
        >>> abs(torch.tensor([-2.0])).item()
        2.0
    """
    return _unary("abs", torch.abs, x)


def _binary(name: str, a: Any, b: Any) -> Any:
    sym = _symbolic(a, b)
    if sym is not None:
        return sym._opforge_apply_(name, (a, b), {})
    a_tensor, b_tensor = isinstance(a, torch.Tensor), isinstance(b, torch.Tensor)
    if a_tensor or b_tensor:
        fn = getattr(torch, name)
        # a Python number becomes a 0-d tensor of the dtype torch would give the pair
        if not a_tensor:
            a = torch.as_tensor(a, dtype=torch.result_type(b, a), device=b.device)
        if not b_tensor:
            b = torch.as_tensor(b, dtype=torch.result_type(a, b), device=a.device)
        return fn(a, b)
    if isinstance(a, _Number) and isinstance(b, _Number):
        return scalar_math.evaluate(name, (a, b))
    raise TypeError(f"opforge.{name} takes tensors or Python numbers, got {type(a).__name__} and {type(b).__name__}")


def minimum(a: Any, b: Any) -> Any:
    """Element-wise minimum with broadcasting; ``nan`` wins, as in ``torch.minimum``.

    Either side may be a Python number.

    Example:
        >>> import torch
        >>> minimum(torch.tensor([1.0, 5.0]), 3.0).tolist()
        [1.0, 3.0]
    """
    return _binary("minimum", a, b)


def maximum(a: Any, b: Any) -> Any:
    """Element-wise maximum with broadcasting; ``nan`` wins, as in ``torch.maximum``.

    Example:
        >>> import torch
        >>> maximum(torch.tensor([1.0, 5.0]), 3.0).tolist()
        [3.0, 5.0]
    """
    return _binary("maximum", a, b)


def where(condition: Any, a: Any, b: Any) -> Any:
    """``a`` where ``condition`` holds, else ``b``; any of them may broadcast, ``a``/``b`` may be numbers.

    Example:
        >>> import torch
        >>> x = torch.tensor([-1.0, 2.0])
        >>> where(x > 0, x, 0.0).tolist()
        [0.0, 2.0]
    """
    sym = _symbolic(condition, a, b)
    if sym is not None:
        return sym._opforge_apply_("where", (condition, a, b), {})
    if isinstance(condition, torch.Tensor):
        return torch.where(condition, a, b)
    if isinstance(condition, _Number):
        return a if condition else b
    raise TypeError(f"opforge.where takes a bool tensor condition, got {type(condition).__name__}")


def pow(x: Any, exponent: Any) -> Any:
    """``x ** exponent``; inside a fused function the exponent must be a constant (a Python number).

    Example:
        >>> import torch
        >>> pow(torch.tensor([3.0]), 2).item()
        9.0
    """
    sym = _symbolic(x, exponent)
    if sym is not None:
        return sym._opforge_apply_("pow", (x, exponent), {})
    if isinstance(x, torch.Tensor) or isinstance(exponent, torch.Tensor):
        return torch.pow(x, exponent)
    if isinstance(x, _Number) and isinstance(exponent, _Number):
        return builtins.pow(x, exponent)
    raise TypeError(f"opforge.pow takes tensors or Python numbers, got {type(x).__name__}")


def cast(x: Any, dtype: torch.dtype) -> Any:
    """``x.to(dtype)``: converts (rounds, truncates) as torch does, also inside fused functions.

    Example:
        >>> import torch
        >>> cast(torch.tensor([1.7]), torch.int32).tolist()
        [1]
    """
    if isinstance(x, torch.Tensor):
        return x.to(dtype)
    sym = _symbolic(x)
    if sym is not None:
        return sym._opforge_apply_("cast", (x, dtype), {})
    raise TypeError(f"opforge.cast takes a tensor, got {type(x).__name__}")


__all__ = ["exp", "log", "sqrt", "rsqrt", "tanh", "erf", "sigmoid", "abs", "minimum", "maximum", "where",
           "pow", "cast"]
