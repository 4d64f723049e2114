"""Every Metal softmax / log_softmax variant, run in the MSL emulator, against the float64 oracle.

The kernels are the unchanged src/opforge/ops/softmax/softmax.metal, called through the public
API (``opforge.backend("metal")`` with ``OPFORGE_METAL_EMULATE=1``) or, to reach each variant at
every size it supports, through its launcher.
"""
import pytest
import torch

import opforge
from opforge.ops.softmax import cases, reference
from opforge.ops.softmax import metal as softmax_metal
from opforge.ops.softmax.problem import OPS, prepare
from opforge.testing import TOLERANCE, max_rel_error

pytestmark = pytest.mark.usefixtures("emulate")

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
VARIANTS = ("multirow", "row", "looped")
SIZES = {
    "multirow": (1, 31, 33, softmax_metal.MULTIROW_MAX_N),
    "row": (1, 77, softmax_metal.MULTIROW_MAX_N + 1, softmax_metal.ROW_MAX_N),
    "looped": (1, 1000, softmax_metal.ROW_MAX_N + 1),
}
ROWS = {"multirow": 11, "row": 2, "looped": 2}


def expected_variant(n):
    if n <= softmax_metal.MULTIROW_MAX_N:
        return "multirow"
    return "row" if n <= softmax_metal.ROW_MAX_N else "looped"


def check(op, shape, dtype, variant=None, **kw):
    case = cases.make_case(op, shape, dtype, **kw)
    args, kwargs = case.make("cpu")
    event = None
    if variant is None:
        with opforge.backend("metal"), opforge.trace() as t:
            out = case.call(*args, **kwargs)
        assert len(t) == 1 and t[0].backend == "metal" and t[0].op == op, list(t)
        event = t[0]
    else:
        out = getattr(softmax_metal, f"launch_{variant}")(prepare(op, args[0], kwargs.get("dim", -1)))
    err = max_rel_error(out, case.oracle(args, kwargs))
    assert err <= TOLERANCE[dtype], f"{op} {variant} {case.label} {dtype}: rel err {err:.3e}"
    return event


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", OPS)
def test_each_variant_at_each_size(op, dtype, variant):
    for n in SIZES[variant]:
        check(op, (ROWS[variant], n), dtype, variant=variant)


@pytest.mark.parametrize("op", OPS)
def test_public_api_picks_the_variant_by_row_length(op):
    for n in (1, 256, 257, 4096, 4097):
        event = check(op, (2, n), torch.float16)
        assert event.variant == expected_variant(n), n
        assert event.note == "" and event.device == "cpu"


@pytest.mark.parametrize("op", OPS)
def test_strided_rows_run_in_place(op):
    for n in (77, 1500, 4500):
        event = check(op, (2, 3, n), torch.bfloat16, layout="strided")
        assert event.note == "", "strided rows must be read in place, not copied"


@pytest.mark.parametrize("op", OPS)
def test_dim_other_than_last_and_huge_logits(op):
    event = check(op, (8, 33), torch.float16, dim=0)
    assert "copied" in event.note
    check(op, (3, 300), torch.float32, scale=1e4)


def _with_special_rows(n, dtype):
    x = torch.randn(4, n, dtype=dtype) * 4
    x[0, ::3] = -float("inf")          # some -inf entries
    x[1] = -float("inf")               # an all -inf row: NaN, as torch
    x[2, n // 2] = float("nan")        # NaN anywhere: the whole row is NaN
    x[3, n - 1] = float("inf")         # +inf: the whole row is NaN too (inf - inf)
    return x


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("variant", VARIANTS)
def test_inf_and_nan_rows_match_torch(op, variant):
    for n in SIZES[variant][1:]:
        x = _with_special_rows(n, torch.float32)
        y = getattr(softmax_metal, f"launch_{variant}")(prepare(op, x, -1))
        want = getattr(torch, op)(x, dim=-1)
        assert torch.equal(torch.isnan(y), torch.isnan(want)), (n, variant)
        assert torch.equal(torch.isneginf(y), torch.isneginf(want)), (n, variant)
        assert torch.isnan(y[1:]).all()
        ok = ~torch.isnan(want) & torch.isfinite(want)
        ref = reference.run(op, x.double())
        # Norm-relative, as everywhere: an element-wise rtol would demand more than float32 has
        # where log_softmax cancels to near zero ((x - max) - log(sum) with both terms ~1).
        err = max_rel_error(y[ok], ref[ok])
        assert err <= TOLERANCE[torch.float32], (n, variant, err)


def test_float64_is_refused_clearly():
    with opforge.backend("metal"), pytest.raises(opforge.NoKernelError, match="float64 runs on the torch path"):
        opforge.softmax(torch.randn(3, 16, dtype=torch.float64))


def test_kernels_without_bfloat_before_metal_3_1():
    from metal_emu import _build, _source
    source = softmax_metal.SOURCE.read_text()
    names = {k.name for k in _source.find_kernels(_build._preprocess(_build.compiler(), source, "softmax.metal", 300))}
    assert "log_softmax_row_half" in names and not any("bfloat" in n for n in names)
    assert len(names) == 2 * 3 * 2


def test_reverse_schedule_gives_the_same_results():
    import metal_emu
    with metal_emu.schedule("reverse"):
        for op in OPS:
            for n in (40, 1000, 4500):
                check(op, (3, n), torch.float32)
