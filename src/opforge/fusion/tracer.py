"""Tracing: run the user's function once on symbolic arguments and keep the graph it builds.

Tensor arguments become graph inputs; Python numbers become run-time scalars (their values
are kernel arguments, not baked in, unless the function converts them with ``float()``/``if``,
which specializes the kernel on that value); anything else (a string, ``None``, a dtype) is
passed through as a constant and keyed by value.

Example:
    >>> import torch
    >>> result = trace(lambda x, b: x + b, (torch.ones(4, 8), torch.ones(8)))
    >>> len(result.graph.outputs), result.single
    (1, True)
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from types import CodeType
from typing import Any, Callable, NoReturn, Optional, Sequence

import torch

from . import expand, scalar_math
from .dtypes import SUPPORTED, WRAPPED, short_name
from .errors import FusionError, SourceLine, UnfusableError, user_line
from .graph import BINARY, UNARY, Graph, Node
from .symbolic import Symbolic


class UnfusableAttributeError(UnfusableError, AttributeError):
    """An unknown tensor attribute or method; an ``AttributeError`` so ``hasattr`` stays False."""


@dataclass
class TraceResult:
    """A traced function: its graph, and what its kernel must specialize on."""

    graph: Graph
    single: bool                               # the function returned one tensor, not a tuple
    value_positions: frozenset = frozenset()   # Python-number arguments whose value was used
    uses_shapes: bool = False                  # the function read .shape / .size()
    device: Optional[torch.device] = None
    ranks: dict = field(default_factory=dict)  # argument position -> rank, for tensor arguments


def code_of(fn: Callable) -> Optional[CodeType]:
    """The code object whose frame holds the user's lines (plain functions, partials, callables)."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    code = getattr(fn, "__code__", None)
    if code is None:
        code = getattr(getattr(fn, "__call__", None), "__code__", None)
    return code


class Tracer:
    """Builds the graph while the user's function runs on ``Symbolic`` values."""

    def __init__(self, name: str, code: Optional[CodeType], args: Sequence[Any]):
        self.graph = Graph()
        self.name = name
        self.code = code
        self.args = args
        self.value_positions: set[int] = set()
        self.uses_shapes = False
        self.device = next((a.device for a in args if isinstance(a, torch.Tensor)), torch.device("cpu"))
        self._deps: dict[int, frozenset] = {}

    # --- errors ---
    def line(self) -> Optional[SourceLine]:
        return user_line(self.code, skip=2)

    def refuse(self, operation: str, detail: str, attribute: bool = False) -> NoReturn:
        cls = UnfusableAttributeError if attribute else UnfusableError
        raise cls(operation, detail, self.line())

    def fail(self, message: str) -> NoReturn:
        where = self.line()
        raise FusionError(message + (f" (at {where})" if where else ""))

    # --- operands ---
    def node_of(self, value: Any) -> Node:
        if isinstance(value, Symbolic):
            if value._tracer is not self:
                self.fail("a symbolic value from another trace was used (kept from an earlier call?)")
            return value._node
        if isinstance(value, (bool, int, float)):
            return self.graph.const(value)
        if isinstance(value, torch.Tensor):
            self.refuse("a tensor from outside the function",
                        "tensors a fused function uses must be its arguments; pass it as one")
        item = getattr(value, "item", None)
        if callable(item) and getattr(value, "shape", None) == ():
            return self.graph.const(item())                  # a numpy scalar
        self.refuse(f"an operand of type {type(value).__name__}", "fused operations take tensors and Python numbers")

    def wrap(self, node: Node) -> Any:
        return node.attr if node.is_const else Symbolic(node, self)

    # --- recording operations ---
    def apply(self, name: str, args: tuple, kwargs: dict) -> Any:
        """Record ``name(*args, **kwargs)``; ``name`` is an opforge op or a graph op."""
        handler = _HANDLERS.get(name)
        if handler is None:
            self.refuse(f"opforge.{name}", "it is not a pointwise operation")
        try:
            return self.wrap(handler(self, *args, **kwargs))
        except TypeError as exc:
            if isinstance(exc, FusionError):
                raise
            self.fail(f"{name}: {exc}")

    def add(self, op: str, *operands: Any, attr: Any = None) -> Node:
        return self.graph.add(op, [self.node_of(v) for v in operands], attr, self.line())

    def constant_number(self, value: Any, what: str) -> Any:
        """A Python number for a place that needs one (pow's exponent, clamp bounds are fine as nodes)."""
        if isinstance(value, Symbolic):
            return self.concrete(value, what)
        if isinstance(value, (bool, int, float)):
            return value
        self.refuse(what + f" of type {type(value).__name__}", "it must be a Python number")

    def to(self, sym: Symbolic, args: tuple, kwargs: dict) -> Any:
        dtype = kwargs.get("dtype")
        device = kwargs.get("device")
        for arg in args:
            if isinstance(arg, torch.dtype):
                dtype = arg
            elif isinstance(arg, Symbolic):
                dtype = arg.dtype
            elif isinstance(arg, (str, torch.device)):
                device = arg
            elif arg is not None and not isinstance(arg, bool):
                self.refuse(f".to({arg!r})", "only a dtype (or a tensor, for its dtype) is understood")
        if device is not None and torch.device(device).type != self.device.type:
            self.refuse(f".to({device!r})", "a fused kernel runs on one device")
        return self.wrap(self.add("cast", sym, attr=dtype)) if dtype is not None else sym

    # --- facts about values ---
    def concrete(self, sym: Symbolic, what: str) -> Any:
        """The value of a Python-number expression; its arguments' values join the cache key."""
        node = sym._node
        if node.tier != WRAPPED:
            self.refuse(f"{what} of a tensor", "its values are not known while tracing; "
                        "data-dependent Python control flow cannot be fused (use opforge.where)")
        return self._evaluate(node)

    def _evaluate(self, node: Node) -> Any:
        if node.op == "const":
            return node.attr
        if node.op == "scalar":
            self.value_positions.add(node.attr)
            return self.args[node.attr]
        return scalar_math.evaluate(node.op, [self._evaluate(n) for n in node.inputs])

    def _inputs_of(self, node: Node) -> frozenset:
        deps = self._deps.get(node.index)
        if deps is None:
            if node.op == "input":
                deps = frozenset((node.attr,))
            else:
                deps = frozenset().union(*(self._inputs_of(n) for n in node.inputs)) if node.inputs else frozenset()
            self._deps[node.index] = deps
        return deps

    def rank_of(self, node: Node) -> int:
        return max((self.args[i].dim() for i in self._inputs_of(node)), default=0)

    def shape_of(self, node: Node) -> torch.Size:
        self.uses_shapes = True
        shapes = [self.args[i].shape for i in sorted(self._inputs_of(node))]
        return torch.broadcast_shapes(*shapes) if shapes else torch.Size()


