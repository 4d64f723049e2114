"""``torch.*`` functions called on symbolic tensors inside a fused function.

``torch.exp(x)``, ``torch.where(c, x, y)``, ``F.gelu(x)``, ``x.sum()``... reach
``Symbolic.__torch_function__``, which lands here. Pointwise functions opforge.fuse knows are
recorded; any other raises ``UnfusableError`` naming the function and the user's line.

Example:
    >>> import torch
    >>> from opforge.fusion.tracer import trace
    >>> trace(lambda x: torch.sigmoid(x) * 2, (torch.ones(3),)).graph.outputs[0].op
    'mul'
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Optional

import torch

from .errors import in_place_detail

def _find_symbolic(args: tuple, kwargs: dict) -> Optional[Any]:
    """The first symbolic tensor among the arguments (a ``Symbolic`` says so by its
    ``_opforge_symbolic_`` class attribute; this module needs no import of it)."""
    for value in list(args) + list(kwargs.values()):
        if getattr(type(value), "_opforge_symbolic_", False):
            return value
        if isinstance(value, (list, tuple)):
            found = _find_symbolic(tuple(value), {})
            if found is not None:
                return found
    return None


def _name(func: Any) -> str:
    qualname = getattr(func, "__qualname__", None) or getattr(func, "__name__", repr(func))
    module = getattr(func, "__module__", None)
    if qualname.startswith("_VariableFunctionsClass."):
        return "torch." + qualname.split(".")[-1]
    if qualname.startswith(("Tensor.", "TensorBase.", "_TensorBase.")) or module is None:
        return f".{qualname.split('.')[-1]}()"
    if module.startswith("torch._C"):
        module = "torch.nn.functional" if "_nn" in module else "torch"
    return f"{module}.{qualname}"


def _no_out(kwargs: dict) -> None:
    if kwargs.pop("out", None) is not None:
        raise _Refusal("out=", "a fused function returns new tensors; drop out=")


class _Refusal(Exception):
    def __init__(self, operation: str, detail: str):
        self.operation, self.detail = operation, detail


def _unary(op: str) -> Callable[..., tuple]:
    def adapt(x: Any, **kwargs: Any) -> tuple:
        _no_out(kwargs)
        if kwargs.pop("inplace", False):
            raise _Refusal(f"{op}(inplace=True)", "a fused kernel never writes its inputs")
        return op, (x,), kwargs
    return adapt


def _binary(op: str, reflected: bool = False) -> Callable[..., tuple]:
    def adapt(a: Any, b: Any, **kwargs: Any) -> tuple:
        _no_out(kwargs)
        alpha = kwargs.pop("alpha", 1)
        if kwargs.pop("rounding_mode", None) is not None:
            raise _Refusal("division with a rounding_mode", "only true division fuses")
        if alpha != 1:
            b = b * alpha
        return op, ((b, a) if reflected else (a, b)), kwargs
    return adapt


def _where(condition: Any, input: Any = None, other: Any = None, **kwargs: Any) -> tuple:
    _no_out(kwargs)
    if input is None or other is None:
        raise _Refusal("torch.where(condition)", "the one-argument form returns indices")
    return "where", (condition, input, other), kwargs


def _pow(input: Any, exponent: Any, **kwargs: Any) -> tuple:
    _no_out(kwargs)
    return "pow", (input, exponent), kwargs


def _clamp(input: Any, min: Any = None, max: Any = None, **kwargs: Any) -> tuple:
    _no_out(kwargs)
    return "clamp", (input,), {"min": min, "max": max}


def _gelu(input: Any, approximate: str = "none", **kwargs: Any) -> tuple:
    return "gelu", (input,), {"approximate": approximate}


@functools.lru_cache(maxsize=None)
def _table() -> dict:
    import torch.nn.functional as F

    T = torch.Tensor
    table: dict[Any, Callable[..., tuple]] = {}

    def put(adapter: Callable[..., tuple], *funcs: Any) -> None:
        for func in funcs:
            table[func] = adapter

    for op, names in {"exp": ("exp",), "log": ("log",), "sqrt": ("sqrt",), "rsqrt": ("rsqrt",),
                      "tanh": ("tanh",), "erf": ("erf",), "sigmoid": ("sigmoid",), "abs": ("abs", "absolute"),
                      "neg": ("neg", "negative"), "relu": ("relu",), "not": ("logical_not", "bitwise_not")}.items():
        for name in names:
            put(_unary(op), *(f for f in (getattr(torch, name, None), getattr(T, name, None)) if f is not None))
    put(_unary("erf"), torch.special.erf)
    put(_unary("sigmoid"), torch.special.expit, F.sigmoid)
    put(_unary("tanh"), F.tanh)
    put(_unary("relu"), F.relu)
    put(_unary("silu"), F.silu)
    put(_unary("neg"), T.__neg__)
    put(_unary("abs"), T.__abs__)
    put(_unary("not"), T.__invert__)
    put(_gelu, F.gelu)
    for op, names in {"add": ("add",), "sub": ("sub", "subtract"), "mul": ("mul", "multiply"),
                      "div": ("div", "divide", "true_divide"), "eq": ("eq",), "ne": ("ne", "not_equal"),
                      "lt": ("lt", "less"), "le": ("le", "less_equal"), "gt": ("gt", "greater"),
                      "ge": ("ge", "greater_equal"), "minimum": ("minimum",), "maximum": ("maximum",),
                      "and": ("bitwise_and",), "or": ("bitwise_or",), "xor": ("bitwise_xor",)}.items():
        for name in names:
            put(_binary(op), *(f for f in (getattr(torch, name, None), getattr(T, name, None)) if f is not None))
    dunders = {"add": "add", "sub": "sub", "mul": "mul", "truediv": "div", "and": "and", "or": "or", "xor": "xor"}
    for dunder, op in dunders.items():
        put(_binary(op), getattr(T, f"__{dunder}__"))
        put(_binary(op, reflected=True), getattr(T, f"__r{dunder}__"))
    for dunder in ("eq", "ne", "lt", "le", "gt", "ge"):
        put(_binary(dunder), getattr(T, f"__{dunder}__"))
    put(_where, torch.where, T.where)
    put(_pow, torch.pow, T.pow, T.__pow__)
    put(_clamp, torch.clamp, torch.clip, T.clamp, T.clip)
    return table


def dispatch(func: Any, args: tuple, kwargs: dict) -> Any:
    """Record the torch function ``func`` applied to symbolic operands, or refuse it."""
    anchor = _find_symbolic(args, kwargs)
    if anchor is None:  # pragma: no cover - torch only calls us with a symbolic operand
        return NotImplemented
    tracer = anchor._tracer
    adapter = _table().get(func)
    if adapter is None:
        name = _name(func)
        tracer.refuse(name, in_place_detail(name) or "it is not a pointwise operation opforge.fuse knows")
    try:
        op, op_args, op_kwargs = adapter(*args, **dict(kwargs))
    except _Refusal as refusal:
        tracer.refuse(refusal.operation, refusal.detail)
    except TypeError as exc:
        tracer.fail(f"{_name(func)}: {exc}")
    if func is torch.Tensor.where:  # x.where(condition, other) means where(condition, x, other)
        op_args = (op_args[1], op_args[0], op_args[2])
    return tracer.apply(op, op_args, op_kwargs)
