"""Backend policy: which backends may run, strict mode, and one-time fallback warnings.

    with opforge.backend("triton"):   # force a backend (tests, comparisons)
        y = opforge.layer_norm(x)
    with opforge.strict():            # a fallback to the torch path raises NoKernelError
        y = opforge.layer_norm(x)

``OPFORGE_STRICT=1`` in the environment turns strict mode on for the whole process.
"""
from __future__ import annotations

import contextlib
import contextvars
import os
import warnings
from typing import Iterator, Optional

from .backends import BACKEND_NAMES

BACKENDS = BACKEND_NAMES

_forced_backend: contextvars.ContextVar[Optional[str]] = contextvars.ContextVar("opforge_backend", default=None)
_strict: contextvars.ContextVar[Optional[bool]] = contextvars.ContextVar("opforge_strict", default=None)
_warned: set[tuple[str, str]] = set()


class FallbackWarning(RuntimeWarning):
    """The torch path ran where an accelerated kernel was expected."""


@contextlib.contextmanager
def backend(name: str) -> Iterator[None]:
    """Force every opforge op inside the block onto one backend.

    A call the forced backend cannot run raises ``opforge.NoKernelError``; nothing falls back.

    Example:
        >>> import torch, opforge
        >>> with opforge.backend("torch"):
        ...     y = opforge.rms_norm(torch.randn(4, 64))
    """
    if name not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {name!r}")
    token = _forced_backend.set(name)
    try:
        yield
    finally:
        _forced_backend.reset(token)


@contextlib.contextmanager
def strict(enabled: bool = True) -> Iterator[None]:
    """Inside the block, a call that would fall back to the torch path raises ``NoKernelError``.

    Example:
        >>> import torch, opforge
        >>> with opforge.strict():
        ...     y = opforge.layer_norm(torch.randn(2, 8))   # CPU: torch is the native path, no error
    """
    token = _strict.set(enabled)
    try:
        yield
    finally:
        _strict.reset(token)


def forced_backend() -> Optional[str]:
    return _forced_backend.get()


def is_strict() -> bool:
    value = _strict.get()
    if value is None:
        return os.environ.get("OPFORGE_STRICT", "") not in ("", "0", "false", "False")
    return value


def warn_fallback_once(op: str, reason: str) -> None:
    """Warn (once per op and reason) that the torch path stands in for an accelerated kernel."""
    key = (op, reason)
    if key in _warned:
        return
    _warned.add(key)
    warnings.warn(f"opforge.{op}: running the torch path instead of an accelerated kernel ({reason})",
                  FallbackWarning, stacklevel=4)
