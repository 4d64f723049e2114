"""Default backend, fallback and strict mode on an accelerator, for every op family.

The three families share one dispatch path (opforge.runtime.dispatch), so one set of tests runs
over each family's op: on a (pretend) accelerator the native backend runs by default; a float64
input falls back to torch, warning once and showing in the trace; strict mode raises instead.
"""
import warnings
from dataclasses import dataclass
from typing import Callable

import pytest
import torch

import opforge
from opforge.ops.norm import reference as norm_reference
from opforge.runtime import backends, registry
from opforge.testing import max_rel_error


@dataclass(frozen=True)
class Family:
    accelerated: str        # op that runs on the native backend by default
    fallback: str           # op checked for the float64 fallback ...
    oracle: Callable        # ... against this float64 result
    exact: bool             # the fallback must equal the oracle (else rel. error < 1e-12)
    strict: str             # op checked in strict mode
    arity: int              # tensors the strict op takes


FAMILIES = {
    "norm": Family("layer_norm", "layer_norm", norm_reference.layer_norm, True, "rms_norm", 1),
    "softmax": Family("softmax", "log_softmax", lambda x: torch.log_softmax(x, -1), False, "softmax", 1),
    "activation": Family("silu", "gelu", torch.nn.functional.gelu, False, "geglu", 2),
}


@pytest.fixture
def cpu_as_accelerator(monkeypatch):
    """Pretend CPU tensors are on an accelerator whose native backend is triton (interpreter)."""
    if not backends.triton_interpreting():
        pytest.skip("needs TRITON_INTERPRET=1 (on a GPU the real-device test in test_norm_api covers this)")
    native = backends.native_accelerated_backends
    monkeypatch.setattr(backends, "native_accelerated_backends",
                        lambda d: ("triton",) if d == "cpu" else native(d))
    registry.clear_cache()
    yield
    registry.clear_cache()


@pytest.mark.parametrize("family", FAMILIES)
def test_accelerator_runs_triton_by_default(cpu_as_accelerator, family):
    with opforge.trace() as t:
        getattr(opforge, FAMILIES[family].accelerated)(torch.randn(2, 64))
    assert t[0].backend == "triton"


@pytest.mark.parametrize("family", FAMILIES)
def test_fallback_warns_once_and_is_traced(cpu_as_accelerator, family):
    f = FAMILIES[family]
    op = getattr(opforge, f.fallback)
    x = torch.randn(2, 64, dtype=torch.float64)
    opforge.runtime.policy._warned.clear()
    with pytest.warns(opforge.FallbackWarning, match="float64"), opforge.trace() as t:
        y = op(x)
    assert t[0].backend == "torch" and "fallback" in t[0].note
    err = max_rel_error(y, f.oracle(x))
    assert err == 0 if f.exact else err < 1e-12
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        op(x)  # the same reason does not warn twice


@pytest.mark.parametrize("family", FAMILIES)
def test_strict_mode_raises_where_fallback_would_run(cpu_as_accelerator, monkeypatch, family):
    f = FAMILIES[family]
    op = getattr(opforge, f.strict)
    args = (torch.randn(2, 64, dtype=torch.float64),) * f.arity
    with opforge.strict(), pytest.raises(opforge.NoKernelError, match="float64") as info:
        op(*args)
    assert info.value.op == f.strict
    monkeypatch.setenv("OPFORGE_STRICT", "1")
    with pytest.raises(opforge.NoKernelError):
        op(*args)
    assert "strict mode: raises" in opforge.explain(f.strict, *args).note
