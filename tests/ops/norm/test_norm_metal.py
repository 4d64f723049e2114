"""Every Metal norm variant, run in the MSL emulator, against the float64 oracle.

The kernels are the unchanged src/opforge/ops/norm/norm.metal; the tests call them through
the public API (``opforge.backend("metal")`` with ``OPFORGE_METAL_EMULATE=1``) or, to reach
each variant at every size it supports, through its launcher. Outputs are NaN-poisoned first
(tests/conftest.py), so an element a kernel forgets to write fails the check.
"""
import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

import opforge
from opforge.ops.norm import metal as norm_metal
from opforge.ops.norm import reference
from opforge.ops.norm.problem import OPS
from opforge.testing import max_rel_error, shapes_and_layouts

from metal_emu.checks import DTYPES, ROWS, SIZES, VARIANTS, expected_variant, run

pytestmark = pytest.mark.usefixtures("emulate")


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", OPS)
def test_each_variant_at_each_size(op, dtype, variant):
    for n in SIZES[variant]:
        run(op, (ROWS[variant], n), dtype, variant=variant)


@pytest.mark.parametrize("op", OPS)
def test_public_api_picks_the_variant_by_row_length(op):
    for n in (1, 3, 256, 257, 4096, 4097):
        event = run(op, (2, n), torch.float16)
        assert event.variant == expected_variant(n), n
        assert event.note == "" and event.device == "cpu" and event.dtype == "float16"


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_strided_rows_run_in_place(op, dtype):
    for n in (77, 1500, 5000):
        event = run(op, (2, 3, n), dtype, layout="strided")
        assert event.note == "", "strided rows must be read in place, not copied"


def test_views_of_a_3d_tensor_run_without_copy():
    big = torch.randn(4, 6, 130)
    for x in (big[::2], big[:, :, :100], big[1:, 2:5, 7:107], big[:, 1]):
        with opforge.backend("metal"), opforge.trace() as t:
            y, s = opforge.add_layer_norm(x, x.flip(0))
        assert t[0].note == "" and t[0].backend == "metal"
        total = x.double() + x.flip(0).double()
        assert max_rel_error((y, s), (reference.layer_norm(total), total)) < 1e-5


@pytest.mark.parametrize("op", OPS)
def test_non_contiguous_last_dim_is_copied_and_traced(op):
    event = run(op, (3, 40), torch.float32, layout="transposed")
    assert "copied" in event.note and "last dimension" in event.note


@pytest.mark.parametrize("op", OPS)
def test_no_weight_no_bias(op):
    for n in (5, 300, 4500):
        run(op, (3, n), torch.float32, affine=False)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_float32_weights_with_half_x(op, dtype):
    for n in (100, 700, 4200):
        run(op, (3, n), dtype, weight_dtype=torch.float32)


def test_weight_and_bias_of_different_dtypes():
    x = torch.randn(4, 96, dtype=torch.float16)
    w, b = torch.randn(96), torch.randn(96, dtype=torch.float16)
    with opforge.backend("metal"):
        y = opforge.layer_norm(x, w, b)
    assert max_rel_error(y, reference.layer_norm(x.double(), w.double(), b.double())) < 2e-3


@pytest.mark.parametrize("op", ["layer_norm", "add_layer_norm"])
@pytest.mark.parametrize("offset", [1e3, 1e4])
def test_large_mean_small_spread_has_no_cancellation(op, offset):
    for n in (77, 1500, 20000):
        run(op, (2, n), torch.float32, offset=offset, tol_scale=0.1)


@pytest.mark.parametrize("op", OPS)
def test_zero_rows_return_empty(op):
    x = torch.randn(0, 3, 32)
    with opforge.backend("metal"):
        out = opforge.add_layer_norm(x, x) if op == "add_layer_norm" else \
            opforge.add_rms_norm(x, x) if op == "add_rms_norm" else getattr(opforge, op)(x)
    outs = out if isinstance(out, tuple) else (out,)
    assert all(o.shape == (0, 3, 32) and o.dtype == x.dtype for o in outs)


