"""Symbolic tensors: what a fused function receives while it is traced.

A ``Symbolic`` stands for a tensor argument, a Python-number argument, or any expression of
them. Its operators, its tensor methods, ``torch.*`` functions reached through
``__torch_function__``, and the opforge functions (which call ``_opforge_apply_``) all add nodes
to the tracer's graph. Anything else (a reduction, indexing, ``.view()``, ``if tensor:``, an
in-place update) raises ``UnfusableError`` naming the operation and the user's line.

Example:
    >>> import torch
    >>> from opforge.fusion.tracer import trace
    >>> result = trace(lambda x, s: (x * s).exp(), (torch.ones(2, 3), 0.5))
    >>> [n.op for n in result.graph.reachable()]
    ['input', 'scalar', 'mul', 'exp']
"""
from __future__ import annotations

from typing import Any, NoReturn, Optional, Protocol

import torch

from .dtypes import WRAPPED
from .errors import in_place_detail
from .graph import Node
from .torch_functions import dispatch


class Tracer(Protocol):
    """What a symbolic tensor asks of the tracer that made it (``opforge.fusion.tracer.Tracer``)."""

    def apply(self, op: str, args: tuple, kwargs: dict) -> Any: ...

    def refuse(self, operation: str, detail: str) -> NoReturn: ...

    def rank_of(self, node: Node) -> int: ...

    def shape_of(self, node: Node) -> torch.Size: ...

    def to(self, sym: Any, args: tuple, kwargs: dict) -> Any: ...

    def concrete(self, sym: Any, what: str) -> Any: ...

    @property
    def device(self) -> torch.device: ...


def _binary(op: str, reflected: bool = False):
    if reflected:
        def method(self: "Symbolic", other: Any) -> Any:
            return self._tracer.apply(op, (other, self), {})
    else:
        def method(self: "Symbolic", other: Any) -> Any:
            return self._tracer.apply(op, (self, other), {})
    method.__name__ = f"__{'r' if reflected else ''}{op}__"
    return method


def _unary(op: str):
    def method(self: "Symbolic") -> Any:
        return self._tracer.apply(op, (self,), {})
    method.__name__ = op
    return method


def _cast_to(dtype: torch.dtype):
    def method(self: "Symbolic", memory_format: Any = None) -> Any:
        return self._tracer.apply("cast", (self, dtype), {})
    return method


def _refuse(operation: str, detail: str):
    def method(self: "Symbolic", *args: Any, **kwargs: Any) -> NoReturn:
        self._tracer.refuse(operation, detail)
    return method


_INPLACE = "an in-place update changes its operand, which a fused kernel never does; write `x = x + y`"


