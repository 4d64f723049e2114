"""The pointwise ops on Python numbers, with IEEE results instead of Python exceptions.

Used to fold constants while tracing, to evaluate scalar-only subexpressions on the torch
path, and by the public math functions when they get plain numbers. ``1.0 / 0.0`` is ``inf``,
``log(-1.0)`` is ``nan`` and ``exp(1000.0)`` is ``inf``, as on a tensor.

Example:
    >>> evaluate("div", (1.0, 0.0)), evaluate("log", (0.0,)), evaluate("exp", (1000.0,))
    (inf, -inf, inf)
"""
from __future__ import annotations

import math
from typing import Any, Callable, Sequence, Union

Number = Union[bool, int, float]
INF = float("inf")
NAN = float("nan")


def _exp(x: float) -> float:
    try:
        return math.exp(x)
    except OverflowError:
        return INF


def _log(x: float) -> float:
    if math.isnan(x) or x < 0:
        return NAN
    return -INF if x == 0 else math.log(x)


def _log2(x: float) -> float:
    return _log(x) / math.log(2.0) if not (x > 0 and math.isinf(x)) else INF


def _sqrt(x: float) -> float:
    return NAN if math.isnan(x) or x < 0 else math.sqrt(x)


def div(a: Number, b: Number) -> float:
    """True division with IEEE results for a zero divisor."""
    a, b = float(a), float(b)
    if b == 0.0:
        if a == 0.0 or math.isnan(a):
            return NAN
        return math.copysign(INF, a) * math.copysign(1.0, b)
    return a / b


def _rsqrt(x: float) -> float:
    return div(1.0, _sqrt(x))


def _sigmoid(x: float) -> float:
    return div(1.0, 1.0 + _exp(-x))


def _minmax(pick: Callable[[Any, Any], Any]) -> Callable[[Number, Number], Number]:
    def run(a: Number, b: Number) -> Number:
        if isinstance(a, float) and math.isnan(a):
            return a
        if isinstance(b, float) and math.isnan(b):
            return b
        return pick(a, b)
    return run


def _exp2(x: float) -> float:
    try:
        return math.pow(2.0, x)
    except OverflowError:
        return INF


def _float_unary(fn: Callable[[float], float]) -> Callable[[Number], float]:
    return lambda x: fn(float(x))


UNARY: dict[str, Callable[[Any], Number]] = {
    "exp": _float_unary(_exp), "log": _float_unary(_log), "sqrt": _float_unary(_sqrt),
    "rsqrt": _float_unary(_rsqrt), "tanh": _float_unary(math.tanh), "erf": _float_unary(math.erf),
    "sigmoid": _float_unary(_sigmoid), "exp2": _float_unary(_exp2), "log2": _float_unary(_log2),
    "neg": lambda x: -x, "abs": lambda x: -x if x < 0 else x, "not": lambda x: not x if isinstance(x, bool) else ~x,
}

BINARY: dict[str, Callable[[Any, Any], Number]] = {
    "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b, "div": div,
    "minimum": _minmax(min), "maximum": _minmax(max),
    "eq": lambda a, b: a == b, "ne": lambda a, b: a != b, "lt": lambda a, b: a < b,
    "le": lambda a, b: a <= b, "gt": lambda a, b: a > b, "ge": lambda a, b: a >= b,
    "and": lambda a, b: a & b, "or": lambda a, b: a | b, "xor": lambda a, b: a ^ b,
}


def evaluate(op: str, values: Sequence[Number]) -> Number:
    """Apply pointwise ``op`` to Python numbers.

    Example:
        >>> evaluate("maximum", (float("nan"), 1.0))
        nan
    """
    if op in UNARY:
        return UNARY[op](values[0])
    if op in BINARY:
        return BINARY[op](values[0], values[1])
    if op == "where":
        return values[1] if values[0] else values[2]
    raise KeyError(f"no scalar evaluation for {op!r}")