def test_inputs_are_not_modified():
    x, r = torch.randn(3, 300), torch.randn(3, 300)
    x0, r0 = x.clone(), r.clone()
    with opforge.backend("metal"):
        opforge.add_layer_norm(x, r, torch.randn(300), torch.randn(300))
    assert torch.equal(x, x0) and torch.equal(r, r0)


def _bad_calls():
    x = torch.randn(4, 16)
    r = torch.randn(4, 16)
    return [
        ("layer_norm", (x,), dict(weight=torch.randn(15))),
        ("layer_norm", (x,), dict(bias=torch.randn(2, 16))),
        ("layer_norm", (x,), dict(weight=torch.ones(16, dtype=torch.int32))),
        ("rms_norm", (x,), dict(eps=-1e-5)),
        ("rms_norm", (x,), dict(eps=math.nan)),
        ("layer_norm", (x,), dict(eps="1e-5")),
        ("layer_norm", (torch.ones(4, 16, dtype=torch.int64),), {}),
        ("rms_norm", (torch.randn(4, 0),), {}),
        ("rms_norm", ([1.0, 2.0],), {}),
        ("add_rms_norm", (x, torch.randn(4, 8)), {}),
        ("add_rms_norm", (x, r.half()), {}),
        ("add_layer_norm", (x, None), {}),
        ("layer_norm", (x,), dict(weight=torch.randn(16, device="meta"))),
    ]


@pytest.mark.parametrize("index", range(len(_bad_calls())))
def test_bad_input_gets_the_same_error_as_on_the_other_backends(index):
    op, args, kwargs = _bad_calls()[index]
    errors = {}
    for backend in ("torch", "metal"):
        with opforge.backend(backend), pytest.raises((TypeError, ValueError)) as info:
            getattr(opforge, op)(*args, **kwargs)
        errors[backend] = (type(info.value), str(info.value))
    assert errors["metal"] == errors["torch"]


def test_float64_is_refused_clearly():
    with opforge.backend("metal"), pytest.raises(opforge.NoKernelError, match="float64 runs on the torch path"):
        opforge.rms_norm(torch.randn(3, 16, dtype=torch.float64))


def test_explain_shows_the_metal_choice():
    x = torch.randn(8, 4096, dtype=torch.float16)
    with opforge.backend("metal"):
        e = opforge.explain("layer_norm", x, torch.ones(4096, dtype=torch.float16))
    assert e.chosen.qualified_name == "metal.row"
    reasons = {v.qualified_name: r for v, r in e.rejected}
    assert reasons["metal.multirow"] == f"N=4096 > {norm_metal.MULTIROW_MAX_N}"
    assert "comes first" in reasons["metal.looped"]


def test_metal_needs_emulation_for_cpu_tensors(monkeypatch):
    from opforge.runtime import registry
    monkeypatch.delenv("OPFORGE_METAL_EMULATE")
    registry.clear_cache()
    with opforge.backend("metal"), pytest.raises(opforge.NoKernelError, match="OPFORGE_METAL_EMULATE"):
        opforge.layer_norm(torch.randn(2, 8))


def test_reverse_schedule_gives_the_same_results():
    import metal_emu
    with metal_emu.schedule("reverse"):
        for op in OPS:
            for n in (40, 1000, 4500):
                run(op, (3, n), torch.float32)


def test_kernels_without_bfloat_before_metal_3_1():
    from metal_emu import _build, _source
    source = norm_metal.SOURCE.read_text()
    names = {k.name for k in _source.find_kernels(_build._preprocess(_build.compiler(), source, "norm.metal", 300))}
    assert "layer_norm_row_half_float" in names and not any("bfloat" in n for n in names)
    assert len(names) == 4 * 3 * 3


@settings(max_examples=25)
@given(op=st.sampled_from(OPS), shape_layout=shapes_and_layouts(5000), dtype=st.sampled_from(DTYPES),
       affine=st.booleans())
def test_random_shapes_strides_dtypes(op, shape_layout, dtype, affine):
    shape, layout = shape_layout
    event = run(op, shape, dtype, layout=layout, affine=affine)
    assert event.variant == expected_variant(shape[-1])
