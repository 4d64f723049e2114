"""Every variant of softmax and log_softmax against the float64 oracle, on fresh random data,
including huge and -inf logits, strided rows and dims other than the last."""
import pytest
import torch
from hypothesis import given, strategies as st

import opforge
from opforge.ops.softmax import cases, log_softmax, reference, softmax, triton_kernels as tk
from opforge.ops.softmax.problem import FEW_ROWS, OPS, prepare
from opforge.testing import DEVICE, ON_GPU, TOLERANCE, check_case, max_rel_error, shapes_and_layouts

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
PUBLIC = {"softmax": softmax, "log_softmax": log_softmax}
MULTIROW = tk.MULTIROW_MAX_N


def row_limit(dtype: torch.dtype) -> int:
    return tk.ROW_MAX_N[dtype.itemsize]


def expected_variant(rows: int, n: int, dtype: torch.dtype) -> str:
    if n <= MULTIROW:
        return "multirow"
    if n <= row_limit(dtype):
        return "row"
    return "split" if rows <= FEW_ROWS else "looped"


def check(case, backend: str = "triton"):
    event, args, out = check_case(case, backend)
    assert out.shape == args[0].shape and out.dtype == args[0].dtype
    return event


def assert_like_reference(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    """NaN and +-inf exactly where the float64 reference has them; finite values within tolerance."""
    out64 = out.detach().cpu().double()
    ref = ref.detach().cpu()
    assert torch.equal(torch.isnan(out64), torch.isnan(ref)), "NaN positions differ from torch"
    assert torch.equal(out64 == float("inf"), ref == float("inf")), "+inf positions differ"
    assert torch.equal(out64 == float("-inf"), ref == float("-inf")), "-inf positions differ"
    finite = torch.isfinite(ref)
    if finite.any():
        assert max_rel_error(out64[finite], ref[finite]) <= TOLERANCE[dtype]


# Each variant's boundaries: N=1, N off the block size, multirow's limit on both sides, one row,
# many rows, a block of rows that does not divide the row count.
EDGE_SHAPES = [(1, 1), (5, 3), (3, 77), (2, 1000), (1, MULTIROW), (2, MULTIROW + 1), (40, 96), (2, 3, 130)]


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", EDGE_SHAPES)
def test_triton_edge_shapes(op, dtype, shape):
    event = check(cases.make_case(op, shape, dtype))
    rows = 1
    for d in shape[:-1]:
        rows *= d
    assert event.variant == expected_variant(rows, shape[-1], dtype)
    assert event.note == ""


@pytest.fixture
def few_rows_is_2(monkeypatch):
    """Make 3 rows count as "many" (the looped variant), so the interpreter walks 3 rows, not 97."""
    from opforge.ops.softmax import problem
    from opforge.runtime import registry

    monkeypatch.setattr(problem, "FEW_ROWS", 2)
    registry.clear_cache()
    yield
    registry.clear_cache()


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_row_split_and_looped_boundaries(op, dtype):
    limit = row_limit(dtype)
    for shape in [(1, limit), (2, limit + 1)]:
        event = check(cases.make_case(op, shape, dtype))
        assert event.variant == expected_variant(shape[0], shape[1], dtype), shape


@pytest.mark.parametrize("op", OPS)
def test_many_long_rows_are_looped(op, few_rows_is_2):
    event = check(cases.make_case(op, (3, row_limit(torch.bfloat16) + 3), torch.bfloat16))
    assert event.variant == "looped"


@pytest.mark.parametrize("op", OPS)
def test_very_long_row_split(op):
    # N = 262144 logits in one row (an LLM vocabulary): split across programs.
    event = check(cases.make_case(op, (1, 262144), torch.bfloat16))
    assert event.variant == "split"


LAUNCHERS = {
    "multirow": lambda call: tk.launch_multirow(call),
    "row": lambda call: tk.launch_row(call),
    "looped": lambda call: tk.launch_looped(call, chunk=64, cols=16),                 # 4 x 16 tiles
    "looped-no-prefetch": lambda call: tk.launch_looped(call, chunk=64, cols=32, prefetch=False),
    "looped-1-program": lambda call: tk.launch_looped(call, chunk=32, ctas_per_sm=1),  # 1 x 32 tiles
    "split": lambda call: tk.launch_split(call, chunk=32, cols=8),
    "split-3": lambda call: tk.launch_split(call, chunk=16, splits=3, prefetch=False),
}


def run_variant(name: str, op: str, x: torch.Tensor) -> torch.Tensor:
    call = prepare(op, x, -1)
    if name == "multirow" and call.problem.n > MULTIROW:
        pytest.skip("multirow takes N <= 1024")
    return LAUNCHERS[name](call)


@pytest.mark.parametrize("variant", list(LAUNCHERS))
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_each_variant_on_many_chunks(variant, op, dtype):
    # Small chunks force the looped and split walks through many steps, partial last steps and
    # (for split) segments that end mid-row; rows > programs exercises the persistent loop.
    for shape in [(13, 200), (3, 500), (1, 77)]:
        x = cases.random_logits(shape, dtype, DEVICE)
        out = run_variant(variant, op, x)
        err = max_rel_error(out, reference.run(op, x.double()))
        assert err <= TOLERANCE[dtype], f"{variant} {shape}: {err:.2e}"


@pytest.mark.parametrize("variant", list(LAUNCHERS))
@pytest.mark.parametrize("op", OPS)
def test_special_logits_follow_torch(variant, op):
    n = 300
    x = cases.random_logits((7, n), torch.float32, DEVICE, scale=3.0)
    x[0] *= 1e4                                   # exp would overflow without the max subtracted
    x[1] = x[1] * 1e4 - 1e30                      # hugely negative, still finite
    x[2, ::3] = float("-inf")                     # -inf entries -> 0 (softmax), -inf (log_softmax)
    x[3] = float("-inf")                          # all -inf -> NaN, as torch
    x[4, :n - 1] = float("-inf")                  # one finite entry -> 1 and 0
    x[5, 17] = float("nan")                       # NaN anywhere -> the whole row NaN
    x[6] = 0.0                                    # uniform row
    out = run_variant(variant, op, x)
    torch_out = getattr(torch, op)(x.cpu(), dim=-1)
    assert torch.equal(torch.isnan(out.cpu()), torch.isnan(torch_out))
    assert_like_reference(out, reference.run(op, x.double()), torch.float32)


@pytest.mark.parametrize("op", OPS)
def test_plus_inf_follows_torch(op):
    x = torch.tensor([[0.0, float("inf"), 1.0], [1.0, 2.0, 3.0]], device=DEVICE)
    with opforge.backend("triton"):
        out = PUBLIC[op](x)
    assert torch.equal(torch.isnan(out.cpu()), torch.isnan(getattr(torch, op)(x.cpu(), dim=-1)))


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_extremes(op, dtype):
    # The largest finite half values: the max subtraction keeps them finite.
    big = torch.finfo(dtype).max
    x = torch.tensor([[big, -big, 0.0, big], [-big, -big, -big, -big]], dtype=dtype, device=DEVICE)
    with opforge.backend("triton"):
        out = PUBLIC[op](x)
    # log_softmax's -2 * max overflows the half type: compare with the oracle rounded to it
    assert_like_reference(out, reference.run(op, x.double()).to(dtype).double(), dtype)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_torch_path(op, dtype):
    for shape in [(1, 1), (3, 77), (2, 3, 1500)]:
        event = check(cases.make_case(op, shape, dtype), "torch")
        assert event.variant == "reference"


@pytest.mark.parametrize("op", OPS)
def test_float64_runs_on_torch_path_exactly(op):
    x = torch.randn(3, 50, dtype=torch.float64, device=DEVICE)
    with opforge.backend("torch"):
        out = PUBLIC[op](x)
    assert max_rel_error(out, getattr(torch, op)(x, dim=-1)) < 1e-12


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n", [77, 1500, 40000])
def test_strided_rows_run_in_place(op, dtype, n):
    event = check(cases.make_case(op, (2, 3, n), dtype, layout="strided"))
    assert event.note == "", "strided rows must be read in place, not copied"


def test_strided_rows_looped_in_place():
    big = torch.randn(2, 16, 300, device=DEVICE)
    x = big[:, ::2, :250]
    call = prepare("softmax", x, -1)
    assert call.note == "" and call.x.tensor.data_ptr() == x.data_ptr()
    out = tk.launch_looped(call, chunk=64)
    assert max_rel_error(out, reference.softmax(x.double())) <= 1e-5


@pytest.mark.parametrize("op", OPS)
def test_non_contiguous_last_dim_is_copied_and_traced(op):
    event = check(cases.make_case(op, (3, 40), torch.float32, layout="transposed"))
    assert "copied" in event.note and "last dimension" in event.note


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dim", [0, 1, -2])
def test_dim_other_than_last(op, dim):
    case = cases.make_case(op, (4, 5, 33), torch.float32, dim=dim)
    event = check(case)
    assert f"softmax over dim {dim % 3}" in event.note


def test_dim_last_given_positively_is_not_copied():
    x = torch.randn(4, 5, 33, device=DEVICE)
    with opforge.backend("triton"), opforge.trace() as t:
        y = opforge.ops.softmax.softmax(x, dim=2)
    assert t[0].note == ""
    assert max_rel_error(y, torch.softmax(x, dim=2)) < 1e-6


def test_three_level_strides_are_copied_and_traced():
    big = torch.randn(4, 6, 5, 40, device=DEVICE)
    x = big[::2, ::2, ::2, :33]
    with opforge.backend("triton"), opforge.trace() as t:
        y = softmax(x)
    assert "two strides" in t[0].note
    assert max_rel_error(y, reference.softmax(x.double())) < 1e-5


@given(op=st.sampled_from(OPS), shape_layout=shapes_and_layouts(2100), dtype=st.sampled_from(DTYPES),
       use_dim=st.booleans(), scale=st.sampled_from([1.0, 30.0]))
def test_random_shapes_strides_dtypes(op, shape_layout, dtype, use_dim, scale):
    shape, layout = shape_layout
    dim = 0 if use_dim and len(shape) > 1 else -1
    check(cases.make_case(op, shape, dtype, layout=layout, dim=dim, scale=scale))


@pytest.mark.skipif(not ON_GPU, reason="large shapes need a GPU (the interpreter runs ~1 ms per program)")
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(262144, 128), (4096, 1024), (512, 4096), (64, 32768), (256, 65536),
                                   (3, 100003), (1, 1048576), (16, 262144)])
def test_gpu_large_shapes(op, dtype, shape):
    event = check(cases.make_case(op, shape, dtype))
    assert event.device.startswith("cuda")
    assert event.variant == expected_variant(shape[0], shape[1], dtype)


# The large GPU shapes' code paths at interpreter sizes: each shape's row length with few rows
# (3 rows count as many for the looped shape, as 256 do on the GPU), so the same variant, block,
# chunks and segments run; the narrow-row shapes with a ragged last multirow block.
LARGE_SHAPE_TWINS = [((37, 128), False), ((9, 1024), False), ((3, 4096), False), ((2, 32768), False),
                     ((3, 65536), True), ((3, 40003), False)]   # split: (3, 100003) walks the same path


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape, many", LARGE_SHAPE_TWINS, ids=[f"{s[0]}x{s[1]}" for s, _ in LARGE_SHAPE_TWINS])
def test_large_shape_paths_with_few_rows(op, dtype, shape, many, request):
    if many:
        request.getfixturevalue("few_rows_is_2")
    event = check(cases.make_case(op, shape, dtype))
    assert event.variant == ("looped" if many else expected_variant(shape[0], shape[1], dtype))