# --- what each opforge / graph op name records ---
def _unary(op: str) -> Callable[..., Node]:
    return lambda t, x: t.add(op, x)


def _binary(op: str) -> Callable[..., Node]:
    return lambda t, a, b: t.add(op, a, b)


def _pow(t: Tracer, x: Any, exponent: Any) -> Node:
    if isinstance(exponent, Symbolic) and exponent._node.tier != WRAPPED:
        t.refuse("a power with a tensor exponent", "only constant exponents fuse (x ** 2.0)")
    p = t.constant_number(exponent, "pow's exponent")
    if not isinstance(x, Symbolic):
        t.refuse("a power of a constant base", "only tensor ** constant fuses")
    return expand.pow_(t.graph, t.node_of(x), p, t.line())


def _cast(t: Tracer, x: Any, dtype: torch.dtype) -> Node:
    if dtype not in SUPPORTED:
        t.fail(f"cannot cast to {dtype} in a fused function (supported: {', '.join(map(short_name, SUPPORTED))})")
    return t.add("cast", x, attr=dtype)


def _gelu(t: Tracer, x: Any, approximate: str = "none") -> Node:
    return expand.gelu(t.graph, t.node_of(x), approximate, t.line())


def _silu(t: Tracer, x: Any, inplace: bool = False) -> Node:
    if inplace:
        t.refuse("silu(inplace=True)", "a fused kernel never writes its inputs")
    return expand.silu(t.graph, t.node_of(x), t.line())


def _relu(t: Tracer, x: Any, inplace: bool = False) -> Node:
    if inplace:
        t.refuse("relu(inplace=True)", "a fused kernel never writes its inputs")
    return expand.relu(t.graph, t.node_of(x), t.line())


def _swiglu(t: Tracer, gate: Any, up: Any) -> Node:
    return t.graph.add("mul", (_silu(t, gate), t.node_of(up)), None, t.line())


