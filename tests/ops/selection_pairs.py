"""A call, then a call that differs from it in one field a support predicate reads.

Whatever the first call left behind (the registry's cached choice, launch plans, per-signature
launch arguments), the second call must come out as it does alone on fresh caches: the same
kernel refused with the same ``NoKernelError``, or values within the dtype's tolerance of the
float64 reference. A cache key that left out the field would serve the second call the first
call's kernel.
"""
from __future__ import annotations

from typing import Any, Callable, Union

import pytest

import opforge
from opforge.runtime import registry
from opforge.testing import DEVICE, TOLERANCE, Case, max_rel_error

#: The backends of the tests' device (on a CPU: the torch path and Triton's interpreter; on a GPU
#: the compiled kernels, whose launch plans the repeated first call exercises). The Metal
#: emulator runs CPU tensors: ``check_pair("metal", ...)`` under the ``emulate`` fixture.
CPU_BACKENDS = ("torch", "triton")

#: A call: an op family's verify ``Case``, or ``device -> (outputs, float64 reference, dtype)``.
Call = Union[Case, Callable[[Any], tuple]]


def outcome(call: Call, device: Any, tol_scale: float = 4.0) -> str:
    """'ran' (after checking the values on fresh data) or the ``NoKernelError`` message."""
    try:
        if isinstance(call, Case):
            args, kwargs = call.make(device)
            out = call.call(*args, **kwargs)
            ref, dtype = call.reference(args, kwargs, out), call.dtype
        else:
            out, ref, dtype = call(device)
    except opforge.NoKernelError as error:
        return f"refused: {error}"
    error = max_rel_error(out, ref)
    assert error <= TOLERANCE[dtype] * tol_scale, f"rel error {error:.3g}"
    return "ran"


def check_pair(backend: str, first: Call, second: Call) -> tuple[str, str]:
    """Run ``second`` alone, then ``first`` (twice: launch plans are left on the first call and
    taken on the second) and ``second`` again, on ``backend`` (metal: CPU tensors, the emulator;
    else the tests' device); both outcomes of ``second`` must be equal. Returns (first's outcome,
    second's)."""
    device = "cpu" if backend == "metal" else DEVICE
    registry.clear_cache()
    with opforge.backend(backend):
        alone = outcome(second, device)
    registry.clear_cache()
    with opforge.backend(backend):
        got_first = outcome(first, device)
        assert outcome(first, device) == got_first
        after = outcome(second, device)
    assert after == alone, f"after the first call: {after!r}; alone: {alone!r}"
    return got_first, after


def pair_tests(pairs: dict[str, tuple[Call, Call]]) -> tuple[Callable, Callable]:
    """The two tests each family runs over its ``pairs`` (field -> (first call, second call)): on
    ``CPU_BACKENDS`` of the tests' device, and in the Metal emulator. A family's test module binds
    them to its own names: ``test_..., test_..._metal = pair_tests(PAIRS)``."""
    @pytest.mark.parametrize("field", pairs)
    @pytest.mark.parametrize("backend", CPU_BACKENDS)
    def on_backends(backend: str, field: str) -> None:
        check_pair(backend, *pairs[field])

    @pytest.mark.emulator
    @pytest.mark.parametrize("field", pairs)
    def on_metal(emulate: Any, field: str) -> None:
        check_pair("metal", *pairs[field])
    return on_backends, on_metal
