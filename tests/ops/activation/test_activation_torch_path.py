"""The activations' torch path: PyTorch's own functions (F.silu, F.gelu, torch.relu, and their
gated products) for float32 and half inputs, the careful forms for float64, and the CPU plans."""
import pytest
import torch

import opforge
from opforge.ops.activation import reference
from opforge.ops.activation.problem import OPS, PLANS
from opforge.runtime import plans
from opforge.testing import TOLERANCE, rel_error

CASES = [(op, a) for op in OPS for a in ((None, "tanh") if op in ("gelu", "geglu") else (None,))]


@pytest.mark.parametrize("op,approximate", CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_fast_form_matches_the_careful_oracle(op, approximate, dtype):
    x, up = (4 * torch.randn(7, 300)).to(dtype), torch.randn(7, 300).to(dtype)
    gated = op in ("swiglu", "geglu")
    out = reference.fast_function(op, approximate)(x, up if gated else None)
    ref = reference.careful_run(op, x.double(), up.double() if gated else None, approximate)
    assert out.dtype == dtype and rel_error(out, ref) <= TOLERANCE[dtype]
    # run() takes the fast form for this dtype and the careful one for float64
    assert torch.equal(reference.run(op, x, up if gated else None, approximate), out)
    assert torch.equal(reference.run(op, x.double(), up.double() if gated else None, approximate), ref)


@pytest.mark.parametrize("op,approximate", CASES)
def test_a_repeated_cpu_call_runs_the_torch_plan(op, approximate):
    if not plans.enabled():
        pytest.skip("launch plans are off (OPFORGE_PLANS=0)")
    x, up = torch.randn(1, 1536), torch.randn(1, 1536)
    fn = getattr(opforge, op)
    args = (x, up) if op in ("swiglu", "geglu") else (x,)
    kwargs = {"approximate": approximate} if approximate else {}
    PLANS.clear()
    first = fn(*args, **kwargs)
    assert len(PLANS) == 1
    second = fn(*args, **kwargs)
    ref = reference.careful_run(op, x.double(), up.double() if len(args) == 2 else None, approximate or "none")
    assert torch.equal(first, second) and rel_error(second, ref) <= TOLERANCE[torch.float32]


def test_no_plan_for_float64_and_a_bad_approximate_is_still_named():
    PLANS.clear()
    opforge.silu(torch.randn(3, dtype=torch.float64))
    assert len(PLANS) == 0
    x = torch.randn(4)
    opforge.gelu(x)
    opforge.gelu(x)
    with pytest.raises(ValueError, match="approximate"):
        opforge.gelu(x, approximate="fast")
