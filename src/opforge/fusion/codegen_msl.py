"""MSL (Metal) source for a fused graph, and its launch on MPS tensors or in the emulator.

One thread per output element: thread ``i`` reads what each input holds for element ``i``
(by the same classes as the Triton kernels: full, scalar, row, col, strided), computes in
float32 (half and bfloat inputs are converted once), and stores every output converted to
its dtype. The source is written to the fusion disk cache as a ``.metal`` file and compiled
by ``opforge.runtime.metal`` (``torch.mps.compile_shader`` on a Mac; the MSL emulator on CPU
tensors with ``OPFORGE_METAL_EMULATE=1``).

The Metal standard library has no ``erf``: ``opforge_erf`` below is a Taylor series for
|x| < 1 and ``1 - exp(-x^2) P(1/x)`` beyond, P a degree-8 least-squares fit of
``erfc(x) exp(x^2)`` on [1, 4] (absolute error under 1e-7 in float32).

Example:
    >>> import torch
    >>> from opforge.fusion.tracer import trace
    >>> from opforge.fusion.layout import analyze
    >>> args = (torch.ones(4, 8, dtype=torch.float16), torch.ones(8, dtype=torch.float16))
    >>> r = trace(lambda x, b: x + b, args)
    >>> nodes = r.graph.reachable()
    >>> "kernel void" in generate(r.graph, nodes, analyze(r.graph, nodes, args, "f"), "f_kernel")
    True
"""
from __future__ import annotations

import math
from typing import Any, Optional, Sequence

import torch

from ..runtime.metal import library as metal_runtime
from . import cache
from .dtypes import compute_dtype
from .graph import Graph, Node
from .layout import COL, FULL, HOST, ROW, SCALAR, STRIDED, Layout
from .outputs import empty, safe_name

MSL_TYPES = {
    torch.float16: "half", torch.bfloat16: "bfloat", torch.float32: "float", torch.uint8: "uchar",
    torch.int8: "char", torch.int16: "short", torch.int32: "int", torch.int64: "long", torch.bool: "bool",
}
GROUP_SIZE = 256
MAX_THREADS_PER_LAUNCH = 1 << 30

_TAYLOR = (1.128379167, -0.376126389, 0.1128379167, -0.02686617065, 0.005223977625, -0.0008548327023,
           0.0001205533298, -1.492565036e-05, 1.646211437e-06, -1.636584469e-07, 1.480719282e-08)
_ERFC_TAIL = (0.0002749496239, 0.5589596804, 0.04260877506, -0.4739546271, 0.5022039332, -0.2492160391,
              0.02991912053, 0.02565706991, -0.008869303557)


def _horner(coefficients: Sequence[float], var: str) -> str:
    expr = f"{coefficients[-1]!r}f"
    for c in reversed(coefficients[:-1]):
        expr = f"({c!r}f + {var} * {expr})"
    return expr


_ERF_HELPER = f"""
// erf for float: Taylor series below 1, 1 - exp(-x^2) P(1/x) above (P fitted on [1, 4]).
inline float opforge_erf(float x) {{
  float ax = fabs(x);
  if (ax < 1.0f) {{
    float t = x * x;
    return x * {_horner(_TAYLOR, "t")};
  }}
  float t = 1.0f / ax;
  float r = 1.0f - {_horner(_ERFC_TAIL, "t")} * precise::exp(-ax * ax);
  return x < 0.0f ? -r : r;
}}
"""

_FUNCTIONS = {"exp": "precise::exp", "log": "precise::log", "sqrt": "precise::sqrt", "rsqrt": "precise::rsqrt",
              "tanh": "precise::tanh", "exp2": "precise::exp2", "log2": "precise::log2", "erf": "opforge_erf"}
