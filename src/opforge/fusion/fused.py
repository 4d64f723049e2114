"""``opforge.fuse``: compile a pointwise Python function into one kernel, cached per signature.

Three caches, from the hot path down:

1. *plans*, keyed by the exact call (forced backend; per tensor dtype, shape, strides, device;
   per Python number its type): a hit allocates the outputs and launches, nothing else;
2. *traces*, keyed by what the function's graph depends on (device, dtypes, ranks, number
   types, constants, and values or shapes the function was seen to use);
3. *kernels*, keyed by (trace, backend, layout structure: each input's broadcast class,
   index width): generated source, written to the disk cache and imported.

A new shape with the same broadcast pattern makes a plan only; a new broadcast pattern makes
a kernel from the cached trace; a new dtype traces again.

Example:
    >>> import torch
    >>> from opforge.fusion import fuse, sigmoid
    >>> @fuse
    ... def scaled_silu(x, scale: float):
    ...     return x * sigmoid(x) * scale
    >>> x = torch.randn(4, 8)
    >>> torch.allclose(scaled_silu(x, 2.0), x * torch.sigmoid(x) * 2.0, atol=1e-6)
    True
"""
from __future__ import annotations

import functools
import inspect
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence, Union, overload

import torch

from ..runtime import backends, policy, trace as trace_events
from ..runtime.compile_support import refuse_autograd, requires_grad_in
from ..runtime.errors import NoKernelError
from ..runtime.lru import LRU
from . import kernels
from .layout import analyze, call_device, node_shapes, output_groups
from .tracer import TraceResult, trace

_NUMBERS = (bool, int, float)
_Tensor = torch.Tensor
_grad_enabled = torch.is_grad_enabled
_forced_backend = policy._forced_backend
_all: "weakref.WeakSet[FusedFunction]" = weakref.WeakSet()
MAX_PLANS = 1024


@dataclass(frozen=True)
class CacheInfo:
    """How often a fused function traced, generated a kernel and made a launch plan."""

    traces: int
    kernels: int
    plans: int


