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

Plans are on unless ``OPFORGE_PLANS=0`` (or ``set_enabled(False)``); ``DEFAULT_ENABLED`` is
the default when the variable is unset. Families with plans: the norms, softmax and log_softmax
(register-held and looped variants), the activations (packed inputs).

Each family's cache is an LRU of at most ``PLAN_CACHE_SIZE`` signatures, safe to share between
threads: lookups take no lock (single dict operations, atomic under the GIL), insertions and
evictions take one. Two threads racing on a first call both run the general path; either's plan
is kept, and both plans launch the same compiled binary with the same constant arguments.
"""
from __future__ import annotations

import os
from typing import Any, Callable, Hashable, Optional

from . import policy, trace
from .lru import LRU

Plan = Callable[..., Any]

#: Whether plans are on when ``OPFORGE_PLANS`` is unset (``OPFORGE_PLANS=0`` turns them off,
#: any other value on).
DEFAULT_ENABLED = True
#: Signatures kept per op family (least recently used dropped first); a plan is a closure of a
#: few hundred bytes, so a full cache is well under 1 MiB per family.
PLAN_CACHE_SIZE = 1024

_CHECKING_KEYS = os.environ.get("OPFORGE_CHECK_LAUNCH_KEYS", "") not in ("", "0")


def _from_env() -> bool:
    value = os.environ.get("OPFORGE_PLANS")
    return (DEFAULT_ENABLED if value is None or value == "" else value not in ("0", "false", "False")) \
        and not _CHECKING_KEYS


_enabled = _from_env()
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

    def __init__(self, limit: int = PLAN_CACHE_SIZE):
        self._lru: LRU[Hashable, tuple[str, Plan]] = LRU(max(1, limit), "plans")
        # ``get`` reads the LRU's mapping itself: one Python call fewer on the planned hot path
        self._plans = self._lru._data
        _caches.append(self)

    def get(self, signature: Hashable) -> Optional[Plan]:
        """The plan for ``signature``, or None (none yet, or plans are off for this call)."""
        if trace._active:
            return None
        entry = self._plans.get(signature)
        if entry is None:
            return None
        try:
            self._plans.move_to_end(signature)
        except KeyError:  # another thread evicted it just now: the entry in hand is still valid
            pass
        forced = policy._forced_backend.get()
        return entry[1] if forced is None or forced == entry[0] else None

    def offer(self, signature: Optional[Hashable], plan: Plan, backend: str) -> None:
        """Keep ``plan``, which runs a variant of ``backend``, for ``signature`` (None: the call is
        not one a plan can repeat), dropping the least recently used plan beyond the limit."""
        if signature is None or not _enabled:
            return
        self._lru.put(signature, (backend, plan))

    def __contains__(self, signature: Hashable) -> bool:
        return signature in self._plans

    def __len__(self) -> int:
        return len(self._plans)

    def clear(self) -> None:
        self._lru.clear()


def enabled() -> bool:
    """Whether calls leave and run plans (on unless ``OPFORGE_PLANS=0``; never while launch keys
    are checked).

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
