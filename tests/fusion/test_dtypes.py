"""The promotion rules against torch.result_type, and the eager math functions."""
import itertools
import math

import pytest
import torch

from opforge.fusion import abs as fabs, cast, erf, exp, log, maximum, minimum, pow as fpow, rsqrt, sigmoid, sqrt, \
    tanh, where
from opforge.fusion.dtypes import DIM, SUPPORTED, WRAPPED, ZERO_DIM, result_dtype
from opforge.fusion.scalar_math import evaluate

SAMPLES = {DIM: lambda d: torch.zeros(2, dtype=d), ZERO_DIM: lambda d: torch.zeros((), dtype=d)}
NUMBERS = [True, 3, 2.5]


def test_result_dtype_matches_torch():
    operands = [(d, tier) for d in SUPPORTED for tier in (DIM, ZERO_DIM)]
    operands += [(n, WRAPPED) for n in NUMBERS]
    for (a, ta), (b, tb) in itertools.product(operands, repeat=2):
        if ta == WRAPPED and tb == WRAPPED:
            continue
        va = a if ta == WRAPPED else SAMPLES[ta](a)
        vb = b if tb == WRAPPED else SAMPLES[tb](b)
        da = a if ta != WRAPPED else {bool: torch.bool, int: torch.int64, float: torch.float32}[type(a)]
        db = b if tb != WRAPPED else {bool: torch.bool, int: torch.int64, float: torch.float32}[type(b)]
        assert result_dtype([(da, ta), (db, tb)]) == torch.result_type(va, vb), (a, ta, b, tb)


def test_eager_functions_call_torch():
    x = torch.randn(5, 7)
    assert torch.equal(exp(x), torch.exp(x)) and torch.equal(log(x.abs()), torch.log(x.abs()))
    assert torch.equal(sqrt(x.abs()), x.abs().sqrt()) and torch.equal(rsqrt(x.abs()), x.abs().rsqrt())
    assert torch.equal(tanh(x), x.tanh()) and torch.equal(erf(x), x.erf()) and torch.equal(sigmoid(x), x.sigmoid())
    assert torch.equal(fabs(x), x.abs()) and torch.equal(fpow(x, 2), x ** 2)
    assert torch.equal(minimum(x, x.t()[:1].t()), torch.minimum(x, x[:, :1]))
    assert torch.equal(maximum(x, 0.5), x.clamp(min=0.5)) and torch.equal(minimum(0.5, x), x.clamp(max=0.5))
    assert maximum(torch.ones(2, dtype=torch.bfloat16), 0.3).dtype == torch.bfloat16
    assert maximum(torch.ones(2, dtype=torch.int32), 0.5).dtype == torch.float32
    assert torch.equal(where(x > 0, x, 0.0), torch.where(x > 0, x, 0.0))
    assert cast(x, torch.int32).dtype == torch.int32


def test_eager_functions_on_numbers():
    assert exp(0.0) == 1.0 and log(0.0) == -math.inf and math.isnan(log(-1.0)) and exp(1000.0) == math.inf
    assert sqrt(4) == 2.0 and rsqrt(0.0) == math.inf and tanh(0.0) == 0.0 and sigmoid(0.0) == 0.5
    assert erf(0.0) == 0.0 and fabs(-2) == 2 and minimum(1, 2) == 1 and maximum(1.0, 2.5) == 2.5
    assert math.isnan(minimum(float("nan"), 1.0)) and where(True, 1, 2) == 1 and fpow(2, 10) == 1024
    with pytest.raises(TypeError):
        exp("x")


@pytest.mark.parametrize("op", ["exp", "log", "sqrt", "rsqrt", "tanh", "erf", "sigmoid", "abs", "neg"])
def test_scalar_math_matches_torch_float64(op):
    for v in [0.0, -0.0, 1.5, -1.5, 1e-30, 700.0, -700.0, float("inf"), -float("inf"), float("nan")]:
        got = evaluate(op, (v,))
        fn = {"abs": torch.abs, "neg": torch.neg}.get(op) or getattr(torch, op)
        want = fn(torch.tensor(v, dtype=torch.float64)).item()
        assert (math.isnan(got) and math.isnan(want)) or got == pytest.approx(want, rel=1e-12, abs=0), (op, v)
