"""Python source running a fused graph with torch ops: the path wherever no kernel backend runs.

It is generated like the kernels (so ``.source("cpu")`` shows it) and computes as they do:
half inputs are converted to float32 once, every op runs in its compute dtype, outputs are
converted to their dtype at the end. Python-number subexpressions are evaluated in Python.

Example:
    >>> import torch
    >>> from opforge.fusion.tracer import trace
    >>> r = trace(lambda x, s: x * s, (torch.ones(2, dtype=torch.bfloat16), 2.0))
    >>> print(generate(r.graph, r.graph.reachable(), "f").splitlines()[-2].split("#")[0].strip())
    v2 = (v0 * s1)
"""
from __future__ import annotations

import math
from typing import Optional

import torch

from .dtypes import compute_dtype
from .graph import Graph, Node

_UNARY = {"exp": "torch.exp", "log": "torch.log", "sqrt": "torch.sqrt", "rsqrt": "torch.rsqrt",
          "tanh": "torch.tanh", "erf": "torch.erf", "sigmoid": "torch.sigmoid", "abs": "torch.abs",
          "exp2": "torch.exp2", "log2": "torch.log2"}
_INFIX = {"add": "+", "sub": "-", "mul": "*", "div": "/", "and": "&", "or": "|", "xor": "^",
          "eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}


def _number(value: object) -> str:
    if isinstance(value, float) and not math.isfinite(value):
        return f"float('{value}')"
    return repr(value)


class _Value:
    __slots__ = ("expr", "dtype")

    def __init__(self, expr: str, dtype: Optional[torch.dtype]):
        self.expr, self.dtype = expr, dtype   # dtype None: a Python number


def _convert(v: _Value, target: torch.dtype) -> str:
    if v.dtype is None or v.dtype == target:
        return v.expr
    return f"{v.expr}.to({target})"


def _tensor_expression(node: Node, target: torch.dtype, args: list[_Value]) -> str:
    op = node.op
    if op == "cast":
        exact = _convert(args[0], node.dtype)
        return exact if node.dtype == target else f"{exact}.to({target})"
    if op in ("eq", "ne", "lt", "le", "gt", "ge"):
        common = compute_dtype(node.attr, max(a.tier for a in node.inputs), "torch")
        a, b = (_convert(v, common) for v in args)
        return f"({a} {_INFIX[op]} {b})"
    if op == "where":
        cond = args[0].expr if args[0].dtype is not None else f"torch.as_tensor({args[0].expr}, device=_device)"
        a, b = (_convert(v, target) for v in args[1:])
        both_numbers = args[1].dtype is None and args[2].dtype is None
        return f"torch.where({cond}, {a}, {b})" + (f".to({target})" if both_numbers else "")
    if op == "fill":
        value, _ = node.attr
        return f"torch.full_like({_convert(args[0], target)}, {_number(value)}, dtype={target})"
    xs = [_convert(v, target) for v in args]
    if op in _INFIX:
        return f"({xs[0]} {_INFIX[op]} {xs[1]})"
    if op in ("minimum", "maximum"):
        if args[0].dtype is not None and args[1].dtype is not None:
            return f"torch.{op}({xs[0]}, {xs[1]})"
        tensor, number = (xs[0], xs[1]) if args[0].dtype is not None else (xs[1], xs[0])
        bound = "max" if op == "minimum" else "min"
        return f"torch.clamp({tensor}, {bound}={number})"
    if op == "neg":
        return f"(-{xs[0]})"
    if op == "not":
        return f"torch.logical_not({xs[0]})" if target == torch.bool else f"torch.bitwise_not({xs[0]})"
    return f"{_UNARY[op]}({xs[0]})"


def _number_expression(node: Node, args: list[_Value]) -> str:
    if node.op == "cast":
        kind = "float" if node.dtype.is_floating_point else "bool" if node.dtype == torch.bool else "int"
        return f"{kind}({args[0].expr})"
    return f"_scalar({node.op!r}, ({', '.join(a.expr for a in args)},))"


def generate(graph: Graph, nodes: list[Node], name: str, title: str = "") -> str:
    """A module defining ``name(*used inputs and scalars)`` that returns the outputs as a tuple."""
    params = [f"in{n.attr}" for n in nodes if n.op == "input"] + [f"s{n.attr}" for n in nodes if n.op == "scalar"]
    body: list[str] = []
    values: dict[int, _Value] = {}
    shown = ""
    first = next((n for n in nodes if n.op == "input"), None)
    if first is not None:
        body.append(f"_device = in{first.attr}.device")
    for node in nodes:
        target = compute_dtype(node.dtype, node.tier, "torch")
        if node.op == "const":
            values[node.index] = _Value(_number(node.attr), None)
            continue
        if node.op == "scalar":
            values[node.index] = _Value(f"s{node.attr}", None)
            continue
        var = f"v{node.index}"
        args = [values[a.index] for a in node.inputs]
        if node.op == "input":
            expr = _convert(_Value(f"in{node.attr}", node.dtype), target)
            values[node.index] = _Value(var, target)
        elif not node.is_tensor:
            expr = _number_expression(node, args)
            values[node.index] = _Value(var, None)
        else:
            expr = _tensor_expression(node, target, args)
            values[node.index] = _Value(var, target)
        text = node.line.text if node.line is not None else ""
        body.append(f"{var} = {expr}  # {node.op}" + (f": {text}"[:80] if text and text != shown else ""))
        shown = text or shown
    outs = []
    for node in graph.outputs:
        v = values[node.index]
        copy = ", copy=True" if node.op == "input" else ""
        outs.append(f"{v.expr}.to({node.dtype}{copy})")
    body.append(f"return ({', '.join(outs)},)")
    lines = [
        f'"""Generated by opforge.fuse{": " + title if title else ""}: the torch path. Do not edit."""',
        "import torch",
        "from opforge.fusion.scalar_math import evaluate as _scalar",
        "",
        "",
        f"def {name}({', '.join(params)}):",
    ] + ["    " + line for line in body]
    return "\n".join(lines) + "\n"
