"""The base of every op family's problem record, and the selection key derived from it.

A problem record is a frozen dataclass of what the support predicates and launch heuristics of
a family may read. Its ``key``, which the registry's selection cache uses, is the tuple of all of
its declared fields, so a key cannot leave out a field a predicate reads: a predicate can only
read the record (and constants), and every field of the record is in the key. A setting that may
change between calls (a tuning switch) is copied into a field when the record is built, never
read from a module global by a predicate.
"""
from __future__ import annotations

import dataclasses
import operator
from functools import cached_property
from typing import Any, Callable

_getters: dict[type, Callable[[Any], tuple]] = {}


def _getter(cls: type) -> Callable[[Any], tuple]:
    names = [f.name for f in dataclasses.fields(cls)]
    if len(names) == 1:
        name = names[0]
        return lambda record: (getattr(record, name),)
    return operator.attrgetter(*names)


class ProblemRecord:
    """Mix-in of a family's frozen problem dataclass: ``key`` is every declared field, in order.

    Example:
        >>> from dataclasses import dataclass
        >>> @dataclass(frozen=True)
        ... class Demo(ProblemRecord):
        ...     n: int
        ...     wide: bool
        >>> Demo(4, False).key
        (4, False)
    """

    @cached_property
    def key(self) -> tuple:
        """The selection key: the values of all declared fields (computed once per record)."""
        get = _getters.get(type(self))
        if get is None:
            get = _getters[type(self)] = _getter(type(self))
        return get(self)
