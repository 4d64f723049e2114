"""softmax / log_softmax on the torch path: torch's own functions for float32 and half inputs,
the careful forms for float64, and the CPU plans."""
import pytest
import torch

import opforge
from opforge.ops.softmax import reference
from opforge.ops.softmax.problem import PLANS
from opforge.runtime import plans
from opforge.testing import TOLERANCE, rel_error


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_fast_form_matches_the_careful_oracle(op, dtype):
    x = (10 * torch.randn(5, 1000)).to(dtype)
    out = reference.fast_function(op)(x)
    ref = reference.careful_run(op, x.double())
    assert out.dtype == dtype and rel_error(out, ref) <= TOLERANCE[dtype]
    assert torch.equal(reference.run(op, x), out)
    assert torch.equal(reference.run(op, x.double()), ref)


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_a_repeated_cpu_call_runs_the_torch_plan(op):
    if not plans.enabled():
        pytest.skip("launch plans are off (OPFORGE_PLANS=0)")
    x = torch.randn(1, 49152)
    fn = getattr(opforge, op)
    PLANS.clear()
    first = fn(x)
    assert len(PLANS) == 1
    second = fn(x)
    assert torch.equal(first, second)
    assert rel_error(second, reference.careful_run(op, x.double())) <= TOLERANCE[torch.float32]
    assert len(PLANS) == 1 and fn(x, dim=0).shape == x.shape   # another dim: the general path