class Symbolic:
    """A tensor (or Python number) inside a function being traced by ``opforge.fuse``.

    Example:
        >>> import torch
        >>> from opforge.fusion.tracer import trace
        >>> trace(lambda x: x.float() * 2, (torch.ones(3, dtype=torch.bfloat16),)).graph.outputs[0].dtype
        torch.float32
    """

    __slots__ = ("_node", "_tracer")
    _opforge_symbolic_ = True
    __hash__ = object.__hash__

    def __init__(self, node: "Node", tracer: "Tracer"):
        self._node = node
        self._tracer = tracer

    def _opforge_apply_(self, op_name: str, args: tuple, kwargs: dict) -> Any:
        """Record ``op_name(*args, **kwargs)``: the hook the opforge ops call on symbolic inputs."""
        return self._tracer.apply(op_name, args, kwargs)

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: tuple = (), kwargs: Optional[dict] = None) -> Any:
        return dispatch(func, args, kwargs or {})

    # --- facts known while tracing (they are part of the cache key) ---
    @property
    def dtype(self) -> torch.dtype:
        return self._node.dtype

    @property
    def ndim(self) -> int:
        return self._tracer.rank_of(self._node)

    def dim(self) -> int:
        return self.ndim

    @property
    def device(self) -> torch.device:
        return self._tracer.device

    @property
    def shape(self) -> torch.Size:
        """The concrete shape; using it makes the kernel specialize on every input's shape."""
        return self._tracer.shape_of(self._node)

    def size(self, dim: Optional[int] = None) -> Any:
        shape = self.shape
        return shape if dim is None else shape[dim]

    def numel(self) -> int:
        return self.shape.numel()

    def is_floating_point(self) -> bool:
        return self._node.dtype.is_floating_point

    # --- arithmetic and comparisons ---
    __add__, __radd__ = _binary("add"), _binary("add", True)
    __sub__, __rsub__ = _binary("sub"), _binary("sub", True)
    __mul__, __rmul__ = _binary("mul"), _binary("mul", True)
    __truediv__, __rtruediv__ = _binary("div"), _binary("div", True)
    __and__, __rand__ = _binary("and"), _binary("and", True)
    __or__, __ror__ = _binary("or"), _binary("or", True)
    __xor__, __rxor__ = _binary("xor"), _binary("xor", True)
    __eq__, __ne__ = _binary("eq"), _binary("ne")  # type: ignore[assignment]
    __lt__, __le__, __gt__, __ge__ = _binary("lt"), _binary("le"), _binary("gt"), _binary("ge")
    __neg__, __abs__, __invert__ = _unary("neg"), _unary("abs"), _unary("not")

    def __pos__(self) -> "Symbolic":
        return self

    def __pow__(self, exponent: Any) -> Any:
        return self._tracer.apply("pow", (self, exponent), {})

    def __rpow__(self, base: Any) -> NoReturn:
        self._tracer.refuse("a power with a tensor exponent", "only constant exponents fuse (x ** 2.0)")

    # --- tensor methods ---
    exp, log, sqrt, rsqrt, tanh = _unary("exp"), _unary("log"), _unary("sqrt"), _unary("rsqrt"), _unary("tanh")
    erf, sigmoid, abs, neg, negative = _unary("erf"), _unary("sigmoid"), _unary("abs"), _unary("neg"), _unary("neg")
    relu, logical_not = _unary("relu"), _unary("not")
    add, sub, mul, div = _binary("add"), _binary("sub"), _binary("mul"), _binary("div")
    eq, ne, lt, le, gt, ge = (_binary(op) for op in ("eq", "ne", "lt", "le", "gt", "ge"))
    minimum, maximum = _binary("minimum"), _binary("maximum")
    float, half, bfloat16, double = (_cast_to(d) for d in (torch.float32, torch.float16, torch.bfloat16,
                                                            torch.float64))
    int, long, bool = _cast_to(torch.int32), _cast_to(torch.int64), _cast_to(torch.bool)

    def pow(self, exponent: Any) -> Any:
        return self._tracer.apply("pow", (self, exponent), {})

    def clamp(self, min: Any = None, max: Any = None) -> Any:
        return self._tracer.apply("clamp", (self,), {"min": min, "max": max})

    clip = clamp

    def where(self, condition: Any, other: Any) -> Any:
        return self._tracer.apply("where", (condition, self, other), {})

    def to(self, *args: Any, **kwargs: Any) -> Any:
        """``x.to(dtype)`` or ``x.to(other)`` casts; moving to another device cannot be fused."""
        return self._tracer.to(self, args, kwargs)

    def type_as(self, other: Any) -> Any:
        return self._tracer.apply("cast", (self, other.dtype), {})

    def contiguous(self, memory_format: Any = None) -> "Symbolic":
        return self

    # --- Python conversions: a Python number converts (and the kernel specializes on its value) ---
    def __bool__(self) -> bool:
        return bool(self._tracer.concrete(self, "bool()"))

    def __float__(self) -> float:
        return float(self._tracer.concrete(self, "float()"))

    def __int__(self) -> int:
        return int(self._tracer.concrete(self, "int()"))

    def __index__(self) -> int:
        value = self._tracer.concrete(self, "an index")
        if isinstance(value, float):
            raise TypeError("a float cannot be used as an index")
        return int(value)

    # --- what cannot be fused ---
    __iadd__ = _refuse("in-place +=", _INPLACE)
    __isub__ = _refuse("in-place -=", _INPLACE)
    __imul__ = _refuse("in-place *=", _INPLACE)
    __itruediv__ = _refuse("in-place /=", _INPLACE)
    __ipow__ = _refuse("in-place **=", _INPLACE)
    __iand__ = _refuse("in-place &=", _INPLACE)
    __ior__ = _refuse("in-place |=", _INPLACE)
    __matmul__ = __rmatmul__ = _refuse("@ (matmul)", "a matrix product is not a pointwise operation")
    __floordiv__ = __rfloordiv__ = _refuse("// (floor division)", "not among the fused operations")
    __mod__ = __rmod__ = _refuse("% (remainder)", "not among the fused operations")
    __lshift__ = __rshift__ = _refuse("a bit shift", "not among the fused operations")
    __getitem__ = _refuse("indexing x[...]", "a fused kernel reads every element in place; index outside")
    __setitem__ = _refuse("item assignment x[...] = ...", _INPLACE)
    __iter__ = _refuse("iterating over a tensor", "that depends on its shape; iterate outside")
    __len__ = _refuse("len()", "use x.shape[0] (which specializes the kernel on shapes)")
    __array__ = _refuse("conversion to a numpy array", "values are not known while tracing")

    def __getattr__(self, name: str) -> NoReturn:
        if name.startswith("__"):
            raise AttributeError(name)
        detail = in_place_detail(f".{name}()") or "not a pointwise operation opforge.fuse knows"
        self._tracer.refuse(f"tensor attribute .{name}", detail, attribute=True)

    def __repr__(self) -> str:
        node = self._node
        kind = "Python number" if node.tier == WRAPPED else "tensor"
        return f"<symbolic {str(node.dtype).replace('torch.', '')} {kind} %{node.index}>"
