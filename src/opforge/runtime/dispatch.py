"""What every op family does the same way: register its variants, and run one call.

An op family hands over its own pieces (variant tables, the torch launch, a problem builder);
this module knows no op.
"""
from __future__ import annotations

import importlib
from typing import Any, Callable, Iterable, Optional, Sequence

import torch

from . import alloc, registry, trace
from .backends import BACKENDS
from .registry import Variant

VariantRow = tuple  # (name, supports, launch, summary), as each backend module lists them


def optional_variants(package: str, module: str) -> Optional[Sequence[VariantRow]]:
    """``package.module.VARIANTS``, or None where that backend cannot be imported (no triton on macOS)."""
    try:
        return importlib.import_module(f"{package}.{module}").VARIANTS
    except ImportError:
        return None


def kernel_tables(package: str) -> list[tuple[str, Optional[Sequence[VariantRow]]]]:
    """Each backend's variant table in an op family (``package``), from the module its
    :class:`~opforge.runtime.backends.Backend` record names; None where it cannot be imported.

    Example:
        >>> [name for name, rows in kernel_tables("opforge.ops.norm")]
        ['triton', 'metal']
    """
    return [(b.name, optional_variants(package, b.family_module)) for b in BACKENDS if b.family_module]


def register_family(ops: Sequence[str], backend_tables: Iterable[tuple[str, Optional[Sequence[VariantRow]]]],
                    torch_launch: Callable[[Any], Any], torch_summary: str,
                    problem_builder: Callable[[str], Callable[..., Any]]) -> None:
    """Register, for every op of a family, each backend's variants (a table of None is skipped:
    that backend is not importable here), then the torch reference, then the problem builder
    that ``opforge.explain`` uses."""
    tables = [(backend, rows) for backend, rows in backend_tables if rows is not None]
    for op in ops:
        for backend, rows in tables:
            for name, supports, launch, summary in rows:
                registry.register(Variant(op, backend, name, supports, launch, summary))
        registry.register(Variant(op, "torch", "reference", lambda p: None, torch_launch, torch_summary))
        registry.register_problem_builder(op, problem_builder(op))


def run(op: str, call: Any, x: Any) -> Any:
    """Select the variant for ``call.problem``, launch it, and record it in any active trace.

    ``call`` has ``problem`` (with ``device_type``) and ``note`` (what was copied, if anything);
    ``x`` is the tensor whose device, dtype and shape the trace shows.
    """
    try:  # free on the hot path (zero-cost try); out of memory: see runtime.alloc
        choice = registry.select(op, call.problem, call.problem.device_type)
        variant = choice.variant
        if trace._active:
            note = call.note
            if choice.fallback_reason:
                note = "; ".join(filter(None, [note, f"fallback: {choice.fallback_reason}"]))
            return trace.run_traced(op, variant.backend, variant.name, x, note, variant.launch, call)
        return variant.launch(call)
    except torch.OutOfMemoryError as error:
        if isinstance(error, alloc.OutOfMemoryError):
            raise
        return alloc.retry_after_out_of_memory(op, lambda: _describe(call, x), error,
                                               lambda: run_once(op, call, x))


def run_once(op: str, call: Any, x: Any) -> Any:
    """``run`` without the out-of-memory retry (``run`` repeats this body inline: one Python call
    fewer per op on the hot path)."""
    choice = registry.select(op, call.problem, call.problem.device_type)
    variant = choice.variant
    if trace._active:
        note = call.note
        if choice.fallback_reason:
            note = "; ".join(filter(None, [note, f"fallback: {choice.fallback_reason}"]))
        return trace.run_traced(op, variant.backend, variant.name, x, note, variant.launch, call)
    return variant.launch(call)


def _describe(call: Any, x: Any) -> str:
    shape = f"x {str(x.dtype).replace('torch.', '')} {tuple(x.shape)} on {x.device}" if hasattr(x, "shape") else "x"
    describe = getattr(call.problem, "describe", None)
    return f"{shape} [{describe()}]" if describe is not None else shape
