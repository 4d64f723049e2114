"""Bad input, empty input, the nn modules, trace, explain and strict mode for the norm ops."""
import math

import pytest
import torch

import opforge
from opforge.runtime import registry
from opforge.testing import DEVICE, max_rel_error

BACKENDS = ["triton", "torch"]


def call(op, x, residual=None, **kw):
    fn = getattr(opforge, op)
    return fn(x, residual, **kw) if op.startswith("add_") else fn(x, **kw)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", ["layer_norm", "add_layer_norm"])
def test_bad_input_errors_name_the_argument(backend, op):
    x = torch.randn(4, 16, device=DEVICE)
    r = torch.randn(4, 16, device=DEVICE)
    bad = [
        (dict(weight=torch.randn(15, device=DEVICE)), ValueError, "weight must have shape (16,)"),
        (dict(bias=torch.randn(2, 16, device=DEVICE)), ValueError, "bias must have shape (16,)"),
        (dict(weight=torch.ones(16, dtype=torch.int32, device=DEVICE)), TypeError, "weight must be float32"),
        (dict(eps=-1e-5), ValueError, "eps must be a finite number >= 0"),
        (dict(eps=math.nan), ValueError, "eps"),
        (dict(eps=math.inf), ValueError, "eps"),
        (dict(eps="1e-5"), TypeError, "eps must be a real number"),
    ]
    if DEVICE == "cpu":
        bad.append((dict(weight=torch.randn(16, device="meta")), ValueError, "weight is on meta"))
    with opforge.backend(backend):
        for kwargs, exc, message in bad:
            with pytest.raises(exc, match=_escape(message)):
                call(op, x, r, **kwargs)
        with pytest.raises(TypeError, match="x must be float32"):
            call(op, torch.ones(4, 16, dtype=torch.int64, device=DEVICE), r)
        with pytest.raises(TypeError, match="x must be float32"):
            call(op, torch.ones(4, 16, dtype=torch.bool, device=DEVICE), r)
        with pytest.raises(ValueError, match="N must be >= 1"):
            call(op, torch.randn(4, 0, device=DEVICE), torch.randn(4, 0, device=DEVICE))
        with pytest.raises(TypeError, match="x must be a torch.Tensor"):
            call(op, [1.0, 2.0], r)


def _escape(message: str) -> str:
    import re
    return re.escape(message)


@pytest.mark.parametrize("backend", BACKENDS)
def test_residual_errors(backend):
    x = torch.randn(4, 16, device=DEVICE)
    with opforge.backend(backend):
        with pytest.raises(ValueError, match=r"residual must have x's shape \(4, 16\)"):
            opforge.add_rms_norm(x, torch.randn(4, 8, device=DEVICE))
        with pytest.raises(TypeError, match="residual must have x's dtype"):
            opforge.add_rms_norm(x, torch.randn(4, 16, device=DEVICE, dtype=torch.float16))
        with pytest.raises(TypeError, match="residual must be a torch.Tensor"):
            opforge.add_rms_norm(x, None)


def test_float64_on_triton_backend_is_refused_clearly():
    x = torch.randn(4, 16, dtype=torch.float64, device=DEVICE)
    with opforge.backend("triton"), pytest.raises(opforge.NoKernelError, match="float64 runs on the torch path"):
        opforge.layer_norm(x)


def test_float64_weight_needs_float64_x():
    with pytest.raises(TypeError, match="weight may be float64 only when x is float64"):
        opforge.rms_norm(torch.randn(2, 8, device=DEVICE), torch.ones(8, dtype=torch.float64, device=DEVICE))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", ["layer_norm", "rms_norm", "add_layer_norm", "add_rms_norm"])
def test_zero_rows_return_empty(backend, op):
    x = torch.randn(0, 3, 32, device=DEVICE)
    with opforge.backend(backend):
        out = call(op, x, torch.randn(0, 3, 32, device=DEVICE))
    outs = out if isinstance(out, tuple) else (out,)
    assert all(o.shape == (0, 3, 32) and o.dtype == x.dtype for o in outs)