def _geglu(t: Tracer, gate: Any, up: Any, approximate: str = "none") -> Node:
    return t.graph.add("mul", (_gelu(t, gate, approximate), t.node_of(up)), None, t.line())


def _clamp(t: Tracer, x: Any, min: Any = None, max: Any = None) -> Node:
    low = None if min is None else t.node_of(min)
    high = None if max is None else t.node_of(max)
    return expand.clamp(t.graph, t.node_of(x), low, high, t.line())


def _where(t: Tracer, condition: Any, a: Any, b: Any) -> Node:
    return t.add("where", condition, a, b)


_HANDLERS: dict[str, Callable[..., Node]] = {op: _unary(op) for op in UNARY}
_HANDLERS.update({op: _binary(op) for op in BINARY})
_HANDLERS.update(pow=_pow, cast=_cast, gelu=_gelu, silu=_silu, relu=_relu, swiglu=_swiglu, geglu=_geglu,
                 clamp=_clamp, where=_where)
for _internal in ("exp2", "log2"):
    _HANDLERS.pop(_internal, None)


def trace(fn: Callable, args: Sequence[Any], name: Optional[str] = None,
          keyword_names: Sequence[str] = ()) -> TraceResult:
    """Run ``fn`` on symbolic stand-ins for ``args`` and return the graph of what it computed.

    The last ``len(keyword_names)`` arguments are passed by those names (keyword-only parameters).

    Example:
        >>> import torch
        >>> r = trace(lambda x: (x.exp(), -x), (torch.ones(3),))
        >>> [n.op for n in r.graph.outputs]
        ['exp', 'neg']
    """
    name = name or getattr(fn, "__name__", type(fn).__name__)
    tracer = Tracer(name, code_of(fn), args)
    symbolic_args = []
    ranks = {}
    for position, arg in enumerate(args):
        if isinstance(arg, torch.Tensor):
            if arg.dtype not in SUPPORTED:
                raise TypeError(f"{name}: argument {position} is {short_name(arg.dtype)}; fused functions take "
                                f"{', '.join(map(short_name, SUPPORTED))} tensors")
            ranks[position] = arg.dim()
            symbolic_args.append(Symbolic(tracer.graph.input(position, arg.dtype, arg.dim()), tracer))
        elif type(arg) in (bool, int, float):
            symbolic_args.append(Symbolic(tracer.graph.scalar(position, arg), tracer))
        else:
            symbolic_args.append(arg)
    try:
        split = len(symbolic_args) - len(keyword_names)
        returned = fn(*symbolic_args[:split], **dict(zip(keyword_names, symbolic_args[split:])))
    except FusionError:
        raise
    except Exception as exc:
        if hasattr(exc, "add_note"):
            where = _traceback_line(exc, tracer.code)
            exc.add_note(f"(raised while opforge.fuse traced {name}" + (f", at {where})" if where else ")"))
        raise
    single = not isinstance(returned, (tuple, list))
    items = (returned,) if single else tuple(returned)
    tracer.graph.outputs = [_output_node(tracer, name, i, item, single) for i, item in enumerate(items)]
    if not items:
        raise FusionError(f"{name} returned an empty {type(returned).__name__}: a fused function must return "
                          "a tensor or a tuple of tensors")
    return TraceResult(tracer.graph, single, frozenset(tracer.value_positions), tracer.uses_shapes, tracer.device,
                       ranks)


def _traceback_line(exc: BaseException, code: Optional[CodeType]) -> Optional[SourceLine]:
    """The last line of the traced function that the exception passed through."""
    found = None
    tb = exc.__traceback__
    while tb is not None:
        if code is not None and tb.tb_frame.f_code is code:
            found = SourceLine(code.co_filename, tb.tb_lineno, code.co_name)
        tb = tb.tb_next
    return found


def _output_node(tracer: Tracer, name: str, i: int, item: Any, single: bool) -> Node:
    what = "its result" if single else f"output {i}"
    if isinstance(item, Symbolic) and item._tracer is tracer and item._node.is_tensor:
        return item._node
    if isinstance(item, Symbolic) and item._tracer is tracer or isinstance(item, (bool, int, float)):
        kind = "a Python number"
    elif isinstance(item, torch.Tensor):
        kind = "a tensor from outside the function"
    else:
        kind = f"a {type(item).__name__}"
    raise FusionError(f"{name} returned no tensor: {what} is {kind}; a fused function must return a tensor "
                      "computed from its tensor arguments, or a tuple of them")
