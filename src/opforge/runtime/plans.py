"""Launch plans: the hot path of a call repeated with the same shapes, dtypes and devices.

The general path of an op call validates every argument, selects a variant, builds row views
and launch arguments: several microseconds of Python, more than a small kernel runs on the GPU.
Once a call has gone through it and launched a compiled kernel directly, its op family may
leave a *plan* under the call's *signature* (the facts that decided everything: shapes, dtypes,
devices, contiguity). A later call with the same signature runs the plan, which only
allocates the outputs and launches. A plan returns None where it cannot serve a call (say, a
pointer that is not 16-byte aligned); the family then takes the general path.

Plans are ignored while their outcome could differ or must be seen: inside ``opforge.trace()``,
under a forced backend other than the plan's own, and while ``OPFORGE_CHECK_LAUNCH_KEYS``
checks launches. Only accelerated variants that the registry chose without a fallback leave
plans, so strict mode has nothing to raise on a planned call.

Plans are off unless ``OPFORGE_PLANS=1`` (or ``set_enabled(True)``): they are tested (on CPU
against the general path's launch arguments, on a GPU end to end) but not yet measured on a GPU.
"""
from __future__ import annotations

import os
from typing import Any, Callable, Hashable, Optional

from . import policy, trace

Plan = Callable[..., Any]

_CHECKING_KEYS = os.environ.get("OPFORGE_CHECK_LAUNCH_KEYS", "") not in ("", "0")
_enabled = os.environ.get("OPFORGE_PLANS", "") not in ("", "0") and not _CHECKING_KEYS
_caches: list["PlanCache"] = []


class PlanCache:
    """Plans of one op family, by call signature.

    Example:
        >>> plans = PlanCache()
        >>> previous = set_enabled(True)
        >>> plans.offer(("double", (4,)), lambda x: [v * 2 for v in x], backend="triton")
        >>> plans.get(("double", (4,)))([1, 2, 3, 4])
        [2, 4, 6, 8]
        >>> plans.get(("double", (5,))) is None
        True
        >>> _ = set_enabled(previous)
    """

    def __init__(self, limit: int = 4096):
        self._plans: dict[Hashable, tuple[str, Plan]] = {}
        self._limit = limit
        _caches.append(self)

    def get(self, signature: Hashable) -> Optional[Plan]:
        """The plan for ``signature``, or None (none yet, or plans are off for this call)."""
        if trace._active:
            return None
        entry = self._plans.get(signature)
        if entry is None:
            return None
        forced = policy._forced_backend.get()
        return entry[1] if forced is None or forced == entry[0] else None

    def offer(self, signature: Optional[Hashable], plan: Plan, backend: str) -> None:
        """Keep ``plan``, which runs a variant of ``backend``, for ``signature`` (None: the call is
        not one a plan can repeat)."""
        if signature is None or not _enabled:
            return
        if len(self._plans) >= self._limit:
            self._plans.clear()
        self._plans[signature] = (backend, plan)

    def __contains__(self, signature: Hashable) -> bool:
        return signature in self._plans

    def clear(self) -> None:
        self._plans.clear()


def enabled() -> bool:
    """Whether calls leave plans (``OPFORGE_PLANS=1``; never while launch keys are checked).

    Example:
        >>> isinstance(enabled(), bool)
        True
    """
    return _enabled


def set_enabled(flag: bool) -> bool:
    """Turn plans on or off for new calls (existing plans are dropped); returns the old setting.

    Example:
        >>> previous = set_enabled(False)
        >>> enabled()
        False
        >>> _ = set_enabled(previous)
    """
    global _enabled
    previous, _enabled = _enabled, bool(flag) and not _CHECKING_KEYS
    clear_all()
    return previous


def clear_all() -> None:
    """Forget every family's plans (``registry.clear_cache()`` calls it).

    Example:
        >>> clear_all()
    """
    for cache in _caches:
        cache.clear()
