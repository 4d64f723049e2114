"""The expression graph a traced function becomes: typed nodes, built with CSE and folding.

Every node is created through :meth:`Graph.add`, which

* types it as torch would (``dtypes.result_dtype``), rejecting what torch rejects,
* folds it when all its inputs are constants, and drops identities (``x * 1``, ``x - 0``),
* returns the existing node when the same op was already applied to the same inputs, so a
  common subexpression is computed once.

Nodes are created in an order where inputs come first, so ``Graph.nodes`` is topological.

Example:
    >>> import torch
    >>> g = Graph()
    >>> x = g.input(0, torch.float32, rank=2)
    >>> a = g.add("exp", (x,)); b = g.add("exp", (x,))
    >>> a is b
    True
"""
from __future__ import annotations

import math
from typing import Any, Optional, Sequence

import torch

from . import scalar_math
from .dtypes import DIM, WRAPPED, ZERO_DIM, is_float, python_dtype, result_dtype, short_name
from .errors import FusionError, SourceLine

FLOAT_UNARY = ("exp", "log", "sqrt", "rsqrt", "tanh", "erf", "sigmoid", "exp2", "log2")
SAME_UNARY = ("neg", "abs", "not")
ARITH = ("add", "sub", "mul")
COMPARE = ("eq", "ne", "lt", "le", "gt", "ge")
BITWISE = ("and", "or", "xor")
MINMAX = ("minimum", "maximum")
BINARY = ARITH + ("div",) + COMPARE + BITWISE + MINMAX
UNARY = FLOAT_UNARY + SAME_UNARY


class Node:
    """One value of the graph.

    Attributes:
        op: ``"input"``, ``"scalar"``, ``"const"``, a pointwise op name, ``"where"``, ``"cast"``
            or ``"fill"``.
        inputs: the operand nodes.
        attr: op-specific: the argument position (input, scalar), the value (const), the target
            dtype (cast), the operands' common dtype (comparisons), ``(value,)`` (fill).
        dtype: the dtype torch would give this value.
        tier: ``WRAPPED`` (a Python number), ``ZERO_DIM`` or ``DIM``.
        index: position in ``Graph.nodes``.
        line: the user's line that created it, for error messages.
    """

    __slots__ = ("op", "inputs", "attr", "dtype", "tier", "index", "line")

    def __init__(self, op: str, inputs: tuple, attr: Any, dtype: torch.dtype, tier: int, index: int,
                 line: Optional[SourceLine]):
        self.op, self.inputs, self.attr, self.dtype, self.tier = op, inputs, attr, dtype, tier
        self.index, self.line = index, line

    @property
    def is_const(self) -> bool:
        return self.op == "const"

    @property
    def is_tensor(self) -> bool:
        """False for Python numbers and expressions of them only."""
        return self.tier != WRAPPED

    def __repr__(self) -> str:
        args = ", ".join(f"%{n.index}" for n in self.inputs)
        attr = "" if self.attr is None else f" [{self.attr}]"
        return f"%{self.index} = {self.op}({args}){attr} : {short_name(self.dtype)}"


def _const_key(value: Any) -> tuple:
    return ("const", type(value).__name__, repr(value))


class Graph:
    """Typed nodes with hash-consing; ``outputs`` is set by the tracer.

    Example:
        >>> import torch
        >>> g = Graph()
        >>> x = g.input(0, torch.bfloat16, rank=2)
        >>> y = g.add("mul", (x, g.const(2.0)))
        >>> y.dtype, y.tier == DIM
        (torch.bfloat16, True)
    """

    def __init__(self) -> None:
        self.nodes: list[Node] = []
        self.outputs: list[Node] = []
        self._memo: dict[tuple, Node] = {}

    def _new(self, key: tuple, op: str, inputs: tuple, attr: Any, dtype: torch.dtype, tier: int,
             line: Optional[SourceLine]) -> Node:
        node = self._memo.get(key)
        if node is None:
            node = Node(op, inputs, attr, dtype, tier, len(self.nodes), line)
            self.nodes.append(node)
            self._memo[key] = node
        return node

    def input(self, position: int, dtype: torch.dtype, rank: int) -> Node:
        """A tensor argument of the function."""
        return self._new(("input", position), "input", (), position, dtype, DIM if rank else ZERO_DIM, None)

    def scalar(self, position: int, value: object) -> Node:
        """A Python-number argument, passed to the kernel at run time (its value is not baked in)."""
        return self._new(("scalar", position), "scalar", (), position, python_dtype(value), WRAPPED, None)

    def const(self, value: object) -> Node:
        """A Python number baked into the kernel."""
        if not isinstance(value, (bool, int, float)):
            raise TypeError(f"not a Python number: {value!r}")
        return self._new(_const_key(value), "const", (), value, python_dtype(value), WRAPPED, None)

    def add(self, op: str, inputs: Sequence[Node], attr: Any = None, line: Optional[SourceLine] = None) -> Node:
        """Create (or find) ``op(*inputs)``, typed, folded and simplified."""
        inputs = tuple(inputs)
        op, dtype, attr = _typed(op, inputs, attr, line)
        tier = max(n.tier for n in inputs)
        if all(n.is_const for n in inputs) and op not in ("cast", "fill"):
            value = scalar_math.evaluate(op, [n.attr for n in inputs])
            return self.const(value)
        same = _identity(op, inputs, dtype, tier)
        if same is not None:
            return same
        key = (op, tuple(n.index for n in inputs), attr)
        return self._new(key, op, inputs, attr, dtype, tier, line)

    def view(self, outputs: Sequence[int]) -> "Graph":
        """The same nodes with only the outputs at these indices (for a kernel computing a subset)."""
        sub = Graph()
        sub.nodes, sub._memo = self.nodes, self._memo
        sub.outputs = [self.outputs[i] for i in outputs]
        return sub

    def reachable(self) -> list[Node]:
        """The nodes the outputs depend on, in topological order (dead code dropped)."""
        live = [False] * len(self.nodes)
        for node in self.outputs:
            live[node.index] = True
        for node in reversed(self.nodes):
            if live[node.index]:
                for arg in node.inputs:
                    live[arg.index] = True
        return [n for n in self.nodes if live[n.index]]

    def __repr__(self) -> str:
        lines = [repr(n) for n in self.reachable()]
        lines.append("return " + ", ".join(f"%{n.index}" for n in self.outputs))
        return "\n".join(lines)


