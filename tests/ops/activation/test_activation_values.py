"""gelu, silu, relu, swiglu and geglu against the float64 oracle: shapes, dtypes, layouts, special values."""
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, strategies as st

import opforge
from opforge.ops.activation import cases, config, reference, triton_kernels as tk
from opforge.ops.activation.problem import GATED, OPS, prepare
from opforge.testing import DEVICE, ON_GPU, TOLERANCE, max_rel_error, run_case

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def check(case, backend: str = "triton"):
    args, out, ref, t = run_case(case, backend)
    err = max_rel_error(out, ref)
    tol = TOLERANCE[case.dtype]
    if err > tol and out.numel() < 64:
        # A few elements: the norm is one element's, and a tail value below the half type's
        # smallest normal number is held with less relative precision (or flushes to 0).
        diff = (out.double().cpu() - ref.cpu()).abs()
        err = 0.0 if bool((diff <= tol * ref.cpu().abs() + torch.finfo(case.dtype).tiny).all()) else err
    assert err <= tol, f"{case.op} {case.label} {case.shape} {case.dtype}: rel err {err:.3e}"
    assert out.shape == args[0].shape and out.dtype == args[0].dtype
    assert len(t) == 1 and t[0].backend == backend and t[0].op == case.op
    return t[0], args, out


EDGE_SHAPES = [(), (1,), (7,), (3, 77), (2, 3, 130), (config.BLOCK[4] + 1,)]


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", EDGE_SHAPES)
def test_triton_edge_shapes(op, dtype, shape):
    event, _, _ = check(cases.make_case(op, shape, dtype))
    assert event.variant == "pointwise" and event.note == ""


