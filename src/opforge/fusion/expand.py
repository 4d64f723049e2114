"""Composite operations written as graph nodes: pow, the activations, clamp.

Each takes the graph, its operand nodes and the user's line, and returns the result node. The
activations follow their usual float formulas (the same ones ``opforge.ops.activation`` uses).

Example:
    >>> import torch
    >>> from opforge.fusion.graph import Graph
    >>> g = Graph()
    >>> x = g.input(0, torch.float32, rank=1)
    >>> pow_(g, x, 2, None).op
    'mul'
"""
from __future__ import annotations

import math
from typing import Optional

import torch

from .dtypes import WRAPPED, is_float, python_dtype, result_dtype, short_name
from .errors import FusionError, SourceLine
from .graph import Graph, Node, is_integral_value

SQRT1_2 = math.sqrt(0.5)
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
GELU_TANH_CUBIC = 0.044715
MAX_UNROLLED_POWER = 64


def _cast(g: Graph, x: Node, dtype: torch.dtype, line: Optional[SourceLine]) -> Node:
    return x if x.dtype == dtype else g.add("cast", (x,), dtype, line)


def pow_(g: Graph, x: Node, exponent: float, line: Optional[SourceLine]) -> Node:
    """``x ** exponent`` for a constant exponent: multiplications for integers, sqrt/rsqrt for +-0.5."""
    dtype = result_dtype([(x.dtype, x.tier), (python_dtype(exponent), WRAPPED)])
    floating = is_float(dtype)
    if not floating and exponent < 0:
        raise FusionError("integers to negative integer powers are not allowed (torch refuses them too)"
                          + (f" (at {line})" if line else ""))
    x = _cast(g, x, dtype, line)
    if exponent == 0:
        return g.add("fill", (x,), (1, dtype), line)
    if is_integral_value(exponent) and abs(exponent) <= MAX_UNROLLED_POWER:
        result = _power_by_squaring(g, x, int(abs(exponent)), line)
        return g.add("div", (g.const(1), result), None, line) if exponent < 0 else result
    if exponent == 0.5:
        return g.add("sqrt", (x,), None, line)
    if exponent == -0.5:
        return g.add("rsqrt", (x,), None, line)
    if is_integral_value(exponent):   # a large integer power: exp2(p log2|x|), sign from x if p is odd
        magnitude = g.add("exp2", (g.add("mul", (g.const(float(exponent)),
                                                 g.add("log2", (g.add("abs", (x,), None, line),), None, line)),
                                            None, line),), None, line)
        if int(exponent) % 2 == 0:
            return magnitude
        negative = g.add("lt", (x, g.const(0)), None, line)
        return g.add("where", (negative, g.add("neg", (magnitude,), None, line), magnitude), None, line)
    # a fractional power of a negative number is nan, as log2 of it is
    return g.add("exp2", (g.add("mul", (g.const(float(exponent)), g.add("log2", (x,), None, line)), None, line),),
                 None, line)


def _power_by_squaring(g: Graph, x: Node, k: int, line: Optional[SourceLine]) -> Node:
    result: Optional[Node] = None
    base = x
    while k:
        if k & 1:
            result = base if result is None else g.add("mul", (result, base), None, line)
        k >>= 1
        if k:
            base = g.add("mul", (base, base), None, line)
    assert result is not None
    return result


def _require_float(name: str, x: Node, line: Optional[SourceLine]) -> None:
    if not is_float(x.dtype):
        raise FusionError(f"{name} needs a floating tensor, got {short_name(x.dtype)}"
                          + (f" (at {line})" if line else ""))


def gelu(g: Graph, x: Node, approximate: str, line: Optional[SourceLine]) -> Node:
    """``0.5 x (1 + erf(x / sqrt 2))``, or with ``approximate="tanh"`` the tanh form."""
    _require_float("gelu", x, line)
    half_x = g.add("mul", (x, g.const(0.5)), None, line)
    if approximate == "none":
        inner = g.add("erf", (g.add("mul", (x, g.const(SQRT1_2)), None, line),), None, line)
    elif approximate == "tanh":
        cube = g.add("mul", (g.add("mul", (x, x), None, line), x), None, line)
        poly = g.add("add", (x, g.add("mul", (cube, g.const(GELU_TANH_CUBIC)), None, line)), None, line)
        inner = g.add("tanh", (g.add("mul", (poly, g.const(SQRT_2_OVER_PI)), None, line),), None, line)
    else:
        raise FusionError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}"
                          + (f" (at {line})" if line else ""))
    return g.add("mul", (half_x, g.add("add", (inner, g.const(1.0)), None, line)), None, line)


def silu(g: Graph, x: Node, line: Optional[SourceLine]) -> Node:
    """``x * sigmoid(x)``."""
    _require_float("silu", x, line)
    return g.add("mul", (x, g.add("sigmoid", (x,), None, line)), None, line)


def relu(g: Graph, x: Node, line: Optional[SourceLine]) -> Node:
    """``maximum(x, 0)``: nan stays nan, as in torch."""
    if x.dtype == torch.bool:
        raise FusionError("relu does not take bool tensors (torch refuses them too)"
                          + (f" (at {line})" if line else ""))
    return g.add("maximum", (x, g.const(0)), None, line)


def clamp(g: Graph, x: Node, low: Optional[Node], high: Optional[Node], line: Optional[SourceLine]) -> Node:
    """``minimum(maximum(x, low), high)``; where low > high the result is high, as in torch."""
    if low is None and high is None:
        raise FusionError("clamp needs min or max" + (f" (at {line})" if line else ""))
    if low is not None:
        x = g.add("maximum", (x, low), None, line)
    if high is not None:
        x = g.add("minimum", (x, high), None, line)
    return x
