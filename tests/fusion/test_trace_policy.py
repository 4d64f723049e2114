"""One trace event per fused call, with backend and variant; forced backends, strict mode, fallback."""
import warnings

import pytest
import torch

import opforge
from opforge.fusion import clear_caches, fuse, sigmoid
from opforge.runtime import backends
from opforge.testing import DEVICE

from fusion_helpers import BACKENDS, randn


@pytest.mark.parametrize("backend", BACKENDS)
def test_one_trace_event_per_call(backend):
    @fuse
    def swish_residual(x, r, beta: float):
        return x * sigmoid(beta * x) + r

    x, r = randn(6, 40, dtype=torch.bfloat16), randn(6, 40, dtype=torch.bfloat16)
    with opforge.backend(backend), opforge.trace() as t:
        swish_residual(x, r, 1.5)
        swish_residual(x, r, 0.5)
    assert len(t) == 2
    event = t[0]
    assert event.op == "fused:swish_residual" and event.backend == backend
    assert event.variant == ("flat" if backend == "triton" else "composite")
    assert event.dtype == "bfloat16" and event.shape == (6, 40) and event.device == str(x.device)
    assert "swish_residual" in event.note
    assert "fused:swish_residual" in str(t)


def test_trace_variant_of_a_tiled_kernel_and_of_split_outputs():
    f = fuse(lambda x, b: (x + b, b * 2))
    x, b = randn(4, 8), randn(8)
    with opforge.backend("triton"), opforge.trace() as t:
        a, b2 = f(x, b)
    assert a.shape == (4, 8) and b2.shape == (8,)
    assert torch.equal(a, x + b) and torch.equal(b2, b * 2)     # each output from its own kernel, right values
    assert len(t) == 1 and t[0].variant == "tiled+flat" and "2 kernels" in t[0].note


def test_native_backend_on_cpu_is_the_torch_path():
    if DEVICE != "cpu":
        pytest.skip("CPU only")
    with opforge.trace() as t, warnings.catch_warnings():
        warnings.simplefilter("error")          # no fallback warning: torch is native on CPU
        with opforge.strict():
            fuse(lambda x: x * 3)(randn(3))
    assert t[0].backend == "torch"


def test_forced_backend_that_cannot_run_raises(monkeypatch):
    f = fuse(lambda x: x + 1)
    with opforge.backend("metal"), pytest.raises(opforge.NoKernelError, match="metal"):
        f(randn(3))
    if DEVICE == "cpu":
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
        clear_caches()
        with opforge.backend("triton"), pytest.raises(opforge.NoKernelError, match="TRITON_INTERPRET"):
            f(randn(3))


def test_fallback_warns_once_and_strict_raises(monkeypatch):
    # Pretend the tensors' device has an accelerated backend that cannot run float64 arithmetic.
    monkeypatch.setattr(backends, "native_accelerated_backends", lambda device_type: ("triton",))
    f = fuse(lambda x: x.double() * 2)
    x = randn(3)
    with pytest.warns(opforge.FallbackWarning, match="float64"):
        out = f(x)
    assert out.dtype == torch.float64
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        f(x)                                     # warned once only
    with opforge.strict(), pytest.raises(opforge.NoKernelError, match="float64"):
        f(x)
    with opforge.trace() as t:
        f(x)
    assert t[0].backend == "torch"