@pytest.mark.parametrize("op", ["gelu", "geglu"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_forms(op, dtype, approximate):
    check(cases.make_case(op, (5, 300), dtype, approximate=approximate))


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("block", [16, 64])
def test_block_boundaries(op, block):
    # A forced small block: many programs, a partial last block, rows longer than one block.
    for shape, layout in [((block,), "packed"), ((block + 1,), "packed"), ((3, 2 * block + 5), "strided")]:
        x = cases.random_input(shape, torch.float32, DEVICE, layout)
        up = cases.random_input(shape, torch.float32, DEVICE, layout) if op in GATED else None
        call = prepare(op, x, up, "none" if op in ("gelu", "geglu") else None)
        out = tk.launch_pointwise(call, block=block)
        ref = reference.run(op, x.double(), None if up is None else up.double(), call.approximate)
        assert max_rel_error(out, ref) <= 1e-5, (shape, layout)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_strided_rows_run_in_place(op, dtype):
    event, _, out = check(cases.make_case(op, (2, 3, 150), dtype, layout="strided"))
    assert event.note == "", "strided rows must be read in place, not copied"
    assert out.is_contiguous()


@pytest.mark.parametrize("op", OPS)
def test_dense_permuted_layout_runs_in_place_and_keeps_it(op):
    event, args, out = check(cases.make_case(op, (2, 30, 40), torch.float16, layout="transposed"))
    assert event.note == ""
    assert out.stride() == args[0].stride()


@pytest.mark.parametrize("op", OPS)
def test_unaddressable_layout_is_copied_and_traced(op):
    event, _, _ = check(cases.make_case(op, (3, 40), torch.float32, layout="sliced"))
    assert "copied" in event.note and "last dimension" in event.note


@pytest.mark.parametrize("op", GATED)
def test_gate_and_up_halves_of_one_projection(op):
    h = torch.randn(4, 5, 2 * 96, device=DEVICE, dtype=torch.bfloat16)
    gate, up = h[..., :96], h[..., 96:]
    with opforge.backend("triton"), opforge.trace() as t:
        out = getattr(opforge.ops.activation, op)(gate, up)
    assert t[0].note == ""
    assert max_rel_error(out, reference.run(op, gate.double(), up.double(), "none")) <= TOLERANCE[torch.bfloat16]


@pytest.mark.parametrize("op", GATED)
@pytest.mark.parametrize("gate_layout,up_layout", [("packed", "strided"), ("transposed", "packed"),
                                                   ("strided", "sliced")])
def test_gate_and_up_in_different_layouts(op, gate_layout, up_layout):
    event, _, out = check(cases.make_case(op, (3, 50), torch.float32, layout=gate_layout, up_layout=up_layout))
    assert out.is_contiguous()
    assert ("up copied" in event.note) == (up_layout == "sliced")


def special_values(dtype):
    big = torch.finfo(dtype).max
    return torch.tensor([0.0, -0.0, 1e-30, -1e-30, 20.0, -20.0, 80.0, -80.0, 1e4, -1e4, big, -big,
                         float("inf"), float("-inf"), float("nan")], dtype=dtype, device=DEVICE)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_special_values_follow_torch(op, dtype, approximate):
    if approximate == "tanh" and op not in ("gelu", "geglu"):
        pytest.skip("no approximation for this op")
    x = special_values(dtype)
    up = torch.full_like(x, 0.5)
    kwargs = {"approximate": approximate} if op in ("gelu", "geglu") else {}
    with opforge.backend("triton"):
        out = getattr(opforge.ops.activation, op)(*((x, up) if op in GATED else (x,)), **kwargs)
    x64 = x.cpu().double()
    act = {"gelu": lambda v: F.gelu(v, approximate=approximate), "geglu": lambda v: F.gelu(v, approximate=approximate),
           "silu": F.silu, "swiglu": F.silu, "relu": torch.relu}[op]
    expected = act(x64) * (0.5 if op in GATED else 1.0)
    got = out.cpu().double()
    finite = torch.isfinite(expected)
    # NaN where torch has NaN (silu(-inf) = -inf * 0), inf where torch has inf
    assert torch.equal(torch.isnan(got[~finite]), torch.isnan(expected[~finite])), (got, expected)
    assert torch.equal(got[torch.isinf(expected)], expected[torch.isinf(expected)].to(dtype).double())
    # finite values: within the output dtype's rounding, elementwise (overflow to inf allowed at +-max)
    e, g = expected[finite], got[finite]
    subnormal_step = torch.finfo(dtype).tiny * torch.finfo(dtype).eps
    ok = ((g - e).abs() <= 4 * TOLERANCE[dtype] * e.abs() + subnormal_step) | torch.isinf(e.to(dtype).double())
    assert ok.all(), (x64[finite][~ok], g[~ok], e[~ok])


@pytest.mark.parametrize("op", ["silu", "swiglu"])
def test_silu_tail_is_accurate_elementwise(op):
    x = -torch.linspace(5, 60, 200, device=DEVICE)
    up = torch.ones_like(x)
    with opforge.backend("triton"):
        out = opforge.ops.activation.silu(x) if op == "silu" else opforge.ops.activation.swiglu(x, up)
    ref = reference.silu(x.double())
    assert ((out.double() - ref).abs() <= 1e-5 * ref.abs()).all()


@pytest.mark.parametrize("op", ["gelu", "geglu"])
def test_exact_gelu_tail_is_accurate_elementwise(op):
    # 1 + erf(x / sqrt(2)) cancels in float32 below x = -4 (torch's float32 gelu loses every digit
    # by x = -6); the erfc form keeps ~1e-6 relative error down to where the result underflows.
    x = -torch.linspace(0.5, 12, 300, device=DEVICE)
    with opforge.backend("triton"):
        out = opforge.ops.activation.gelu(x) if op == "gelu" else opforge.ops.activation.geglu(x, torch.ones_like(x))
    x64 = x.double()
    ref = 0.5 * x64 * torch.special.erfc(-x64 / 2 ** 0.5)
    normal = ref.abs() > torch.finfo(torch.float32).tiny
    assert ((out.double() - ref).abs()[normal] <= 2e-5 * ref.abs()[normal]).all()
    careful = reference.careful_run("gelu", x, None, "none")      # float32 through erfc
    assert ((careful.double() - ref).abs()[normal] <= 2e-5 * ref.abs()[normal]).all()
    with opforge.backend("torch"):                                 # F.gelu: exact to float32's absolute error
        torch_path = opforge.ops.activation.gelu(x)
    assert (torch_path.double() - ref).abs().max() <= 1e-6


def test_erfc_fit_accuracy():
    # the fitted erfc the kernel uses, evaluated in float64: 1.1e-7 relative over the range
    z = torch.linspace(0, 26, 100001, dtype=torch.float64)
    t = 1 / (1 + 0.5 * z)
    p = torch.zeros_like(z)
    for c in (0.17087277, -0.82215223, 1.48851587, -1.13520398, 0.27886807, -0.18628806, 0.09678418,
              0.37409196, 1.00002368):
        p = p * t + c
    fit = t * torch.exp(t * p - z * z - 1.26551223)
    ref = torch.special.erfc(z)
    assert ((fit - ref).abs() / ref).max() < 1.2e-7


def test_gelu_tanh_tail_is_accurate_elementwise():
    x = -torch.linspace(2, 9, 200, device=DEVICE)
    with opforge.backend("triton"):
        out = opforge.ops.activation.gelu(x, approximate="tanh")
    # the oracle here is x * sigmoid(2u): 0.5 * x * (1 + tanh(u)) cancels even in float64 this far out
    x64 = x.double()
    ref = x64 / (1 + torch.exp(-2 * reference.SQRT_2_OVER_PI * (x64 + reference.TANH_CUBIC * x64 ** 3)))
    assert max_rel_error(ref, reference.gelu(x64, approximate="tanh")) < 1e-12
    assert ((out.double() - ref).abs() <= 1e-4 * ref.abs()).all()


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_torch_path(op, dtype):
    for shape in [(3, 77), (2, 3, 150)]:
        event, _, _ = check(cases.make_case(op, shape, dtype), "torch")
        assert event.variant == "reference"
    # One element: its own relative error. The torch path's F.gelu (float32 and half) computes
    # 1 + erf(x / sqrt(2)), which cancels in the tail: there it is exact to float32's absolute
    # error only (the careful erfc form keeps every digit: test_exact_gelu_tail_is_accurate_elementwise).
    _, out, ref, t = run_case(cases.make_case(op, (), dtype), "torch")
    floor = 1e-6 if op in ("gelu", "geglu") else 0.0
    assert t[0].variant == "reference" and (out.double() - ref).abs() <= TOLERANCE[dtype] * ref.abs() + floor


@pytest.mark.parametrize("op", OPS)
def test_float64_runs_on_torch_path_exactly(op):
    x = torch.randn(3, 50, dtype=torch.float64, device=DEVICE)
    up = torch.randn(3, 50, dtype=torch.float64, device=DEVICE)
    torch_fn = {"gelu": F.gelu, "silu": F.silu, "relu": torch.relu,
                "swiglu": lambda g, u: F.silu(g) * u, "geglu": lambda g, u: F.gelu(g) * u}[op]
    args = (x, up) if op in GATED else (x,)
    with opforge.backend("torch"):
        out = getattr(opforge.ops.activation, op)(*args)
    assert max_rel_error(out, torch_fn(*args)) < 1e-12


def test_formulas_match_torch_functional_in_float64():
    x = torch.randn(1000, dtype=torch.float64) * 4
    u = torch.randn(1000, dtype=torch.float64)
    assert max_rel_error(reference.gelu(x), F.gelu(x)) < 1e-14
    assert max_rel_error(reference.gelu(x, "tanh"), F.gelu(x, approximate="tanh")) < 1e-14
    assert max_rel_error(reference.silu(x), F.silu(x)) < 1e-14
    assert torch.equal(reference.relu(x), torch.relu(x))
    assert max_rel_error(reference.swiglu(x, u), F.silu(x) * u) < 1e-14
    assert max_rel_error(reference.geglu(x, u, "tanh"), F.gelu(x, approximate="tanh") * u) < 1e-14


@given(
    op=st.sampled_from(OPS),
    lead=st.lists(st.integers(1, 5), min_size=0, max_size=2),
    n=st.integers(1, 300),
    scalar=st.booleans(),
    dtype=st.sampled_from(DTYPES),
    layout=st.sampled_from(["packed", "strided", "transposed", "sliced"]),
    approximate=st.sampled_from([None, "none", "tanh"]),
)
def test_random_shapes_layouts_dtypes(op, lead, n, scalar, dtype, layout, approximate):
    shape = () if scalar and not lead else tuple(lead) + (n,)
    if not shape:
        layout = "packed"
    if op not in ("gelu", "geglu"):
        approximate = None
    check(cases.make_case(op, shape, dtype, layout=layout, approximate=approximate))


@pytest.mark.skipif(not ON_GPU, reason="large shapes need a GPU (the interpreter runs ~1 ms per program)")
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(16384, 11008), (3, 1000003), (4096, 4096)])
def test_gpu_large_shapes(op, dtype, shape):
    event, _, _ = check(cases.make_case(op, shape, dtype))
    assert event.device.startswith("cuda")


# The large GPU shapes' code paths at interpreter sizes: rows as long as theirs (many programs per
# row, a ragged last block), fewer of them.
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(2, 11008), (1, 100003), (3, 4096)])
def test_large_shape_paths_with_few_rows(op, dtype, shape):
    event, _, _ = check(cases.make_case(op, shape, dtype))
    assert event.variant == "pointwise"
