"""Every variant of every norm op against the float64 oracle, on fresh random data."""
import pytest
import torch
from hypothesis import given, strategies as st

import opforge
from opforge.ops.norm import cases, config, triton_kernels
from opforge.ops.norm.problem import OPS
from opforge.testing import check_case, max_rel_error, run_case, shapes_and_layouts

from opforge.testing import DEVICE, ON_GPU

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
ROW_LIMIT = {torch.float32: triton_kernels.ROW_MAX_N[4], torch.float16: triton_kernels.ROW_MAX_N[2],
             torch.bfloat16: triton_kernels.ROW_MAX_N[2]}
MULTIROW = triton_kernels.MULTIROW_MAX_N


def expected_variant(n: int, dtype: torch.dtype) -> str:
    if n <= MULTIROW:
        return "multirow"
    return "row" if n <= ROW_LIMIT[dtype] else "looped"


def check(case, backend: str, tol_scale: float = 1.0):
    return check_case(case, backend, tol_scale)[0]


@pytest.fixture(params=[False, True], ids=["shift=mean", "shift=first"])
def shift_sample(request, monkeypatch):
    """Both ways the Triton layer norm's one-row and multirow programs pick their shift
    (``config.first_value_shift``), forced for every width and with a residual too."""
    monkeypatch.setattr(triton_kernels, "first_value_shift", lambda block_n, has_residual: request.param)
    return request.param


# Edge shapes: N=1, N=3, N off the block size, each variant's boundary on both sides, one row, many rows.
EDGE_SHAPES = [(1, 1), (5, 3), (3, 77), (2, 1000), (1, MULTIROW), (2, MULTIROW + 1), (40, 96)]


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", EDGE_SHAPES)
def test_triton_edge_shapes(op, dtype, shape, shift_sample):
    event = check(cases.make_case(op, shape, dtype), "triton")
    assert event.variant == expected_variant(shape[-1], dtype)
    assert event.note == ""


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_triton_row_and_looped_boundaries(op, dtype, shift_sample):
    limit = ROW_LIMIT[dtype]
    for n in (limit, limit + 1, 3 * config.LOOP_CHUNK + 5):
        event = check(cases.make_case(op, (1, n), dtype), "triton")
        assert event.variant == expected_variant(n, dtype), n


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_torch_path(op, dtype):
    for shape in [(1, 1), (3, 77), (2, 3, 1500)]:
        event = check(cases.make_case(op, shape, dtype), "torch")
        assert event.variant == "reference"


@pytest.mark.parametrize("op", OPS)
def test_float64_runs_on_torch_path_exactly(op):
    _, out, ref, t = run_case(cases.make_case(op, (3, 50), torch.float64), "torch")
    assert max_rel_error(out, ref) < 1e-12
    assert t[0].dtype == "float64" and t[0].backend == "torch"


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_no_weight_no_bias(op, backend):
    check(cases.make_case(op, (4, 300), torch.float32, affine=False), backend)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_float32_weights_with_half_x(op, dtype):
    check(cases.make_case(op, (3, 256), dtype, weight_dtype=torch.float32), "triton")


@pytest.mark.parametrize("op", ["layer_norm", "add_layer_norm"])
@pytest.mark.parametrize("offset", [1e3, 1e4])
@pytest.mark.parametrize("n", [77, 1500, 20000])
@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_large_mean_small_spread_has_no_cancellation(op, offset, n, backend, shift_sample):
    # E[x^2] - E[x]^2 would lose every digit here; a rounded mean alone would cost ~offset * 2^-24.
    case = cases.make_case(op, (2, n), torch.float32, offset=offset)
    _, out, ref, _ = run_case(case, backend)
    assert max_rel_error(out, ref) < 1e-6


@pytest.mark.parametrize("op", ["layer_norm", "add_layer_norm"])
@pytest.mark.parametrize("n", [77, 1500, 20000, 40000])
def test_an_odd_prefix_still_gives_the_variance_around_the_mean(op, n, shift_sample):
    # With the first-value shift the kernels subtract each row's first value before summing.
    # Row 1's first 64 values sit 1e5 standard deviations off the rest: there the variance must be
    # recomputed around the mean (row 0, ordinary, shares the multirow tile).
    x = torch.randn(2, n, device=DEVICE)
    x[1] *= 0.01
    x[1, :64] = 1e3 + torch.randn(64, device=DEVICE)
    residual = torch.randn(2, n, device=DEVICE) * 1e-3 if op == "add_layer_norm" else None
    args = (x, residual) if residual is not None else (x,)
    with opforge.backend("triton"), opforge.trace() as t:
        out = getattr(opforge, op)(*args)
    assert t[0].backend == "triton"
    ref = opforge.ops.norm.reference.run(op, x.double(), None if residual is None else residual.double(),
                                         None, None, 1e-5)
    assert max_rel_error(out, ref) < 1e-5


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n", [77, 1500, 40000])
def test_strided_rows_run_in_place(op, dtype, n):
    event = check(cases.make_case(op, (2, 3, n), dtype, layout="strided"), "triton")
    assert event.note == "", "strided rows must be read in place, not copied"


@pytest.mark.parametrize("op", OPS)
def test_non_contiguous_last_dim_is_copied_and_traced(op):
    event = check(cases.make_case(op, (3, 40), torch.float32, layout="transposed"), "triton")
    assert "copied" in event.note and "last dimension" in event.note


def test_three_level_strides_are_copied_and_traced():
    big = torch.randn(4, 6, 5, 40, device=DEVICE)
    x = big[::2, ::2, ::2, :33]
    with opforge.backend("triton"), opforge.trace() as t:
        y = opforge.rms_norm(x)
    assert "two strides" in t[0].note
    assert max_rel_error(y, opforge.ops.norm.reference.rms_norm(x.double())) < 1e-5


def test_stride_views_of_3d_tensor_without_copy():
    big = torch.randn(4, 6, 130, device=DEVICE)
    for x in (big[::2], big[:, :, :100], big[1:, 2:5, 7:107]):
        with opforge.backend("triton"), opforge.trace() as t:
            y = opforge.layer_norm(x)
        assert t[0].note == ""
        assert max_rel_error(y, opforge.ops.norm.reference.layer_norm(x.double())) < 1e-5


@given(op=st.sampled_from(OPS), shape_layout=shapes_and_layouts(2100), dtype=st.sampled_from(DTYPES),
       affine=st.booleans())
def test_random_shapes_strides_dtypes(op, shape_layout, dtype, affine):
    shape, layout = shape_layout
    check(cases.make_case(op, shape, dtype, layout=layout, affine=affine), "triton")


@pytest.mark.skipif(not ON_GPU, reason="large shapes need a GPU (the interpreter runs ~1 ms per program)")
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(4096, 128), (512, 4096), (64, 32768), (8, 131072), (3, 100003)])
def test_gpu_large_shapes(op, dtype, shape):
    event = check(cases.make_case(op, shape, dtype), "triton")
    assert event.device.startswith("cuda")


# The large GPU shapes' code paths at interpreter sizes: each shape's row length (so the same
# variant, block and number of loop chunks, ragged last chunk included) with few rows; and the
# narrow-row shape with a row count that leaves the last multirow block ragged.
LARGE_SHAPE_TWINS = [(37, 128), (3, 4096), (2, 32768), (2, 131072), (3, 100003)]


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", LARGE_SHAPE_TWINS)
def test_large_shape_paths_with_few_rows(op, dtype, shape):
    event = check(cases.make_case(op, shape, dtype), "triton")
    assert event.variant == expected_variant(shape[-1], dtype)
