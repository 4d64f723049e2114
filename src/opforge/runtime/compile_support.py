"""torch.compile, CUDA graphs and autograd for opforge's public functions; knows no op.

``compiled(name, fake)`` wraps a public function so that:

- in eager mode it runs the function directly (one ``torch.compiler.is_compiling()`` check,
  ~0.1 us on CPU), after refusing inputs that require grad while grad mode is on: opforge is
  for inference and its kernels record no backward, so it raises ``InferenceOnlyError``
  rather than return a tensor silently cut from the graph;
- while dynamo traces (``torch.compile``, including ``fullgraph=True`` and
  ``mode="reduce-overhead"``), it calls ``torch.ops.opforge.<name>``, a
  ``torch.library.custom_op`` whose fake implementation ``fake`` gives output shapes, dtypes and
  strides without running anything, so the call is one node of the graph and no graph break.

The same function body serves both paths: the custom op's implementation is the undecorated
function. A custom op may not return a tensor that aliases an input, so inside the op any output
sharing storage with an input is cloned (eager calls never pay for that check).

How a new family adopts it (a few lines per public function)::

    from ...runtime.compile_support import compiled

    def _fake_rotary(q, k, cos, sin):                 # same signature; no computation
        return torch.empty_like(q), torch.empty_like(k)

    @compiled("rotary", _fake_rotary)
    def rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
        ...

The function needs type annotations torch.library can read (``torch.Tensor``,
``Optional[torch.Tensor]``, ``int``, ``float``, ``bool``, ``str``, ``tuple[torch.Tensor, ...]``,
or a ``None`` return). An op that writes into some arguments (``kv_cache_append`` into its caches)
names them: ``@compiled("kv_cache_append", fake, mutates=("k_cache", "v_cache"))``; its fake then
returns None (or only its new outputs) and must not write anything. ``grad_check=False`` skips the
autograd refusal for ops whose inputs never carry a graph (integer indices, caches). Callers
with their own entry point (``opforge.fuse``) use ``requires_grad_in`` and ``refuse_autograd``.

What one schema cannot say goes through ``route``: ``@compiled(name, fake, route=r)`` (or
``compiled(name, None, route=r)``, registering no op for the function itself) makes dynamo trace
``r(*args, **kwargs)`` instead, which calls ops registered with ``library_op``: an in-place
variant when ``inplace=True`` (``rotary_embedding_`` declares q and k mutated and the route
returns them), an ``out=`` variant, a ``QuantizedWeight`` passed as its plain tensors and ints,
delays as ``list[int]`` or a tensor. See ``ops/rotary/fakes.py``, ``ops/quant/fakes.py``.
torch refuses autograd formulas on mutating ops, so those have no backward registered: under
``torch.compile`` only the functional ops raise ``InferenceOnlyError`` on a backward.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Optional, Sequence, TypeVar

import torch

NAMESPACE = "opforge"

F = TypeVar("F", bound=Callable[..., Any])

_is_compiling = torch.compiler.is_compiling
_grad_enabled = torch.is_grad_enabled
_Tensor = torch.Tensor


class InferenceOnlyError(RuntimeError):
    """An opforge op was called on inputs that require grad while grad mode is on.

    opforge's kernels are forward-only (inference): they record no backward, so the result would
    silently be cut from the autograd graph. Run the call under ``torch.no_grad()`` or
    ``torch.inference_mode()``, or ``.detach()`` the inputs.
    """


def requires_grad_in(args: tuple, kwargs: dict) -> bool:
    """True if any tensor among ``args`` and ``kwargs`` requires grad (check grad mode first)."""
    for a in args:
        if isinstance(a, _Tensor) and a.requires_grad:
            return True
    if kwargs:
        for v in kwargs.values():
            if isinstance(v, _Tensor) and v.requires_grad:
                return True
    return False


def refuse_autograd(name: str) -> None:
    """Raise ``InferenceOnlyError`` for ``opforge.<name>``."""
    raise InferenceOnlyError(
        f"opforge.{name} is inference-only (no backward): an input requires grad while grad mode is on, "
        "and the result would silently have no autograd graph. Call it under torch.no_grad() or "
        "torch.inference_mode(), or pass detached tensors.")


def _no_context(ctx: Any, inputs: tuple, output: Any) -> None:
    pass


def _no_backward(name: str) -> Callable[..., Any]:
    def backward(ctx: Any, *grads: Any) -> Any:
        refuse_autograd(name)
    return backward


def _unalias(outputs: Any, inputs: list) -> Any:
    """Clone any output that shares storage with an input (custom ops may not return aliases)."""
    if not inputs:
        return outputs
    storages = {t.untyped_storage().data_ptr() for t in inputs}
    if isinstance(outputs, torch.Tensor):
        return outputs.clone() if outputs.untyped_storage().data_ptr() in storages else outputs
    if isinstance(outputs, (tuple, list)):
        seen = set(storages)
        fixed = []
        for o in outputs:
            if isinstance(o, torch.Tensor):
                ptr = o.untyped_storage().data_ptr()
                if ptr in seen and o.numel() > 0:
                    o = o.clone()
                    ptr = o.untyped_storage().data_ptr()
                seen.add(ptr)
            fixed.append(o)
        return type(outputs)(fixed)
    return outputs


def library_op(name: str, impl: Callable[..., Any], fake: Callable[..., Any], mutates: Sequence[str] = (),
               grad_check: bool = True) -> Any:
    """Register ``torch.ops.opforge.<name>`` over ``impl`` (annotated as in the module docstring).

    For ops that a public function reaches only while compiling, through ``compiled(route=...)``:
    an in-place variant, or the plain tensors and ints of an argument a custom op cannot take.
    ``mutates`` names the arguments ``impl`` writes; outputs aliasing an input are cloned.

    Example:
        >>> import torch
        >>> def _add_(x: torch.Tensor, y: torch.Tensor) -> None:
        ...     x.add_(y)
        >>> op = library_op("doctest_add_", _add_, lambda x, y: None, mutates=("x",))
        >>> x = torch.zeros(2); op(x, torch.ones(2)); x.tolist()
        [1.0, 1.0]
    """
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        inputs = [a for a in args if isinstance(a, torch.Tensor)]
        inputs += [v for v in kwargs.values() if isinstance(v, torch.Tensor)]
        return _unalias(impl(*args, **kwargs), inputs)

    functools.update_wrapper(wrapped, impl)
    wrapped.__doc__ = None
    # the schema is read from impl's own annotations, resolved in impl's module
    schema = torch.library.infer_schema(impl, mutates_args=tuple(mutates))
    op = torch.library.custom_op(f"{NAMESPACE}::{name}", wrapped, mutates_args=tuple(mutates), schema=schema)
    op.register_fake(fake)
    if grad_check and not mutates:  # compiled graphs that need a backward fail naming no_grad / inference_mode
        op.register_autograd(_no_backward(name), setup_context=_no_context)
    return op


def compiled(name: Optional[str], fake: Optional[Callable[..., Any]], mutates: Sequence[str] = (),
             grad_check: bool = True, route: Optional[Callable[..., Any]] = None) -> Callable[[F], F]:
    """Decorate a public op so it is a ``torch.library.custom_op`` under ``torch.compile`` and the
    plain function in eager mode (see the module docstring).

    Args:
        name: the op's name; the custom op is ``torch.ops.opforge.<name>``.
        fake: same signature as the op; returns empty outputs of the right shape, dtype and
            strides (``torch.empty_like``...), computing nothing. ``None`` (with ``route``):
            register no op for the function itself.
        mutates: names of arguments the op writes in place.
        grad_check: refuse inputs that require grad in grad mode (``InferenceOnlyError``).
        route: called with the public arguments instead of the custom op while compiling, for
            what one schema cannot say: an argument a custom op cannot take (a
            ``QuantizedWeight``, a list or a tensor), or a flag that makes the op write its inputs
            (``inplace=True``). It calls ops registered with ``library_op``.

    Example:
        >>> import torch
        >>> def _fake(x): return torch.empty_like(x)
        >>> @compiled("doctest_twice", _fake)
        ... def twice(x: torch.Tensor) -> torch.Tensor:
        ...     return x * 2
        >>> f = torch.compile(lambda x: twice(x) + 1, fullgraph=True, backend="aot_eager")
        >>> torch.equal(f(torch.ones(3)), torch.full((3,), 3.0))
        True
        >>> del f; torch._dynamo.reset()   # drop the compiled frame while this example's globals exist
        >>> twice(torch.ones(2, requires_grad=True))
        Traceback (most recent call last):
        ...
        opforge.runtime.compile_support.InferenceOnlyError: opforge.doctest_twice is inference-only ...
    """
    def decorate(fn: F) -> F:
        name_ = name or fn.__name__
        op = None if fake is None else library_op(name_, fn, fake, mutates, grad_check)
        target = route if route is not None else op
        if target is None:
            raise ValueError("compiled: give a fake, a route, or both")
        if grad_check:
            @functools.wraps(fn)
            def public(*args: Any, **kwargs: Any) -> Any:
                if _is_compiling():
                    return target(*args, **kwargs)
                if _grad_enabled():  # the check inlined: a Python call costs ~60 ns
                    for a in args:
                        if isinstance(a, _Tensor) and a.requires_grad:
                            refuse_autograd(name_)
                    if kwargs and requires_grad_in((), kwargs):
                        refuse_autograd(name_)
                return fn(*args, **kwargs)
        else:
            @functools.wraps(fn)
            def public(*args: Any, **kwargs: Any) -> Any:
                if _is_compiling():
                    return target(*args, **kwargs)
                return fn(*args, **kwargs)

        public.custom_op = op  # type: ignore[attr-defined]
        public.eager = fn  # type: ignore[attr-defined]
        return public  # type: ignore[return-value]

    return decorate
