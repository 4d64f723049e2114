"""The row_split norm variant (one row across several programs, partial sums exchanged) against
the float64 oracle: small blocks force several segments per row, ragged last segments, strided
rows, rows with a large mean, and segments whose means differ widely. It is off by default."""
import pytest
import torch

import opforge
from opforge.ops.norm import cases, row_split
from opforge.ops.norm.problem import OPS, prepare
from opforge.runtime import registry
from opforge.runtime.policy import backend as force_backend
from opforge.testing import DEVICE, TOLERANCE, max_rel_error

EPS = {"layer_norm": 1e-5, "rms_norm": 1e-6, "add_layer_norm": 1e-5, "add_rms_norm": 1e-6}


def run(op, args, kwargs, block, warps=4, tickets=True):
    x = args[0]
    call = prepare(op, x, args[1] if len(args) > 1 else None, kwargs.get("weight"), kwargs.get("bias"), EPS[op])
    out = row_split.launch_row_split(call, block, warps, tickets)
    return tuple(o.view(x.shape) for o in out) if isinstance(out, tuple) else out.view(x.shape)


def assert_close(op, case, out, ref, dtype):
    if op.startswith("add_"):  # y against the norm of the stored sum, the sum against the exact one
        ref = cases.judge_by_stored_sum(op, *case, out)
    assert max_rel_error(out, ref) <= TOLERANCE[dtype]


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape,block", [((3, 100), 32), ((2, 3, 70), 64), ((1, 77), 16), ((4, 256), 64),
                                         ((2, 300), 8)])
def test_segments_match_float64(op, dtype, shape, block):
    c = cases.make_case(op, shape, dtype)
    args, kwargs = c.make(DEVICE)
    out = run(op, args, kwargs, block)
    assert_close(op, (args, kwargs), out, c.oracle(args, kwargs), dtype)


@pytest.mark.parametrize("op", OPS)
def test_segments_numbered_by_program_id(op):
    c = cases.make_case(op, (3, 100), torch.bfloat16)
    args, kwargs = c.make(DEVICE)
    out = run(op, args, kwargs, 32, tickets=False)
    assert_close(op, (args, kwargs), out, c.oracle(args, kwargs), torch.bfloat16)


@pytest.mark.parametrize("op", OPS)
def test_strided_rows_and_no_affine(op):
    c = cases.make_case(op, (5, 90), torch.bfloat16, layout="strided", affine=False)
    args, kwargs = c.make(DEVICE)
    out = run(op, args, kwargs, 32)
    assert_close(op, (args, kwargs), out, c.oracle(args, kwargs), torch.bfloat16)


@pytest.mark.parametrize("op", ["layer_norm", "add_layer_norm"])
@pytest.mark.parametrize("offset", [1e3, 1e4])
def test_large_mean_small_spread_keeps_float32_precision(op, offset):
    c = cases.make_case(op, (3, 200), torch.float32, offset=offset)
    args, kwargs = c.make(DEVICE)
    out = run(op, args, kwargs, 32)
    assert_close(op, (args, kwargs), out, c.oracle(args, kwargs), torch.float32)


def test_segments_with_far_apart_means():
    # the first segment near 0, the others near 1e4 (+ a spread of 1): the combined variance is
    # dominated by the means' spread, and each segment's own shift keeps its sums exact
    x = torch.randn(2, 160, dtype=torch.float32, device=DEVICE)
    x[:, 40:] += 1e4
    x[1, 80:120] -= 2e4
    c = cases.make_case("layer_norm", (2, 160), torch.float32)
    out = run("layer_norm", (x,), {}, 32)
    assert max_rel_error(out, c.oracle((x,), {})) <= TOLERANCE[torch.float32]


def test_counters_are_back_to_zero_after_each_launch():
    c = cases.make_case("rms_norm", (6, 100), torch.float32)
    args, kwargs = c.make(DEVICE)
    for _ in range(2):
        run("rms_norm", args, kwargs, 16)
        counters = row_split.WORKSPACE.counters(args[0].device, 6)
        assert int(counters.abs().sum()) == 0


def test_off_by_default_and_on_from_the_table(monkeypatch):
    x = torch.randn(row_split.MIN_ROWS, 4096, dtype=torch.float32, device=DEVICE)
    problem = prepare("rms_norm", x, None, None, None, 1e-6).problem
    assert "not measured" in row_split.supports_row_split(problem)
    monkeypatch.setattr(row_split, "ROW_SPLIT", {("rms_norm", 4, 4096): (2048, 4)})
    row_split.row_split_config.cache_clear()
    registry.clear_cache()
    try:
        with force_backend("triton"), opforge.trace() as t:
            y = opforge.rms_norm(x)
        assert t[0].variant == "row_split"
        ref = x.double() * torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-6)
        assert max_rel_error(y, ref) <= TOLERANCE[torch.float32]
        few = prepare("rms_norm", x[:2], None, None, None, 1e-6).problem  # few rows: the launch plans' variants
        assert "rows <" in row_split.supports_row_split(few)
    finally:
        monkeypatch.undo()
        row_split.row_split_config.cache_clear()
        registry.clear_cache()


def test_too_many_segments_is_refused():
    x = torch.randn(1, 100, dtype=torch.float32, device=DEVICE)
    call = prepare("rms_norm", x, None, None, None, 1e-6)
    with pytest.raises(ValueError, match="segments"):
        row_split.launch_row_split(call, 1, 1)
