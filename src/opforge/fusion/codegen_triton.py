"""Triton source for a fused graph.

One kernel per (graph, layout structure). Each program loads its block of every input once,
converts it to the compute dtype (float32 for half types), evaluates the nodes in order, and
stores every output converted to its dtype. Only primitives available both to the compiler and
to Triton's CPU interpreter are used, so the kernel the tests run is the kernel the GPU runs.

Example:
    >>> import torch
    >>> from opforge.fusion.tracer import trace
    >>> from opforge.fusion.layout import analyze
    >>> args = (torch.ones(4, 8), torch.ones(8))
    >>> r = trace(lambda x, b: x + b, args)
    >>> nodes = r.graph.reachable()
    >>> src = generate(r.graph, nodes, analyze(r.graph, nodes, args, "f"), "f_kernel")
    >>> "@triton.jit" in src
    True
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch

from .dtypes import compute_dtype
from .graph import Graph, Node
from .layout import COL, FULL, HOST, ROW, SCALAR, STRIDED, Layout

TL_TYPES = {
    torch.float16: "tl.float16", torch.bfloat16: "tl.bfloat16", torch.float32: "tl.float32",
    torch.float64: "tl.float64", torch.uint8: "tl.uint8", torch.int8: "tl.int8", torch.int16: "tl.int16",
    torch.int32: "tl.int32", torch.int64: "tl.int64", torch.bool: "tl.int1",
}

_TANH_HELPER = '''
@triton.jit
def _tanh(x):
    # (1 - e) / (1 + e) with e = exp(-2|x|); an odd Taylor polynomial near 0, where 1 - e cancels.
    ax = tl.abs(x)
    e = tl.exp(-2.0 * ax)
    t = tl.div_rn(1.0 - e, 1.0 + e)
    t = tl.where(x < 0, -t, t)
    x2 = x * x
    small = x * (1.0 + x2 * (-0.3333333333333333 + x2 * (0.13333333333333333 + x2 * -0.05396825396825397)))
    return tl.where(ax < 0.0625, small, t)
'''


@dataclass(frozen=True)
class Signature:
    """The generated kernel's parameters, in order, and what the launcher passes for each."""

    params: tuple[str, ...]
    scalar_params: tuple[str, ...]     # never specialized by value (do_not_specialize)


class _Value:
    """How the kernel holds a node: a Python expression, its Triton dtype (None when unknown,
    e.g. an int argument Triton types by value) and its footprint (rows, cols bits)."""

    __slots__ = ("expr", "dtype", "footprint", "literal")

    def __init__(self, expr: str, dtype: Optional[torch.dtype], footprint: int, literal: object = None):
        self.expr, self.dtype, self.footprint, self.literal = expr, dtype, footprint, literal


ROWS, COLS = 1, 2


def _literal(value: object, target: torch.dtype) -> str:
    if target == torch.bool:
        return "True" if bool(value) else "False"
    if target.is_floating_point:
        v = float(value)  # type: ignore[arg-type]
        if math.isnan(v):
            return "(_INF - _INF)"  # a NaN global would fail Triton's changed-global check (nan != nan)
        if math.isinf(v):
            return "_INF" if v > 0 else "-_INF"
        return repr(v)
    return str(int(value))  # type: ignore[arg-type]


def _convert(v: _Value, target: torch.dtype) -> str:
    if v.literal is not None:
        return _literal(v.literal, target)
    if v.dtype == target:
        return v.expr
    if target == torch.bool:
        return f"({v.expr} != 0)"
    return f"{v.expr}.to({TL_TYPES[target]})"