class FusedFunction:
    """A pointwise function compiled by ``opforge.fuse``; call it like the original.

    Example:
        >>> import torch
        >>> from opforge.fusion import fuse
        >>> f = fuse(lambda x, y: (x + y, x * y))
        >>> s, p = f(torch.ones(3), torch.full((3,), 2.0))
        >>> p.tolist(), f.cache_info().traces
        ([2.0, 2.0, 2.0], 1)
    """

    def __init__(self, fn: Callable, name: Optional[str] = None):
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.name = name or getattr(fn, "__name__", type(fn).__name__)
        self._op = f"fused:{self.name}"
        self._params = _parameters(fn, self.name)
        self._nparams = len(self._params.parameters)
        self._keyword_only = tuple(p.name for p in self._params.parameters.values() if p.kind == p.KEYWORD_ONLY)
        if self._keyword_only:
            self._nparams = -1   # every call binds, so keyword-only parameters stay keyword-only
        self._plans: LRU[tuple, kernels.Plan] = LRU(MAX_PLANS, "fusion.plans")
        self._traces: LRU[tuple, TraceResult] = LRU(MAX_PLANS, "fusion.traces")
        self._kernels: LRU[tuple, Any] = LRU(MAX_PLANS, "fusion.kernels")
        self._value_positions: frozenset = frozenset()
        self._shape_specialized = False
        self._counts = {"traces": 0, "kernels": 0, "plans": 0}
        self._latest: dict[str, Any] = {}
        _all.add(self)

    # --- the hot path ---
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if _grad_enabled() and requires_grad_in(args, kwargs):
            refuse_autograd(self._op)
        if kwargs or len(args) != self._nparams:
            args = self._bind(args, kwargs)
        try:
            plan = self._plans.get(self._plan_key(args))
        except TypeError:          # an unhashable constant argument: say which
            self._trace_key(args)
            raise
        if plan is None:
            plan = self._make_plan(args)
        if plan.fallback_reason is not None:
            if policy.is_strict():
                raise NoKernelError(self._op, plan.fallback_reason)
            policy.warn_fallback_once(self._op, plan.fallback_reason)
        if trace_events._active:
            return trace_events.run_traced(self._op, plan.backend, plan.variant, args[plan.trace_position],
                                           plan.note, plan.run, args)
        return plan.run(args)

    def _plan_key(self, args: Sequence[Any]) -> tuple:
        """The exact call: forced backend; each tensor's dtype, shape, strides, device; each number's type."""
        if self._value_positions:
            return self._plan_key_with_values(args)
        key = [_forced_backend.get()]
        put = key.append
        for a in args:
            if isinstance(a, _Tensor):
                put(a.dtype)
                put(a.shape)
                put(a.stride())
                put(a.device)
            elif type(a) in _NUMBERS:
                put(type(a))
            else:
                put((type(a), a))
        return tuple(key)

    def _plan_key_with_values(self, args: Sequence[Any]) -> tuple:
        key: list[Any] = [_forced_backend.get()]
        for i, a in enumerate(args):
            if isinstance(a, _Tensor):
                key += (a.dtype, a.shape, a.stride(), a.device)
            elif type(a) in _NUMBERS and i not in self._value_positions:
                key.append(type(a))
            else:
                key.append((type(a), a))
        return tuple(key)

    def _bind(self, args: tuple, kwargs: dict) -> tuple:
        try:
            bound = self._params.bind(*args, **kwargs)
        except TypeError as exc:
            raise TypeError(f"{self.name}(): {exc}") from None
        bound.apply_defaults()
        return tuple(bound.arguments[name] for name in self._params.parameters)

    # --- building plans, traces and kernels ---
    def _trace_key(self, args: Sequence[Any]) -> tuple:
        key: list[Any] = []
        for i, a in enumerate(args):
            if isinstance(a, torch.Tensor):
                key.append((a.dtype, tuple(a.shape) if self._shape_specialized else a.dim(), a.device))
            elif type(a) in _NUMBERS:
                key.append((type(a), a) if i in self._value_positions else type(a))
            else:
                try:
                    hash(a)
                except TypeError:
                    raise TypeError(f"{self.name}: argument {i} is a {type(a).__name__}, which is not hashable; "
                                    "fused functions take tensors, Python numbers and hashable constants") from None
                key.append((type(a), a))
        return tuple(key)

    def _get_trace(self, args: Sequence[Any]) -> tuple[tuple, TraceResult]:
        key = self._trace_key(args)
        result = self._traces.get(key)
        if result is None:
            result = trace(self.fn, args, self.name, self._keyword_only)
            self._counts["traces"] += 1
            if not result.value_positions <= self._value_positions or \
                    (result.uses_shapes and not self._shape_specialized):
                self._value_positions = self._value_positions | result.value_positions
                self._shape_specialized = self._shape_specialized or result.uses_shapes
                self._plans.clear()
                key = self._trace_key(args)
            self._traces[key] = result
        return key, result

    def _make_plan(self, args: Sequence[Any]) -> kernels.Plan:
        trace_key, result = self._get_trace(args)
        key = self._plan_key(args)   # the trace may have made the function specialize on values
        graph = result.graph
        nodes = _reachable(result)
        shapes = node_shapes(graph, nodes, args)      # raises as torch would on a shape mismatch
        device = call_device(args, [n.attr for n in nodes if n.op == "input"], self.name)
        backend, fallback = self._choose_backend(device.type, result)
        groups = output_groups(graph, shapes)
        if len(groups) == 1:
            plan = self._group_plan(trace_key, backend, graph, nodes, shapes, args, device, None, result.single)
        else:   # outputs of different shapes: one kernel per shape, one call
            parts = []
            for outputs in groups:
                sub = graph.view(outputs)
                parts.append(self._group_plan(trace_key, backend, sub, sub.reachable(), shapes, args, device,
                                              tuple(outputs), False))
            plan = kernels.SplitPlan(parts, groups, len(graph.outputs))
        plan.fallback_reason = fallback
        self._plans[key] = plan
        self._counts["plans"] += 1
        return plan

    def _group_plan(self, trace_key: tuple, backend: str, graph: Any, nodes: list, shapes: dict,
                    args: Sequence[Any], device: torch.device, outputs: Optional[tuple], single: bool) -> Any:
        """The plan of one kernel computing ``graph``'s outputs (all of one shape)."""
        layout = analyze(graph, nodes, args, self.name, shapes)
        if layout.numel == 0:
            return kernels.EmptyPlan(backend, layout.shape, [n.dtype for n in graph.outputs], device, single)
        structure = layout.structure() if backend != "torch" else None
        kernel_key = (trace_key, backend, outputs, structure)
        kernel = self._kernels.get(kernel_key)
        if kernel is None:
            kernel = kernels.build(backend, graph, nodes, layout, self.name, self._title())
            self._kernels[kernel_key] = kernel
            self._counts["kernels"] += 1
        self._latest[device.type] = kernel
        plan = kernel.plan(layout, args, single)
        plan.source = kernel.source
        return plan

    def _choose_backend(self, device_type: str, result: TraceResult) -> tuple[str, Optional[str]]:
        """The backend for this call and, if the torch path stands in for a kernel, why."""
        forced = policy.forced_backend()

        def refusal(backend: str) -> Optional[str]:
            return backends.unavailable_reason(backend, device_type) or _unsupported(backend, result)

        if forced is not None:
            reason = refusal(forced)
            if reason is not None:
                raise NoKernelError(self._op, f"{forced}: {reason}")
            return forced, None
        reasons = []
        for backend in backends.native_accelerated_backends(device_type):
            reason = refusal(backend)
            if reason is None:
                return backend, None
            reasons.append(f"{backend}: {reason}")
        return "torch", ("; ".join(reasons) or None)

    def _title(self) -> str:
        code = getattr(self.fn, "__code__", None)
        where = f" ({code.co_filename}:{code.co_firstlineno})" if code is not None else ""
        return f"{self.name}{where}"

    # --- inspection ---
    def source(self, device: Union[str, torch.device, None] = None, *example_args: Any, **example_kwargs: Any) -> str:
        """The generated kernel source for ``device``: Triton on CUDA, the torch path on CPU...

        Without example arguments, the kernel most recently built for that device type; with
        them, the kernel those arguments would run (built if needed, not launched).

        Example:
            >>> import torch
            >>> from opforge.fusion import fuse
            >>> f = fuse(lambda x: x * 2)
            >>> _ = f(torch.ones(3))
            >>> "def " in f.source("cpu")
            True
        """
        if example_args or example_kwargs:
            args = self._bind(example_args, example_kwargs)
            plan = self._plans.get(self._plan_key(args)) or self._make_plan(args)
            return plan.source
        device_type = torch.device(device).type if device is not None else \
            ("cuda" if torch.cuda.is_available() else "cpu")
        kernel = self._latest.get(device_type)
        if kernel is None:
            raise LookupError(f"{self.name} has no kernel for {device_type} yet: call it on {device_type} tensors "
                              f"first, or pass example arguments: {self.name}.source('{device_type}', *args)")
        return kernel.source

    def cache_info(self) -> CacheInfo:
        """Counts of traces, generated kernels and launch plans made so far.

        Example:
            >>> import torch
            >>> from opforge.fusion import fuse
            >>> f = fuse(lambda x: x + 1)
            >>> _ = f(torch.ones(2)); _ = f(torch.ones(2))
            >>> f.cache_info()
            CacheInfo(traces=1, kernels=1, plans=1)
        """
        return CacheInfo(**self._counts)

    def clear_cache(self) -> None:
        """Forget plans, traces and kernels (the disk cache stays)."""
        self._plans.clear()
        self._traces.clear()
        self._kernels.clear()
        self._latest.clear()

    def graph(self, *args: Any, **kwargs: Any) -> str:
        """The simplified expression graph these arguments trace to, as text (for debugging)."""
        _, result = self._get_trace(self._bind(args, kwargs))
        return repr(result.graph)

    def __repr__(self) -> str:
        return f"<opforge.fuse {self.name}>"


