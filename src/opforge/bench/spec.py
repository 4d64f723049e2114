"""What a benchmark is made of: ops, suite entries, suites, and their registries.

An :class:`OpSpec` says how to make inputs for one op, how to compute its float64
oracle, how many bytes it must move, and how to build each implementation. A
:class:`Suite` lists :class:`SuiteEntry` items (an op with its shapes and dtypes),
the implementations to run, and the targets its results are judged by.

Each op family's ``bench`` module (``opforge/ops/<family>/bench.py``) adds its ops with
:func:`register_op` and its suites with :func:`register_suite`, or puts entries into the shared
suites of :mod:`opforge.bench.standard` with :meth:`Suite.add`. :mod:`opforge.bench.catalog`
lists those modules and answers lookups once all are loaded.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import torch

Shape = tuple[int, ...]
Inputs = tuple[Any, ...]
Outputs = tuple[torch.Tensor, ...]

#: Names of the implementations the harness knows, in report order.
OPFORGE = "opforge"
#: opforge's own kernel on another layout of the same data (the paged ops' contiguous-cache peer).
CONTIGUOUS = "opforge-contiguous"
#: opforge on the same int4 weight in the rows layout (the peer of the planes layout).
ROWS_LAYOUT = "opforge-rows"
TORCH = "torch"
COMPILE = "torch.compile"
LIGER = "liger"
CPU = "torch-cpu"
IMPL_ORDER: tuple[str, ...] = (OPFORGE, CONTIGUOUS, ROWS_LAYOUT, TORCH, COMPILE, LIGER, CPU)

DTYPES: dict[str, torch.dtype] = {
    "fp32": torch.float32,
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
}


def dtype_name(dtype: torch.dtype) -> str:
    """Short name of a dtype, e.g. ``dtype_name(torch.bfloat16) == "bf16"``."""
    for name, value in DTYPES.items():
        if value == dtype:
            return name
    return str(dtype).replace("torch.", "")


def shape_label(shape: Sequence[int]) -> str:
    """``shape_label((8, 128, 768)) == "8x128x768"``."""
    return "x".join(str(int(d)) for d in shape)


def parse_shape(text: str) -> Shape:
    """Parse ``"8x128x768"`` into ``(8, 128, 768)``; raises ``ValueError`` if malformed.

    Example:
        >>> parse_shape("4096x1024")
        (4096, 1024)
    """
    parts = text.lower().replace("*", "x").split("x")
    try:
        dims = tuple(int(p) for p in parts)
    except ValueError:
        raise ValueError(f"bad shape {text!r}: expected integers joined by 'x', e.g. 8x128x768") from None
    if not dims or any(d <= 0 for d in dims):
        raise ValueError(f"bad shape {text!r}: every dimension must be a positive integer")
    return dims


class Absent(Exception):
    """Raised by an implementation factory when that implementation cannot run here.

    The harness reports it as *absent* with the message as the reason, never as a zero.
    """


@dataclass(frozen=True)
class BuildContext:
    """What an implementation factory is told about the case it must serve."""

    op: str
    shape: Shape
    dtype: torch.dtype
    device: torch.device


#: A factory returns the callable to time (called as ``fn(*inputs)``) or raises Absent.
ImplFactory = Callable[[BuildContext], Callable[..., Any]]


@dataclass
class OpSpec:
    """One op as the harness sees it.

    Attributes:
        name: public op name, e.g. ``"layer_norm"``.
        make_inputs: ``(shape, dtype, device, generator) -> inputs`` (positional args).
        reference: float64 oracle, called with the inputs upcast to float64; returns
            the output tensor or a tuple of them.
        bytes_moved: ``(shape, dtype) -> int``: each input read once plus each output
            written once, in bytes.
        impls: implementation name -> factory.
        feed: ``(inputs, outputs) -> inputs`` for chaining the op into itself (the
            latency suite's chain); None if the op cannot be chained.
        tolerance: optional per-dtype override of the relative-error tolerance.

    Example:
        >>> import torch
        >>> spec = OpSpec(
        ...     name="double",
        ...     make_inputs=lambda s, dt, dev, g: (torch.randn(s, generator=g).to(dev, dt),),
        ...     reference=lambda x: 2 * x,
        ...     bytes_moved=lambda s, dt: 2 * numel(s) * dt.itemsize,
        ...     impls={"torch": lambda ctx: (lambda x: x + x)},
        ... )
    """

    name: str
    make_inputs: Callable[[Shape, torch.dtype, torch.device, torch.Generator], Inputs]
    reference: Callable[..., Any]
    bytes_moved: Callable[[Shape, torch.dtype], int]
    impls: Mapping[str, ImplFactory]
    feed: Callable[[Inputs, Outputs], Inputs] | None = None
    tolerance: Mapping[torch.dtype, float] = field(default_factory=dict)


@dataclass
class SuiteEntry:
    """An op with the shapes and dtypes a suite runs it at."""

    op: str
    shapes: tuple[Shape, ...]
    dtypes: tuple[torch.dtype, ...]


@dataclass
class Target:
    """A goal results are judged by, e.g. ">= 90% of copy bandwidth".

    ``check(case)`` returns None when the target does not apply to that case, else
    ``(met, detail)`` with a short human-readable detail ("91.2% of copy").
    """

    name: str
    check: Callable[[Any], tuple[bool, str] | None]


@dataclass
class Suite:
    """A named set of entries measured together.

    Attributes:
        metric: ``"gpu_us"`` (device time decides) or ``"wall_us"`` (host-inclusive
            wall time per call decides).
        chain_len: if > 0, also time a chain of that many calls eagerly and replayed
            from a captured CUDA graph.
        chain_impls: implementations the chain is measured for.

    Example:
        >>> s = Suite("mine", "my ops", entries=[], impls=("opforge", "torch"))
        >>> s.add(SuiteEntry("layer_norm", ((4, 1024),), (torch.float16,)))
    """

    name: str
    description: str
    entries: list[SuiteEntry]
    impls: tuple[str, ...]
    metric: str = "gpu_us"
    chain_len: int = 0
    chain_impls: tuple[str, ...] = (OPFORGE, TORCH, LIGER)
    targets: list[Target] = field(default_factory=list)

    def add(self, entry: SuiteEntry) -> None:
        """Append an entry (another family's op) to this suite."""
        self.entries.append(entry)


_OPS: dict[str, OpSpec] = {}
_SUITES: dict[str, Suite] = {}


def numel(shape: Sequence[int]) -> int:
    """Number of elements of a shape: ``numel((2, 3)) == 6``."""
    n = 1
    for d in shape:
        n *= int(d)
    return n


def register_op(spec: OpSpec) -> OpSpec:
    """Add (or replace) an op in the registry; returns it. Example: ``register_op(spec)``."""
    _OPS[spec.name] = spec
    return spec


def register_suite(suite: Suite) -> Suite:
    """Add (or replace) a suite in the registry; returns it. Example: ``register_suite(s)``."""
    _SUITES[suite.name] = suite
    return suite


def registered_op(name: str) -> OpSpec:
    """The op registered as ``name`` so far; ``KeyError`` if none.

    This registry holds what has been registered; :mod:`opforge.bench.catalog` loads every op
    family's benchmark module first and is what the command line asks.
    """
    return _OPS[name]


def registered_suite(name: str) -> Suite:
    """The suite registered as ``name`` so far; ``KeyError`` if none (see :func:`registered_op`)."""
    return _SUITES[name]


def registered_op_names() -> list[str]:
    """Names of the ops registered so far, in registration order."""
    return list(_OPS)


def registered_suite_names() -> list[str]:
    """Names of the suites registered so far, in registration order."""
    return list(_SUITES)


def snapshot() -> tuple[dict[str, OpSpec], dict[str, Suite]]:
    """Copies of both registries, for :func:`restore` (tests register ops and suites of their own)."""
    return dict(_OPS), dict(_SUITES)


def restore(saved: tuple[dict[str, OpSpec], dict[str, Suite]]) -> None:
    """Put both registries back to a :func:`snapshot`."""
    _OPS.clear()
    _OPS.update(saved[0])
    _SUITES.clear()
    _SUITES.update(saved[1])