class _Emitter:
    def __init__(self, graph: Graph, nodes: list[Node], layout: Layout, name: str):
        self.graph, self.nodes, self.layout, self.name = graph, nodes, layout, name
        self.lines: list[str] = []
        self.values: dict[int, _Value] = {}
        self.uses_tanh = False
        self.full_footprint = ROWS | COLS

    def emit(self, line: str) -> None:
        self.lines.append("    " + line)

    def signature(self) -> Signature:
        layout = self.layout
        params: list[str] = [f"out{i}" for i in range(len(self.graph.outputs))]   # a tensor comes first
        scalars: list[str] = []
        for p, cls in layout.classes:
            if cls == HOST:
                params.append(f"h{p}")
                scalars.append(f"h{p}")
            else:
                params.append(f"in{p}")
        for node in self.nodes:
            if node.op == "scalar":
                params.append(f"s{node.attr}")
                scalars.append(f"s{node.attr}")
        if layout.flat:
            params.append("numel")
        else:
            params += ["M", "N", "tiles_n"]
            if any(c == STRIDED for _, c in layout.classes):
                params += [f"size{d}" for d in range(layout.rank - 1)]
                for p, _ in layout.strides:
                    params += [f"st{p}_{d}" for d in range(layout.rank)]
        params += ["BLOCK"] if layout.flat else ["BLOCK_M", "BLOCK_N"]
        return Signature(tuple(params), tuple(scalars))

    # --- index math ---
    def prologue(self) -> None:
        layout = self.layout
        emit = self.emit
        if layout.flat:
            emit("pid = tl.program_id(0)")
            start = "pid.to(tl.int64) * BLOCK" if layout.i64 else "pid * BLOCK"
            emit(f"offs = {start} + tl.arange(0, BLOCK)")
            emit("mask = offs < numel")
            return
        emit("pid = tl.program_id(0)")
        emit("pid_m = pid // tiles_n")
        emit("pid_n = pid - pid_m * tiles_n")
        start = "pid_m.to(tl.int64) * BLOCK_M" if layout.i64 else "pid_m * BLOCK_M"
        emit(f"rows = {start} + tl.arange(0, BLOCK_M)")
        emit("cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)")
        if layout.i64:
            emit("cols = cols.to(tl.int64)")
        emit("row_ok = rows < M")
        emit("col_ok = cols < N")
        emit("mask = row_ok[:, None] & col_ok[None, :]")
        emit("offs = rows[:, None] * N + cols[None, :]")
        if layout.strides:
            rank = layout.rank
            emit("r = rows")
            for d in range(rank - 2, 0, -1):
                emit(f"c{d} = r % size{d}")
                emit(f"r = r // size{d}")
            if rank >= 2:
                emit("c0 = r")

    def load(self, node: Node) -> _Value:
        p = node.attr
        cls = dict(self.layout.classes)[p]
        flat = self.layout.flat
        full = self.full_footprint if not flat else 1
        if cls == HOST:
            return _Value(f"h{p}", None, 0)
        target = compute_dtype(node.dtype, node.tier, "triton")
        if cls == SCALAR:
            expr, footprint = f"tl.load(in{p})", 0
        elif cls == FULL:
            expr, footprint = f"tl.load(in{p} + offs, mask=mask)", full
        elif cls == ROW:
            expr, footprint = f"tl.load(in{p} + cols, mask=col_ok)[None, :]", COLS
        elif cls == COL:
            expr, footprint = f"tl.load(in{p} + rows, mask=row_ok)[:, None]", ROWS
        else:
            rank = self.layout.rank
            terms = [f"c{d} * st{p}_{d}" for d in range(rank - 1)]
            if terms:
                self.emit(f"roff{p} = " + " + ".join(terms))
                expr = f"tl.load(in{p} + (roff{p}[:, None] + (cols * st{p}_{rank - 1})[None, :]), mask=mask)"
            else:
                expr = f"tl.load(in{p} + (cols * st{p}_0)[None, :], mask=mask)"
            footprint = full
        if target != node.dtype:
            expr += f".to({TL_TYPES[target]})"
        return _Value(expr, target, footprint)

    # --- nodes ---
    def value(self, node: Node) -> _Value:
        op = node.op
        if op == "input":
            return self.load(node)
        if op == "scalar":
            typed = torch.float32 if node.dtype.is_floating_point else torch.bool if node.dtype == torch.bool else None
            return _Value(f"s{node.attr}", typed, 0)  # Triton types int arguments by value: i32 or i64
        if op == "const":
            return _Value(repr(node.attr), None, 0, literal=node.attr)
        target = compute_dtype(node.dtype, node.tier, "triton")
        args = [self.values[a.index] for a in node.inputs]
        footprint = 0
        for a in args:
            footprint |= a.footprint
        return _Value(self.expression(node, target, args), target, footprint)

    def expression(self, node: Node, target: torch.dtype, args: list[_Value]) -> str:
        op = node.op
        if op == "cast":
            exact = _convert(args[0], node.dtype) if node.dtype != torch.bool else f"({args[0].expr} != 0)"
            return exact if node.dtype == target else f"{exact}.to({TL_TYPES[target]})"
        if op in ("eq", "ne", "lt", "le", "gt", "ge"):
            common = compute_dtype(node.attr, max(a.tier for a in node.inputs), "triton")
            a, b = (_convert(v, common) for v in args)
            return f"({a} {_CMP[op]} {b})"
        if op == "where":
            cond = _convert(args[0], torch.bool)
            a, b = (_convert(v, target) for v in args[1:])
            return f"tl.where({cond}, {a}, {b})"
        if op == "fill":
            value, _ = node.attr
            x, c = _convert(args[0], target), _literal(value, target)
            return f"tl.where({x} != {x}, {c}, {c})"   # c in x's shape, NaN or not (no library jit function)
        xs = [_convert(v, target) for v in args]
        if target == torch.bool and op in _BOOL_LOGIC:   # not & | ^ on int1: the interpreter mistypes those
            return _BOOL_LOGIC[op].format(*xs)
        if op in _INFIX:
            return f"({xs[0]} {_INFIX[op]} {xs[1]})"
        if op == "div":
            return f"tl.div_rn({xs[0]}, {xs[1]})"
        if op in ("minimum", "maximum"):
            nan = ", propagate_nan=tl.PropagateNan.ALL" if target.is_floating_point else ""
            return f"tl.{op}({xs[0]}, {xs[1]}{nan})"
        if op == "neg":
            return f"(-{xs[0]})"
        if op == "not":
            return f"({xs[0]} == 0)" if target == torch.bool else f"(~{xs[0]})"
        if op == "sigmoid":
            return f"tl.div_rn(1.0, 1.0 + tl.exp(-{xs[0]}))"
        if op == "tanh":
            self.uses_tanh = True
            return f"_tanh({xs[0]})"
        return f"{_FUNCTIONS[op]}({xs[0]})"

    def store(self, i: int, node: Node) -> None:
        v = self.values[node.index]
        expr = _convert(v, node.dtype) if v.literal is None else _literal(v.literal, node.dtype)
        full = self.full_footprint if not self.layout.flat else 1
        if v.footprint != full:
            shape = "(BLOCK,)" if self.layout.flat else "(BLOCK_M, BLOCK_N)"
            expr = f"tl.broadcast_to({expr}, {shape})"
        self.emit(f"tl.store(out{i} + offs, {expr}, mask=mask)")

    def body(self) -> None:
        self.prologue()
        shown = ""
        for node in self.nodes:
            v = self.value(node)
            if node.op == "const":
                self.values[node.index] = v
                continue
            name = f"v{node.index}"
            text = node.line.text if node.line is not None else ""
            comment = f"  # {node.op}" + (f": {text}"[:80] if text and text != shown else "")
            shown = text or shown
            self.emit(f"{name} = {v.expr}{comment}")
            self.values[node.index] = _Value(name, v.dtype, v.footprint)
        for i, node in enumerate(self.graph.outputs):
            self.store(i, node)


