"""The registry of kernel variants, and the deterministic, explainable choice among them.

Each op family registers, per op, the variants of every backend it has. A variant says what
it can run through ``supports(problem)``, which returns ``None`` or the reason it cannot.
Selection depends only on the device type, the forced backend and the problem's ``key``
(dtype, sizes, stride class...), so it is cached per key and ``explain`` can replay it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from . import backends, plans, policy
from .errors import NoKernelError, first_reason
from .lru import LRU


@dataclass(frozen=True)
class Variant:
    """One kernel that can run an op.

    Attributes:
        op: the op it implements, e.g. ``"layer_norm"``.
        backend: ``"triton"``, ``"metal"`` or ``"torch"``.
        name: short name shown by trace and explain, e.g. ``"multirow"``.
        supports: ``problem -> None`` if it can run the problem, else a one-line reason.
        launch: ``launch(problem, *tensors_and_scalars)`` runs it and returns the result.
        summary: one line on what the variant is for.
    """

    op: str
    backend: str
    name: str
    supports: Callable[[Any], Optional[str]]
    launch: Callable[..., Any]
    summary: str = ""

    @property
    def qualified_name(self) -> str:
        return f"{self.backend}.{self.name}"


@dataclass(frozen=True)
class Choice:
    """The variant chosen for one problem, and why the torch path runs if it does."""

    variant: Variant
    fallback_reason: Optional[str] = None


@dataclass
class Explanation:
    """What ``opforge.explain`` returns: the chosen variant and why each other one was not chosen."""

    op: str
    problem: Any
    chosen: Optional[Variant]
    rejected: list[tuple[Variant, str]] = field(default_factory=list)
    note: str = ""

    def __str__(self) -> str:
        lines = [f"{self.op} on {self.problem.describe()}"]
        if self.chosen is not None:
            lines.append(f"  chosen: {self.chosen.qualified_name}  ({self.chosen.summary})")
        else:
            lines.append("  chosen: none")
        if self.note:
            lines.append(f"  note:   {self.note}")
        for variant, reason in self.rejected:
            lines.append(f"  not {variant.qualified_name}: {reason}")
        return "\n".join(lines)


_variants: dict[str, list[Variant]] = {}
_problem_builders: dict[str, Callable[..., Any]] = {}
_cache: LRU[tuple, Choice] = LRU(4096, "registry.selection")


def register(variant: Variant) -> Variant:
    """Add a variant; within one backend, earlier registrations are preferred."""
    existing = _variants.setdefault(variant.op, [])
    if any(v.backend == variant.backend and v.name == variant.name for v in existing):
        raise ValueError(f"variant {variant.qualified_name} of {variant.op} is already registered")
    existing.append(variant)
    _cache.clear()
    return variant


def register_problem_builder(op: str, build: Callable[..., Any]) -> None:
    """Tell ``explain`` how to turn an op's arguments into its problem description."""
    _problem_builders[op] = build


def variants(op: str) -> list[Variant]:
    """All registered variants of ``op``, in preference order within each backend."""
    if op not in _variants:
        raise KeyError(f"unknown op {op!r}; known ops: {sorted(_variants)}")
    return list(_variants[op])


def ops() -> list[str]:
    return sorted(_variants)


def clear_cache() -> None:
    """Forget cached choices and launch plans (after changing TRITON_INTERPRET or
    OPFORGE_METAL_EMULATE in a test)."""
    _cache.clear()
    plans.clear_all()


def _walk(op: str, problem: Any, device_type: str, forced: Optional[str]) -> Explanation:
    """Run the selection rules and record every decision."""
    candidates = _variants.get(op)
    if not candidates:
        raise KeyError(f"unknown op {op!r}")
    result = Explanation(op, problem, None)
    if forced is not None:
        wanted: tuple[str, ...] = (forced,)
    else:
        wanted = backends.native_accelerated_backends(device_type) + ("torch",)
    for backend_name in wanted:
        unavailable = backends.unavailable_reason(backend_name, device_type)
        for variant in candidates:
            if variant.backend != backend_name:
                continue
            if result.chosen is not None:
                result.rejected.append((variant, f"{result.chosen.qualified_name} comes first"))
                continue
            reason = unavailable or variant.supports(problem)
            if reason is None:
                result.chosen = variant
            else:
                result.rejected.append((variant, reason))
    for variant in candidates:
        if variant.backend not in wanted:
            why = "another backend is forced" if forced else f"not a backend for {device_type} tensors"
            result.rejected.append((variant, why))
    return result


def select(op: str, problem: Any, device_type: str) -> Choice:
    """Choose the variant for ``problem``; raise ``NoKernelError`` instead of a silent fallback.

    Rules: a forced backend must serve the call itself. Otherwise the device's accelerated
    backend is tried first (triton on CUDA, metal on MPS); if none of its variants supports
    the problem, the torch path runs with a one-time warning, or ``NoKernelError`` in strict
    mode. On a CPU tensor the torch path is the native one and runs without a warning.
    """
    forced = policy.forced_backend()
    key = (op, device_type, forced, problem.key)
    choice = _cache.get(key)
    if choice is None:
        choice = _decide(op, problem, device_type, forced)
        _cache[key] = choice
    if choice.fallback_reason is not None:
        if policy.is_strict():
            raise NoKernelError(op, choice.fallback_reason)
        policy.warn_fallback_once(op, choice.fallback_reason)
    return choice


def _decide(op: str, problem: Any, device_type: str, forced: Optional[str]) -> Choice:
    walk = _walk(op, problem, device_type, forced)
    if walk.chosen is None:
        raise NoKernelError(op, first_reason(f"{v.qualified_name}: {r}" for v, r in walk.rejected))
    if forced is None and walk.chosen.backend == "torch" and backends.native_accelerated_backends(device_type):
        reasons = first_reason(f"{v.qualified_name}: {r}" for v, r in walk.rejected if v.backend != "torch")
        return Choice(walk.chosen, fallback_reason=reasons)
    return Choice(walk.chosen)


def explain(op: str, *args: Any, **kwargs: Any) -> Explanation:
    """Say which variant would run ``op`` on these arguments, and why each other was not chosen.

    Example:
        >>> import torch, opforge
        >>> print(opforge.explain("layer_norm", torch.randn(8, 4096)))   # doctest: +SKIP
        layer_norm on x float32 (8, 4096) cpu
          chosen: torch.reference  (torch composite ops, float32 accumulation)
          ...
    """
    if op not in _problem_builders:
        raise KeyError(f"unknown op {op!r}; known ops: {sorted(_problem_builders)}")
    problem = _problem_builders[op](*args, **kwargs)
    forced = policy.forced_backend()
    walk = _walk(op, problem, problem.device_type, forced)
    if walk.chosen is not None and forced is None and walk.chosen.backend == "torch" \
            and backends.native_accelerated_backends(problem.device_type):
        walk.note = "fallback: no accelerated variant supports these inputs" + \
            (" (strict mode would raise NoKernelError)" if not policy.is_strict() else " (strict mode: raises NoKernelError)")
    return walk
