"""Implementation factories shared by every op: opforge, torch.compile, optional imports.

A factory takes a :class:`~opforge.bench.spec.BuildContext` and returns the callable
to time, or raises :class:`~opforge.bench.spec.Absent` when it cannot run here.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any, Callable

import torch

from opforge.bench.spec import Absent, BuildContext, ImplFactory

#: Dynamo recompiles once per new static shape; the suites need far more than the default.
RECOMPILE_LIMIT = 4096

_compiled: dict[Callable[..., Any], Callable[..., Any]] = {}


def opforge_impl(name: str) -> ImplFactory:
    """Factory for ``opforge.<name>``; absent if the package does not export it yet.

    Example:
        >>> factory = opforge_impl("layer_norm")
        >>> # fn = factory(ctx); y = fn(x, weight, bias)
    """

    def build(ctx: BuildContext) -> Callable[..., Any]:
        try:
            import opforge
        except Exception as exc:  # pragma: no cover - the package is this one
            raise Absent(f"opforge import failed: {exc}") from exc
        fn = getattr(opforge, name, None)
        if fn is None:
            raise Absent(f"opforge.{name} does not exist")
        return fn

    return build


def eager_impl(fn: Callable[..., Any]) -> ImplFactory:
    """Factory that returns ``fn`` itself (a plain torch composite).

    Example:
        >>> factory = eager_impl(lambda x: x * 2)
    """

    def build(ctx: BuildContext) -> Callable[..., Any]:
        return fn

    return build


def configure_dynamo() -> None:
    """Raise dynamo's recompile limits and make hitting one an error, not a fallback.

    Each (shape, dtype) the suites visit is one more static compilation of the same
    Python function; with the default limit (8) dynamo would quietly run eager code
    after the eighth, and the "torch.compile" column would be a lie.

    Example:
        >>> configure_dynamo()
    """
    cfg = torch._dynamo.config
    for key in ("recompile_limit", "cache_size_limit"):
        if hasattr(cfg, key):
            setattr(cfg, key, RECOMPILE_LIMIT)
    for key in ("accumulated_recompile_limit", "accumulated_cache_size_limit"):
        if hasattr(cfg, key):
            setattr(cfg, key, RECOMPILE_LIMIT * 4)
    for key in ("fail_on_recompile_limit_hit", "fail_on_cache_limit_hit"):
        if hasattr(cfg, key):
            setattr(cfg, key, True)
    if hasattr(cfg, "automatic_dynamic_shapes"):
        cfg.automatic_dynamic_shapes = False


def compiled_impl(fn: Callable[..., Any]) -> ImplFactory:
    """Factory for ``torch.compile(fn)`` with static shapes and no graph breaks.

    One compiled wrapper per eager function is kept for the whole process, so a
    (shape, dtype) seen by an earlier suite is served from dynamo's cache instead of
    being compiled again; each new one is compiled once, on its first call (the
    harness times that call as the compile time).

    Example:
        >>> factory = compiled_impl(lambda x: x.sin() + 1)
    """

    def build(ctx: BuildContext) -> Callable[..., Any]:
        if not hasattr(torch, "compile"):
            raise Absent("torch.compile is not available in this torch")
        cached = _compiled.get(fn)
        if cached is None:
            configure_dynamo()
            cached = torch.compile(fn, dynamic=False, fullgraph=True)
            _compiled[fn] = cached
        return cached

    return build


def import_optional(module: str, package_hint: str) -> ModuleType:
    """Import ``module`` or raise :class:`Absent` naming the package to install.

    Example:
        >>> import_optional("math", "math").sqrt(4.0)
        2.0
    """
    try:
        return importlib.import_module(module)
    except Exception as exc:
        raise Absent(f"{package_hint} not importable ({type(exc).__name__}: {exc})") from exc


def require_cuda(ctx: BuildContext, what: str) -> None:
    """Raise :class:`Absent` unless the case runs on a CUDA device.

    Example:
        >>> # require_cuda(ctx, "Liger-Kernel")  # in a factory
    """
    if ctx.device.type != "cuda":
        raise Absent(f"{what} runs on CUDA only (device is {ctx.device.type})")


def liger_function(ctx: BuildContext, cls_name: str) -> Any:
    """Liger-Kernel's ``liger_kernel.ops.<cls_name>``; :class:`Absent` off CUDA, without the
    package, or where the package has no such class.

    Example:
        >>> # fn = liger_function(ctx, "LigerSoftmaxFunction"); y = fn.apply(x)
    """
    require_cuda(ctx, "Liger-Kernel")
    ops = import_optional("liger_kernel.ops", "liger-kernel")
    fn = getattr(ops, cls_name, None)
    if fn is None:
        raise Absent(f"liger_kernel.ops has no {cls_name}")
    return fn