_BOOL_LOGIC = {"and": "tl.where({0}, {1}, False)", "or": "tl.where({0}, True, {1})", "xor": "({0} != {1})"}
_CMP = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
_INFIX = {"add": "+", "sub": "-", "mul": "*", "and": "&", "or": "|", "xor": "^"}
_FUNCTIONS = {"exp": "tl.exp", "log": "tl.log", "sqrt": "tl.sqrt_rn", "rsqrt": "tl.rsqrt", "erf": "tl.erf",
              "abs": "tl.abs", "exp2": "tl.exp2", "log2": "tl.log2"}


def generate(graph: Graph, nodes: list[Node], layout: Layout, kernel_name: str,
             title: str = "") -> str:
    """The Triton module (source text) holding ``kernel_name`` for this graph and layout."""
    em = _Emitter(graph, nodes, layout, kernel_name)
    em.body()
    sig = em.signature()
    params = [p if p not in ("BLOCK", "BLOCK_M", "BLOCK_N") else f"{p}: tl.constexpr" for p in sig.params]
    header = [
        f'"""Generated by opforge.fuse{": " + title if title else ""}. Do not edit: regenerated on demand."""',
        "import triton",
        "import triton.language as tl",
        "",
        "_INF = tl.constexpr(float('inf'))",
    ]
    if em.uses_tanh:
        header.append(_TANH_HELPER)
    header += [
        "",
        f"@triton.jit(do_not_specialize={list(sig.scalar_params)!r})" if sig.scalar_params else "@triton.jit",
        f"def {kernel_name}({', '.join(params)}):",
    ]
    return "\n".join(header + em.lines) + "\n"


def signature(graph: Graph, nodes: list[Node], layout: Layout) -> Signature:
    """The parameters of the kernel ``generate`` writes for this graph and layout."""
    return _Emitter(graph, nodes, layout, "").signature()