def test_inputs_are_not_modified():
    x = torch.randn(3, 64, device=DEVICE)
    r = torch.randn(3, 64, device=DEVICE)
    x0, r0 = x.clone(), r.clone()
    with opforge.backend("triton"):
        opforge.add_layer_norm(x, r, torch.randn(64, device=DEVICE), torch.randn(64, device=DEVICE))
    assert torch.equal(x, x0) and torch.equal(r, r0)


def test_trace_records_each_call():
    x = torch.randn(2, 3, 96, device=DEVICE, dtype=torch.bfloat16)
    with opforge.backend("triton"), opforge.trace() as t:
        opforge.layer_norm(x)
        opforge.add_rms_norm(x, x)
    assert [e.op for e in t] == ["layer_norm", "add_rms_norm"]
    e = t[0]
    assert (e.backend, e.variant, e.device, e.dtype, e.shape) == ("triton", "multirow", str(x.device), "bfloat16",
                                                                   (2, 3, 96))
    text = str(t)
    assert "layer_norm" in text and "multirow" in text and "2x3x96" in text


def test_trace_outside_block_records_nothing():
    with opforge.trace() as t:
        pass
    opforge.rms_norm(torch.randn(2, 8, device=DEVICE))
    assert len(t) == 0


def test_explain_names_choice_and_rejections():
    x = torch.randn(8, 4096, device=DEVICE, dtype=torch.float16)
    with opforge.backend("triton"):
        e = opforge.explain("layer_norm", x, torch.ones(4096, device=DEVICE))
    assert e.chosen.qualified_name == "triton.row"
    reasons = {v.qualified_name: r for v, r in e.rejected}
    assert reasons["triton.multirow"] == "N=4096 > 1024"
    assert "comes first" in reasons["triton.looped"]
    assert "another backend is forced" in reasons["torch.reference"]
    assert "chosen: triton.row" in str(e)


def test_explain_on_cpu_prefers_torch_without_fallback():
    e = opforge.explain("rms_norm", torch.randn(2, 64))
    assert e.chosen.qualified_name == "torch.reference"
    assert e.note == ""


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a real GPU fallback needs a GPU")
def test_strict_mode_on_gpu():
    x = torch.randn(2, 64, dtype=torch.float64, device="cuda")
    with opforge.strict(), pytest.raises(opforge.NoKernelError):
        opforge.layer_norm(x)
    with pytest.warns(opforge.FallbackWarning), opforge.trace() as t:
        opforge.rms_norm(x)
    assert t[0].backend == "torch"


def test_forced_backend_unavailable_raises(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    registry.clear_cache()
    try:
        if not torch.cuda.is_available():
            with opforge.backend("triton"), pytest.raises(opforge.NoKernelError, match="TRITON_INTERPRET"):
                opforge.layer_norm(torch.randn(2, 8))
        with opforge.backend("metal"), pytest.raises(opforge.NoKernelError):
            opforge.layer_norm(torch.randn(2, 8, device=DEVICE))
    finally:
        registry.clear_cache()
    with pytest.raises(ValueError, match="backend must be one of"):
        with opforge.backend("cuda"):
            pass


def test_nn_modules_are_drop_in():
    for ours, theirs, kwargs in [(opforge.nn.LayerNorm, torch.nn.LayerNorm, {}),
                                 (opforge.nn.LayerNorm, torch.nn.LayerNorm, {"bias": False}),
                                 (opforge.nn.RMSNorm, torch.nn.RMSNorm, {"eps": 1e-6}),
                                 (opforge.nn.RMSNorm, torch.nn.RMSNorm, {})]:
        src = theirs(96, **kwargs).to(DEVICE)
        with torch.no_grad():
            for p in src.parameters():
                p.normal_()
        dst = ours(96, **kwargs).to(DEVICE)
        assert dst.load_state_dict(src.state_dict()) is not None
        assert set(dst.state_dict()) == set(src.state_dict())
        x = torch.randn(3, 5, 96, device=DEVICE)
        with torch.no_grad():
            assert max_rel_error(dst(x), src(x)) < 1e-5
    with pytest.raises(ValueError, match="last dimension only"):
        opforge.nn.LayerNorm((4, 8))


def test_device_info_cpu():
    info = opforge.device_info("cpu")
    assert info.kind == "cpu" and info.device == "cpu"
    with pytest.raises(ValueError, match="does not exist"):
        opforge.device_info("cuda:7")
