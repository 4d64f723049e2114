"""Bad input, empty input, the fusion hook, trace, explain, strict mode and fallback for the activations."""
import re
import types

import pytest
import torch

import opforge
from opforge.ops.activation import geglu, gelu, reference, relu, silu, swiglu
from opforge.testing import DEVICE

BACKENDS = ["triton", "torch"]
UNARY = {"gelu": gelu, "silu": silu, "relu": relu}
GATED_FNS = {"swiglu": swiglu, "geglu": geglu}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", UNARY)
def test_unary_bad_input_errors_name_the_argument(backend, op):
    fn = UNARY[op]
    with opforge.backend(backend):
        for bad_dtype in (torch.int64, torch.int8, torch.bool, torch.complex64):
            with pytest.raises(TypeError, match="x must be float32, float16 or bfloat16"):
                fn(torch.ones(4, 16, dtype=bad_dtype, device=DEVICE))
        with pytest.raises(TypeError, match="x must be a torch.Tensor, got list"):
            fn([1.0, 2.0])
        with pytest.raises(TypeError, match="x must be a torch.Tensor, got float"):
            fn(1.5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_gelu_approximate_is_checked(backend):
    x = torch.randn(3, 8, device=DEVICE)
    with opforge.backend(backend):
        with pytest.raises(ValueError, match=re.escape("approximate must be 'none' or 'tanh', got 'erf'")):
            gelu(x, approximate="erf")
        with pytest.raises(TypeError, match="approximate must be 'none' or 'tanh', got NoneType"):
            gelu(x, approximate=None)
        with pytest.raises(ValueError, match="approximate must be"):
            geglu(x, x, approximate="fast")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", GATED_FNS)
def test_gated_bad_input_errors_name_the_argument(backend, op):
    fn = GATED_FNS[op]
    gate = torch.randn(4, 16, device=DEVICE)
    with opforge.backend(backend):
        with pytest.raises(TypeError, match="gate must be float32"):
            fn(torch.ones(4, 16, dtype=torch.int32, device=DEVICE), gate)
        with pytest.raises(TypeError, match="up must be float32"):
            fn(gate, torch.ones(4, 16, dtype=torch.bool, device=DEVICE))
        with pytest.raises(TypeError, match="up must be a torch.Tensor, got NoneType"):
            fn(gate, None)
        with pytest.raises(ValueError, match=re.escape("up must have gate's shape (4, 16), got (4, 8)")):
            fn(gate, torch.randn(4, 8, device=DEVICE))
        with pytest.raises(ValueError, match="up must have gate's shape"):
            fn(gate, torch.randn(16, device=DEVICE))   # no broadcasting
        with pytest.raises(TypeError, match="up must have gate's dtype torch.float32, got torch.float16"):
            fn(gate, torch.randn(4, 16, device=DEVICE, dtype=torch.float16))
        if DEVICE == "cpu":
            with pytest.raises(ValueError, match="up is on meta but gate is on cpu"):
                fn(gate, torch.randn(4, 16, device="meta"))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", list(UNARY) + list(GATED_FNS))
@pytest.mark.parametrize("shape", [(0,), (3, 0, 5)])
def test_empty_input_returns_empty(backend, op, shape):
    x = torch.randn(shape, device=DEVICE, dtype=torch.bfloat16)
    args = (x, x.clone()) if op in GATED_FNS else (x,)
    with opforge.backend(backend):
        out = getattr(opforge.ops.activation, op)(*args)
    assert out.shape == shape and out.dtype == x.dtype


def test_inputs_are_not_modified():
    gate, up = torch.randn(3, 64, device=DEVICE), torch.randn(3, 64, device=DEVICE)
    g0, u0 = gate.clone(), up.clone()
    with opforge.backend("triton"):
        for fn in UNARY.values():
            fn(gate)
        for fn in GATED_FNS.values():
            fn(gate, up)
    assert torch.equal(gate, g0) and torch.equal(up, u0)


class Symbolic:
    """A stand-in for the fusion compiler's symbolic tensor: records what the ops asked for."""

    _opforge_symbolic_ = True

    def __init__(self, name):
        self.name = name
        self.calls = []

    def _opforge_apply_(self, op, args, kwargs):
        self.calls.append((op, args, kwargs))
        return ("result", op)


def test_fusion_hook_records_each_activation():
    x, y = Symbolic("x"), Symbolic("y")
    assert gelu(x) == ("result", "gelu")
    assert gelu(x, approximate="tanh") == ("result", "gelu")
    assert silu(x) == ("result", "silu")
    assert relu(x) == ("result", "relu")
    assert swiglu(x, y) == ("result", "swiglu")
    assert geglu(x, y, approximate="tanh") == ("result", "geglu")
    assert x.calls == [
        ("gelu", (x,), {"approximate": "none"}),
        ("gelu", (x,), {"approximate": "tanh"}),
        ("silu", (x,), {}),
        ("relu", (x,), {}),
        ("swiglu", (x, y), {}),
        ("geglu", (x, y), {"approximate": "tanh"}),
    ]
    # a symbolic up with a concrete gate still goes to the tracer
    real = torch.randn(4)
    assert swiglu(real, y) == ("result", "swiglu")
    assert y.calls[-1][0] == "swiglu" and y.calls[-1][1][0] is real


def test_formulas_accept_another_ops_namespace():
    # The fusion compiler evaluates the same formulas on its own tensors with its own functions.
    used = []

    def wrap(name, fn):
        def call(*args):
            used.append(name)
            return fn(*args)
        return call

    ops = types.SimpleNamespace(**{n: wrap(n, getattr(torch, n)) for n in ("erf", "tanh", "sigmoid", "where")})
    x = torch.randn(100, dtype=torch.float64)
    u = torch.randn(100, dtype=torch.float64)
    for name, formula in reference.FORMULAS.items():
        args = (x, u) if name in ("swiglu", "geglu") else (x,)
        assert torch.equal(formula(*args, ops=ops), formula(*args))
    assert torch.equal(reference.gelu_formula(x, "tanh", ops), reference.gelu(x, "tanh"))
    assert set(used) == {"erf", "tanh", "sigmoid", "where"}


def test_trace_records_each_call():
    x = torch.randn(2, 3, 96, device=DEVICE, dtype=torch.bfloat16)
    with opforge.backend("triton"), opforge.trace() as t:
        gelu(x, approximate="tanh")
        swiglu(x, x)
        relu(x[..., ::2])
    assert [e.op for e in t] == ["gelu", "swiglu", "relu"]
    e = t[0]
    assert (e.backend, e.variant, e.device, e.dtype, e.shape, e.note) == \
        ("triton", "pointwise", str(x.device), "bfloat16", (2, 3, 96), "")
    assert "x copied" in t[2].note


def test_explain_names_choice_and_rejections():
    x = torch.randn(8, 64, device=DEVICE, dtype=torch.float16)
    with opforge.backend("triton"):
        e = opforge.explain("geglu", x, x, approximate="tanh")
    assert e.chosen.qualified_name == "triton.pointwise"
    assert "approximate='tanh'" in str(e)
    with opforge.backend("triton"):
        e64 = opforge.explain("silu", x.double())
    assert e64.chosen is None
    assert "float64 runs on the torch path" in dict((v.qualified_name, r) for v, r in e64.rejected)["triton.pointwise"]


def test_explain_on_cpu_prefers_torch_without_fallback():
    e = opforge.explain("gelu", torch.randn(2, 64))
    assert e.chosen.qualified_name == "torch.reference" and e.note == ""


def test_float64_on_triton_backend_is_refused_clearly():
    x = torch.randn(4, 16, dtype=torch.float64, device=DEVICE)
    with opforge.backend("triton"), pytest.raises(opforge.NoKernelError, match="float64 runs on the torch path"):
        swiglu(x, x)


def test_verify_cases_quick_and_full():
    from opforge.ops.activation import cases as act_cases
    from opforge.ops.softmax import cases as sm_cases

    for family in (act_cases, sm_cases):
        for device_type in ("cpu", "cuda"):
            full, quick = family.verify_cases(device_type), family.verify_cases(device_type, quick=True)
            assert 0 < len(quick) < len(full)
            assert any(c.layout.startswith("strided") for c in quick)