_INFIX = {"add": "+", "sub": "-", "mul": "*", "div": "/", "and": "&", "or": "|", "xor": "^",
          "eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}


def unsupported(result: Any) -> Optional[str]:
    """Why the metal backend cannot run this traced graph, or None (float64 is the one refusal)."""
    for node in result.graph.reachable():
        if node.dtype == torch.float64 and node.is_tensor:
            return "Metal has no float64"
    return None


def _literal(value: object, target: torch.dtype) -> str:
    if target == torch.bool:
        return "true" if value else "false"
    if target.is_floating_point:
        v = float(value)  # type: ignore[arg-type]
        if math.isnan(v):
            return "NAN"
        if math.isinf(v):
            return "INFINITY" if v > 0 else "(-INFINITY)"
        return f"{v!r}f"
    return f"{MSL_TYPES[target]}({int(value)})"  # type: ignore[arg-type]


class _Value:
    __slots__ = ("expr", "dtype", "literal")

    def __init__(self, expr: str, dtype: Optional[torch.dtype], literal: object = None):
        self.expr, self.dtype, self.literal = expr, dtype, literal


def _convert(v: _Value, target: torch.dtype) -> str:
    if v.literal is not None:
        return _literal(v.literal, target)
    if v.dtype == target:
        return v.expr
    if target == torch.bool:
        return f"({v.expr} != 0)"
    return f"{MSL_TYPES[target]}({v.expr})"


def _expression(node: Node, target: torch.dtype, args: list[_Value]) -> str:
    op = node.op
    if op == "cast":
        exact = _convert(args[0], node.dtype)
        return exact if node.dtype == target else f"{MSL_TYPES[target]}({exact})"
    if op in ("eq", "ne", "lt", "le", "gt", "ge"):
        common = compute_dtype(node.attr, max(a.tier for a in node.inputs), "metal")
        a, b = (_convert(v, common) for v in args)
        return f"({a} {_INFIX[op]} {b})"
    if op == "where":
        cond = _convert(args[0], torch.bool)
        a, b = (_convert(v, target) for v in args[1:])
        return f"({cond} ? {a} : {b})"
    if op == "fill":
        value, _ = node.attr
        return _literal(value, target)
    xs = [_convert(v, target) for v in args]
    if op in _INFIX:
        return f"({xs[0]} {_INFIX[op]} {xs[1]})"
    if op in ("minimum", "maximum"):
        pick = "fmin" if op == "minimum" else "fmax"
        if target.is_floating_point:   # NaN wins, as in torch: a + b is NaN when either is
            return f"((isnan({xs[0]}) || isnan({xs[1]})) ? ({xs[0]} + {xs[1]}) : {pick}({xs[0]}, {xs[1]}))"
        return f"{op[:3]}({xs[0]}, {xs[1]})"
    if op == "neg":
        return f"(-{xs[0]})"
    if op == "abs":
        return f"{'fabs' if target.is_floating_point else 'abs'}({xs[0]})"
    if op == "not":
        return f"(!{xs[0]})" if target == torch.bool else f"(~{xs[0]})"
    if op == "sigmoid":
        return f"(1.0f / (1.0f + precise::exp(-{xs[0]})))"
    return f"{_FUNCTIONS[op]}({xs[0]})"


def _params(graph: Graph, nodes: list[Node], layout: Layout) -> list[tuple[str, str]]:
    """(name, MSL declaration) per buffer index: outputs, inputs, scalars, sizes, base."""
    params = [(f"out{i}", f"device {MSL_TYPES[n.dtype]}* out{i}") for i, n in enumerate(graph.outputs)]
    dtypes = {n.attr: n.dtype for n in nodes if n.op == "input"}
    for p, cls in layout.classes:
        if cls == HOST:
            kind = "float" if dtypes[p].is_floating_point else "long"
            params.append((f"h{p}", f"constant {kind}& h{p}"))
        else:
            params.append((f"in{p}", f"device const {MSL_TYPES[dtypes[p]]}* in{p}"))
    for n in nodes:
        if n.op == "scalar":
            kind = "float" if n.dtype.is_floating_point else "long"
            params.append((f"s{n.attr}", f"constant {kind}& s{n.attr}"))
    names = ["numel", "N"]
    if layout.strides:
        names += [f"size{d}" for d in range(layout.rank - 1)]
        for p, _ in layout.strides:
            names += [f"st{p}_{d}" for d in range(layout.rank)]
    names.append("base")
    params += [(name, f"constant long& {name}") for name in names]
    return params


def generate(graph: Graph, nodes: list[Node], layout: Layout, kernel_name: str, title: str = "") -> str:
    """The ``.metal`` source of ``kernel_name`` for this graph and layout."""
    classes = dict(layout.classes)
    needs_rows = any(c in (ROW, COL, STRIDED) for c in classes.values())
    body = ["const long i = base + long(tid);", "if (i >= numel) {", "  return;", "}"]
    if needs_rows:
        body += ["const long row = i / N;", "const long col = i - row * N;"]
    if layout.strides:
        body.append("long r = row;")
        for d in range(layout.rank - 2, 0, -1):
            body += [f"const long c{d} = r % size{d};", f"r = r / size{d};"]
        if layout.rank >= 2:
            body.append("const long c0 = r;")
    values: dict[int, _Value] = {}
    uses_erf = False
    shown = ""
    for node in nodes:
        target = compute_dtype(node.dtype, node.tier, "metal")
        if node.op == "const":
            values[node.index] = _Value("", None, literal=node.attr)
            continue
        var = f"v{node.index}"
        if node.op == "scalar":
            kind = torch.float32 if node.dtype.is_floating_point else torch.int64
            body.append(f"const {MSL_TYPES[kind]} {var} = s{node.attr};")
            values[node.index] = _Value(var, kind)
            continue
        if node.op == "input":
            p = node.attr
            cls = classes[p]
            if cls == HOST:
                kind = torch.float32 if node.dtype.is_floating_point else torch.int64
                body.append(f"const {MSL_TYPES[kind]} {var}_raw = h{p};")
                expr = _convert(_Value(f"{var}_raw", kind), target)
            else:
                index = {FULL: "i", SCALAR: "0", ROW: "col", COL: "row"}.get(cls)
                if index is None:
                    terms = [f"c{d} * st{p}_{d}" for d in range(layout.rank - 1)] + [f"col * st{p}_{layout.rank - 1}"]
                    index = " + ".join(terms)
                expr = _convert(_Value(f"in{p}[{index}]", node.dtype), target)
        else:
            args = [values[a.index] for a in node.inputs]
            uses_erf = uses_erf or node.op == "erf"
            expr = _expression(node, target, args)
        text = node.line.text if node.line is not None else ""
        body.append(f"const {MSL_TYPES[target]} {var} = {expr};  // {node.op}" +
                    (f": {text}"[:80] if text and text != shown else ""))
        shown = text or shown
        values[node.index] = _Value(var, target)
    for k, node in enumerate(graph.outputs):
        body.append(f"out{k}[i] = {_convert(values[node.index], node.dtype)};")
    params = _params(graph, nodes, layout)
    decls = [f"{decl} [[buffer({b})]]" for b, (_, decl) in enumerate(params)]
    decls.append("uint tid [[thread_position_in_grid]]")
    lines = [f"// Generated by opforge.fuse{': ' + title if title else ''}. Do not edit: regenerated on demand.",
             "#include <metal_stdlib>", "using namespace metal;"]
    if uses_erf:
        lines.append(_ERF_HELPER)
    lines.append(f"kernel void {kernel_name}(" + ",\n    ".join(decls) + ") {")
    lines += ["  " + line for line in body]
    lines.append("}")
    return "\n".join(lines) + "\n"


class MetalKernel:
    """The graph as a generated Metal kernel, compiled through ``opforge.runtime.metal``."""

    backend = "metal"

    def __init__(self, graph: Graph, nodes: list[Node], layout: Layout, name: str, title: str = ""):
        self.name = f"{safe_name(name)}_kernel"
        self.source = generate(graph, nodes, layout, self.name, title)
        self.path = cache.write_source(self.source, self.name, suffix=".metal")
        self.out_dtypes = [n.dtype for n in graph.outputs]
        self.scalar_positions = tuple(n.attr for n in nodes if n.op == "scalar")

    def plan(self, layout: Layout, args: Sequence[Any], single: bool) -> Any:
        return _MetalPlan(self, layout, args, single)


class _MetalPlan:
    backend = "metal"
    variant = "elementwise"
    fallback_reason: Optional[str] = None

    def __init__(self, kernel: MetalKernel, layout: Layout, args: Sequence[Any], single: bool):
        self.device = next(args[p].device for p, c in layout.classes if c != HOST)
        self.fn = metal_runtime.kernel(kernel.path, kernel.name, self.device.type)
        self.single, self.shape, self.dtypes = single, layout.shape, kernel.out_dtypes
        self.positions = tuple(p for p, _ in layout.classes) + kernel.scalar_positions
        self.hosts = tuple(i for i, (p, c) in enumerate(layout.classes) if c == HOST)
        self.numbers = tuple(range(len(layout.classes), len(self.positions)))
        sizes: list[int] = [layout.numel, layout.cols]
        if layout.strides:
            sizes += list(layout.shape[:-1])
            for _, strides in layout.strides:
                sizes += list(strides)
        self.sizes = tuple(sizes)
        self.numel = layout.numel
        full = [p for p, c in layout.classes if c == FULL]
        self.trace_position = full[0] if full else layout.classes[0][0]
        self.note = f"{kernel.name} in {kernel.path}"

    def run(self, args: Sequence[Any]) -> Any:
        ins: list[Any] = [args[p] for p in self.positions]
        for i in self.hosts:
            ins[i] = ins[i].item()
        for i in self.hosts + self.numbers:
            if isinstance(ins[i], bool):   # kernels take Python bools as 64-bit integers
                ins[i] = int(ins[i])
        outs = [empty(self.shape, d, self.device) for d in self.dtypes]
        for base in range(0, self.numel, MAX_THREADS_PER_LAUNCH):
            threads = min(MAX_THREADS_PER_LAUNCH, self.numel - base)
            self.fn(*outs, *ins, *self.sizes, base, threads=threads, group_size=min(GROUP_SIZE, threads))
        return outs[0] if self.single else tuple(outs)


def build(graph: Graph, nodes: list[Node], layout: Optional[Layout], name: str, title: str) -> MetalKernel:
    """Generate the kernel's MSL and write it to the cache (compiled on first launch)."""
    assert layout is not None
    return MetalKernel(graph, nodes, layout, name, title)