def _fail(message: str, line: Optional[SourceLine]) -> FusionError:
    return FusionError(message + (f" (at {line})" if line is not None else ""))


def _typed(op: str, inputs: tuple, attr: Any, line: Optional[SourceLine]) -> tuple[str, torch.dtype, Any]:
    """The dtype of ``op(*inputs)`` as torch computes it; torch's refusals become errors."""
    operands = [(n.dtype, n.tier) for n in inputs]
    scalar_only = all(n.tier == WRAPPED for n in inputs)
    if op in FLOAT_UNARY:
        dtype = inputs[0].dtype
        return op, dtype if is_float(dtype) else torch.get_default_dtype(), None
    if op in SAME_UNARY:
        dtype = inputs[0].dtype
        if dtype == torch.bool and op != "not":
            raise _fail(f"{op} is not supported on bool tensors (torch refuses it too)", line)
        if op == "not" and is_float(dtype):
            raise _fail("~ needs a bool or integer operand, got a floating one", line)
        if op == "not" and scalar_only:
            raise _fail("~ on a Python bool is not supported in fused functions", line)
        return op, dtype, None
    if op in ARITH or op in MINMAX or op in BITWISE:
        dtype = result_dtype(operands)
        if op in BITWISE and is_float(dtype):
            raise _fail(f"bitwise {op} needs bool or integer operands, got {short_name(dtype)}", line)
        if dtype == torch.bool and op in ARITH:
            if scalar_only:
                return op, torch.int64, None       # Python: True + True == 2
            if op == "sub":
                raise _fail("subtraction of bool tensors is not supported (torch refuses it too); use ^", line)
            return {"add": "or", "mul": "and"}[op], torch.bool, None
        return op, dtype, None
    if op == "div":
        dtype = result_dtype(operands)
        return op, dtype if is_float(dtype) else torch.get_default_dtype(), None
    if op in COMPARE:
        return op, torch.bool, result_dtype(operands)
    if op == "where":
        if inputs[0].dtype != torch.bool:
            raise _fail(f"where expects a bool condition, got {short_name(inputs[0].dtype)}", line)
        return op, result_dtype(operands[1:]), None
    if op == "cast":
        return op, attr, attr
    if op == "fill":
        value, dtype = attr
        return op, dtype, attr
    raise _fail(f"unknown operation {op!r}", line)


def _is_value(node: Node, value: float) -> bool:
    return node.is_const and not isinstance(node.attr, bool) and node.attr == value


def _identity(op: str, inputs: tuple, dtype: torch.dtype, tier: int) -> Optional[Node]:
    """``x * 1``, ``x / 1``, ``x - 0``, ``-(-x)``, a cast to the same dtype: return ``x``."""
    candidate = None
    if op == "mul":
        candidate = inputs[0] if _is_value(inputs[1], 1) else inputs[1] if _is_value(inputs[0], 1) else None
    elif op == "div" and _is_value(inputs[1], 1):
        candidate = inputs[0]
    elif op == "sub" and _is_value(inputs[1], 0):
        candidate = inputs[0]
    elif op == "add" and not is_float(dtype):
        candidate = inputs[0] if _is_value(inputs[1], 0) else inputs[1] if _is_value(inputs[0], 0) else None
    elif op == "neg" and inputs[0].op == "neg":
        candidate = inputs[0].inputs[0]
    elif op == "cast" and inputs[0].dtype == dtype:
        candidate = inputs[0]
    if candidate is not None and candidate.dtype == dtype and candidate.tier == tier:
        return candidate
    return None


def is_integral_value(value: float) -> bool:
    """True for a finite float with no fractional part (``3.0``) and for ints."""
    return isinstance(value, int) or (math.isfinite(value) and float(value).is_integer())
