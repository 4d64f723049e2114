"""A call, then a call that differs from it in one field a support predicate reads.

Whatever the first call left behind (the registry's cached choice, launch plans, per-signature
launch arguments), the second call must come out as it does alone on fresh caches: the same
kernel refused with the same ``NoKernelError``, or values within the dtype's tolerance of the
float64 reference. A cache key that left out the field would serve the second call the first
call's kernel.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import opforge
from opforge.runtime import registry
from opforge.testing import TOLERANCE, max_rel_error

#: The backends a CPU tensor reaches here: the torch path, Triton's interpreter, the Metal emulator.
CPU_BACKENDS = ("torch", "triton")


class Call(NamedTuple):
    """``run()`` makes the call; ``reference`` is its float64 result (a tensor or a tuple)."""

    run: Callable[[], Any]
    reference: Any
    dtype: Any
    tol_scale: float = 4.0


def outcome(call: Call) -> str:
    """'ran' (after checking the values) or the ``NoKernelError`` message."""
    try:
        out = call.run()
    except opforge.NoKernelError as error:
        return f"refused: {error}"
    error = max_rel_error(out, call.reference)
    assert error <= TOLERANCE[call.dtype] * call.tol_scale, f"rel error {error:.3g}"
    return "ran"


def check_pair(backend: str, first: Call, second: Call) -> tuple[str, str]:
    """Run ``second`` alone, then ``first`` (twice: launch plans are left on the first call and
    taken on the second) and ``second`` again, on ``backend``; both outcomes of ``second`` must be
    equal. Returns (first's outcome, second's)."""
    registry.clear_cache()
    with opforge.backend(backend):
        alone = outcome(second)
    registry.clear_cache()
    with opforge.backend(backend):
        got_first = outcome(first)
        assert outcome(first) == got_first
        after = outcome(second)
    assert after == alone, f"after the first call: {after!r}; alone: {alone!r}"
    return got_first, after