def _parameters(fn: Callable, name: str) -> inspect.Signature:
    signature = inspect.signature(fn)
    for p in signature.parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise TypeError(f"opforge.fuse: {name} takes *{p.name}; fused functions need named parameters")
    return signature


def _reachable(result: TraceResult) -> list:
    nodes = getattr(result, "_reachable", None)
    if nodes is None:
        nodes = result.graph.reachable()
        result._reachable = nodes  # type: ignore[attr-defined]
    return nodes


def _unsupported(backend: str, result: TraceResult) -> Optional[str]:
    """Why ``backend`` cannot run this graph, or None."""
    if backend == "torch":
        return None
    if backend == "triton":   # a float64 input may be read and converted; computing in float64 is refused
        for node in _reachable(result):
            if node.dtype == torch.float64 and node.is_tensor and node.op != "input":
                return "float64 arithmetic runs on the torch path"
    if backend == "metal":
        from . import codegen_msl
        return codegen_msl.unsupported(result)
    return None


@overload
def fuse(fn: Callable) -> FusedFunction: ...
@overload
def fuse(fn: None = None, *, name: Optional[str] = None) -> Callable[[Callable], FusedFunction]: ...


def fuse(fn: Optional[Callable] = None, *, name: Optional[str] = None) -> Any:
    """Compile a pointwise function of tensors and Python numbers into one generated kernel.

    The function may use ``+ - * /``, unary minus, comparisons, ``& | ^ ~``, ``opforge.where``,
    ``exp``, ``log``, ``sqrt``, ``rsqrt``, ``tanh``, ``erf``, ``sigmoid``, ``abs``, ``minimum``,
    ``maximum``, ``pow`` (constant exponent), casts (``x.float()``, ``x.to(dtype)``,
    ``opforge.cast``), the activations (``opforge.gelu``, ``silu``, ``relu``, ``swiglu``,
    ``geglu``), their ``torch``/``torch.nn.functional`` spellings, and Python constants. It
    returns a tensor or a tuple of tensors of one shape.

    The first call for a (device, dtypes, ranks, broadcast pattern, codegen constants) traces
    the function with symbolic tensors, simplifies the graph (common subexpressions once,
    constants folded), generates one kernel (Triton on CUDA, and on CPU under
    ``TRITON_INTERPRET=1`` when ``opforge.backend("triton")`` is forced; the torch path
    elsewhere), writes it to the disk cache and imports it. Later calls launch it directly.

    Inputs broadcast as in torch; results follow torch's type promotion; half inputs compute
    in float32. Python-number arguments are kernel arguments: a new value does not recompile.

    Example:
        >>> import torch
        >>> from opforge.fusion import fuse, erf
        >>> @fuse
        ... def bias_gelu_residual(x, b, r, scale: float):
        ...     h = x + b
        ...     return 0.5 * h * (1 + erf(h * 0.7071067811865476)) * scale + r
        >>> x, b, r = torch.randn(8, 64), torch.randn(64), torch.randn(8, 64)
        >>> y = bias_gelu_residual(x, b, r, 0.5)
        >>> torch.allclose(y, torch.nn.functional.gelu(x + b) * 0.5 + r, atol=1e-6)
        True
    """
    if name is not None and not isinstance(name, str):
        raise TypeError(f"opforge.fuse: name must be a str or None, got {type(name).__name__}")
    if fn is None:
        return lambda f: fuse(f, name=name)
    if not callable(fn):
        raise TypeError(f"opforge.fuse: fn must be a function of tensors (used as @fuse or fuse(fn)), "
                        f"got {type(fn).__name__} {fn!r:.40}")
    return FusedFunction(fn, name)


def clear_caches() -> None:
    """Forget every fused function's plans, traces and kernels (after changing TRITON_INTERPRET,
    or the block sizes in ``opforge.fusion.config``).

    Example:
        >>> clear_caches()
    """
    for f in list(_all):
        f.clear_cache()
