"""A small thread-safe LRU mapping for opforge's caches.

Every cache keyed by something a user controls (shapes, dtypes, strides) is one of these, so a
long run over many distinct shapes keeps a bounded amount of host memory. ``get`` on a hit is a
dict lookup plus a move to the end, without a lock (writes take one); ``put`` evicts the least recently used
entries beyond ``maxsize``. Every LRU registers itself, so ``clear_all()`` (called on out of
memory) empties them all.

Sizes (entries): selection choices 4096 (registry), interned problems 4096 per family,
Triton binaries 256 per kernel (launch), launch plans 1024 per family (runtime.plans), fused
kernel modules 256 (fusion.cache), Metal libraries 64 (runtime.metal.library).
"""
from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from typing import Any, Callable, Generic, Hashable, Optional, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

_all: "weakref.WeakSet[LRU]" = weakref.WeakSet()
_MISSING = object()


class LRU(Generic[K, V]):
    """A bounded mapping, least recently used entries evicted first; safe from several threads.

    Example:
        >>> cache = LRU(2, "example")
        >>> cache.put("a", 1); cache.put("b", 2); cache.get("a")
        1
        >>> cache.put("c", 3)          # evicts "b", the least recently used
        >>> cache.get("b") is None, len(cache)
        (True, 2)
    """

    def __init__(self, maxsize: int, name: str = ""):
        if maxsize < 1:
            raise ValueError(f"maxsize must be >= 1, got {maxsize}")
        self.maxsize = maxsize
        self.name = name
        self._data: OrderedDict = OrderedDict()
        self._lock = threading.Lock()
        _all.add(self)

    def get(self, key: K, default: Optional[V] = None) -> Optional[V]:
        # Lock-free: OrderedDict's get and move_to_end are each atomic under the GIL; a key another
        # thread evicts in between only makes move_to_end raise, and the hit is still good.
        value = self._data.get(key, _MISSING)
        if value is _MISSING:
            return default
        try:
            self._data.move_to_end(key)
        except KeyError:
            pass
        return value

    def put(self, key: K, value: V) -> None:
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            self._trim()

    __setitem__ = put

    def __getitem__(self, key: K) -> V:
        value = self.get(key, _MISSING)  # type: ignore[arg-type]
        if value is _MISSING:
            raise KeyError(key)
        return value  # type: ignore[return-value]

    def setdefault(self, key: K, value: V) -> V:
        """The value already stored under ``key``, else store ``value`` and return it (atomic)."""
        with self._lock:
            existing = self._data.get(key, _MISSING)
            if existing is not _MISSING:
                self._data.move_to_end(key)
                return existing
            self._data[key] = value
            self._trim()
            return value

    def _trim(self) -> None:
        """Drop the least recently used entries beyond ``maxsize`` (the caller holds the lock)."""
        while len(self._data) > self.maxsize:
            self._data.popitem(last=False)

    def get_or_build(self, key: K, build: Callable[[], V]) -> V:
        """The cached value, or ``build()`` stored; ``build`` runs outside the lock (two threads
        may both build on a miss; the first stored value wins)."""
        value = self.get(key, _MISSING)  # type: ignore[arg-type]
        if value is _MISSING:
            value = self.setdefault(key, build())
        return value  # type: ignore[return-value]

    def pop(self, key: K, default: Any = None) -> Any:
        with self._lock:
            return self._data.pop(key, default)

    def values(self) -> list:
        with self._lock:
            return list(self._data.values())

    def items(self) -> list:
        with self._lock:
            return list(self._data.items())

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._data

    def __len__(self) -> int:
        return len(self._data)

    def keys(self) -> list:
        with self._lock:
            return list(self._data)

    def clear(self) -> None:
        with self._lock:
            self._data.clear()

    def __repr__(self) -> str:
        return f"LRU({self.name!r}, {len(self._data)}/{self.maxsize})"


def clear_all() -> None:
    """Empty every LRU in the process (what opforge frees when memory runs out)."""
    for cache in list(_all):
        cache.clear()
