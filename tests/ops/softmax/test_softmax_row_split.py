"""The row_split softmax variant (one row across several programs, (max, sum) pairs exchanged)
against the float64 oracle and torch's special values: small blocks force several segments per
row, ragged last segments, segments that are all -inf, strided rows. It is off by default."""
import pytest
import torch

import opforge
from opforge.ops.softmax import cases, reference, row_split
from opforge.ops.softmax.problem import FEW_ROWS, OPS, prepare
from opforge.runtime import registry
from opforge.runtime.policy import backend as force_backend
from opforge.testing import DEVICE, TOLERANCE, max_rel_error


def run(op, x, block, warps=4, tickets=True):
    return row_split.launch_row_split(prepare(op, x, -1), block, warps, tickets)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape,block", [((3, 100), 32), ((2, 3, 70), 64), ((1, 77), 16), ((5, 256), 64),
                                         ((2, 300), 8)])
def test_segments_match_float64(op, dtype, shape, block):
    x = cases.random_logits(shape, dtype, DEVICE)
    out = run(op, x, block)
    assert out.shape == x.shape and out.dtype == dtype
    assert max_rel_error(out, reference.run(op, x.double())) <= TOLERANCE[dtype]


@pytest.mark.parametrize("op", OPS)
def test_segments_numbered_by_program_id(op):
    x = cases.random_logits((3, 100), torch.bfloat16, DEVICE)
    out = run(op, x, 32, tickets=False)
    assert max_rel_error(out, reference.run(op, x.double())) <= TOLERANCE[torch.bfloat16]


@pytest.mark.parametrize("op", OPS)
def test_strided_rows_and_huge_logits(op):
    x = cases.random_logits((5, 90), torch.bfloat16, DEVICE, layout="strided")
    assert max_rel_error(run(op, x, 32), reference.run(op, x.double())) <= TOLERANCE[torch.bfloat16]
    x = cases.random_logits((3, 130), torch.float32, DEVICE, scale=1e4)
    assert max_rel_error(run(op, x, 32), reference.run(op, x.double())) <= TOLERANCE[torch.float32]


@pytest.mark.parametrize("op", OPS)
def test_special_logits_follow_torch(op):
    n = 96
    x = cases.random_logits((6, n), torch.float32, DEVICE, scale=3.0)
    x[0, :64] = float("-inf")                     # whole segments of -inf: they add nothing
    x[1] = float("-inf")                          # all -inf -> NaN, as torch
    x[2, :n - 1] = float("-inf")                  # one finite entry, in the last segment -> 1 and 0
    x[3, 40] = float("nan")                       # NaN anywhere -> the whole row NaN
    x[4] = 0.0                                    # uniform row
    x[5, 70:] -= 300.0                            # a segment far below the row's maximum
    out = run(op, x, 32).double()
    ref = reference.run(op, x.double())
    assert torch.equal(torch.isnan(out), torch.isnan(ref))
    assert torch.equal(out == float("-inf"), ref == float("-inf"))
    finite = torch.isfinite(ref)
    assert max_rel_error(out[finite], ref[finite]) <= TOLERANCE[torch.float32]


def test_counters_are_back_to_zero_after_each_launch():
    x = cases.random_logits((6, 100), torch.float32, DEVICE)
    for _ in range(2):
        run("softmax", x, 16)
        assert int(row_split.WORKSPACE.counters(x.device, 6).abs().sum()) == 0


def test_off_by_default_and_on_from_the_table(monkeypatch):
    x = cases.random_logits((FEW_ROWS + 1, 4096), torch.float32, DEVICE)
    problem = prepare("softmax", x, -1).problem
    assert "not measured" in row_split.supports_row_split(problem)
    monkeypatch.setattr(row_split, "ROW_SPLIT", {("softmax", 4, 4096): (1024, 4)})
    row_split.row_split_config.cache_clear()
    registry.clear_cache()
    try:
        with force_backend("triton"), opforge.trace() as t:
            y = opforge.softmax(x, -1)
        assert t[0].variant == "row_split"
        assert max_rel_error(y, reference.run("softmax", x.double())) <= TOLERANCE[torch.float32]
        few = prepare("softmax", x[:FEW_ROWS], -1).problem  # few rows: split's many segments instead
        assert "few" in row_split.supports_row_split(few)
    finally:
        monkeypatch.undo()
        row_split.row_split_config.cache_clear()
        registry.clear_cache()


def test_too_many_segments_is_refused():
    x = cases.random_logits((1, 100), torch.float32, DEVICE)
    with pytest.raises(ValueError, match="segments"):
        run("softmax", x, 1, 1)
