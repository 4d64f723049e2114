"""The Metal activation kernels (gelu, silu, relu, swiglu, geglu), run in the MSL emulator,
against the float64 oracle; the kernels are the unchanged src/opforge/ops/activation/activation.metal."""
import pytest
import torch

import opforge
from opforge.ops.activation import cases
from opforge.ops.activation import metal as activation_metal
from opforge.ops.activation.problem import GATED, OPS, prepare
from opforge.testing import TOLERANCE, max_rel_error

pytestmark = pytest.mark.usefixtures("emulate")

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def check(op, shape, dtype, layout="packed", approximate=None, up_layout=None):
    case = cases.make_case(op, shape, dtype, layout=layout, approximate=approximate, up_layout=up_layout)
    args, kwargs = case.make("cpu")
    with opforge.backend("metal"), opforge.trace() as t:
        out = case.call(*args, **kwargs)
    assert len(t) == 1 and t[0].backend == "metal" and t[0].op == op and t[0].variant == "pointwise", list(t)
    err = max_rel_error(out, case.oracle(args, kwargs))
    assert err <= TOLERANCE[dtype], f"{op} {case.label} {dtype}: rel err {err:.3e}"
    return t[0], args, out


def _approximations(op):
    return (None, "tanh") if op in ("gelu", "geglu") else (None,)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", OPS)
def test_every_kernel_at_odd_sizes(op, dtype):
    for approximate in _approximations(op):
        for shape in ((2,), (33,), (3, 77), (2, 3, 257)):
            check(op, shape, dtype, approximate=approximate)


def test_single_element_and_zero_d():
    for op in OPS:
        for shape in ((1,), ()):
            x = torch.tensor(0.75).reshape(shape)
            args = (x, torch.tensor(-1.5).reshape(shape)) if op in GATED else (x,)
            with opforge.backend("metal"), opforge.trace() as t:
                y = getattr(opforge, op)(*args)
            assert t[0].backend == "metal" and y.shape == x.shape
            want = cases.oracle(op, args, {})
            assert torch.allclose(y.double(), want, rtol=1e-6), (op, shape)


@pytest.mark.parametrize("op", OPS)
def test_layouts_in_place(op):
    for layout in ("strided", "transposed"):
        event, args, out = check(op, (3, 5, 40), torch.bfloat16, layout=layout)
        assert event.note == "", (layout, event.note)
        if layout == "transposed":
            assert out.stride() == args[0].stride(), "a dense input's layout is kept"
    event, _, _ = check(op, (4, 30), torch.float32, layout="sliced")
    assert "copied" in event.note


@pytest.mark.parametrize("op", GATED)
def test_gate_and_up_halves_of_one_projection(op):
    h = torch.randn(4, 3, 2 * 50, dtype=torch.float16)
    gate, up = h[..., :50], h[..., 50:]
    with opforge.backend("metal"), opforge.trace() as t:
        y = getattr(opforge, op)(gate, up)
    assert t[0].backend == "metal" and t[0].note == ""
    want = cases.oracle(op, (gate, up), {})
    assert max_rel_error(y, want) <= TOLERANCE[torch.float16]
    event, _, _ = check(op, (3, 64), torch.float32, layout="packed", up_layout="strided")


def test_extreme_values():
    x = torch.tensor([-100.0, -12.0, -5.0, -1e-3, 0.0, 1e-3, 5.0, 12.0, 100.0, float("nan")])
    for op in ("gelu", "silu", "relu"):
        for approximate in _approximations(op):
            kw = {"approximate": approximate} if approximate else {}
            with opforge.backend("metal"):
                y = getattr(opforge, op)(x, **kw)
            want = cases.oracle(op, (x,), kw)
            assert torch.isnan(y[-1]) and torch.isnan(want[-1])
            assert torch.allclose(y[:-1].double(), want[:-1], rtol=2e-6, atol=1e-30), (op, approximate, y, want)


def test_launches_are_split(monkeypatch):
    monkeypatch.setattr(activation_metal, "MAX_THREADS_PER_LAUNCH", 512)
    check("swiglu", (3, 500), torch.float32, layout="strided")
    check("gelu", (1100,), torch.float16)


def test_float64_is_refused_clearly():
    with opforge.backend("metal"), pytest.raises(opforge.NoKernelError, match="float64 runs on the torch path"):
        opforge.silu(torch.randn(3, 16, dtype=torch.float64))


def test_launcher_refuses_a_wrong_tensor():
    call = prepare("relu", torch.randn(4, 8))
    bad = type(call)(call.problem, call.x.double(), None, None, "flat", (call.rows[0]._replace(tensor=call.x.double()),), "")
    with pytest.raises(RuntimeError, match="metal launcher"):
        activation_metal.launch_pointwise(bad)


def test_kernels_without_bfloat_before_metal_3_1():
    from metal_emu import _build, _source
    source = activation_metal.SOURCE.read_text()
    names = {k.name for k in _source.find_kernels(_build._preprocess(_build.compiler(), source, "activation.metal", 300))}
    assert "geglu_tanh_half" in names and not any("bfloat" in n for n in names)
    assert len(names) == 7 * 2
