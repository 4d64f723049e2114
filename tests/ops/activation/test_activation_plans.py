"""Launch plans of the activations: a repeated call skips the general path and stays correct."""
import pytest
import torch

import opforge
from opforge.ops.activation import problem, reference, triton_kernels
from opforge.runtime import plans
from opforge.testing import DEVICE, ON_GPU, TOLERANCE, max_rel_error

needs_gpu = pytest.mark.skipif(not ON_GPU or plans._CHECKING_KEYS,
                               reason="plans need compiled kernels (a GPU) and no launch-key checks")
cpu_seams = pytest.mark.skipif(ON_GPU or plans._CHECKING_KEYS,
                               reason="fakes the interpreter's launch; on a GPU the *_equal_general_path_* "
                                      "tests check real launches")

CALLS = [("gelu", "none"), ("gelu", "tanh"), ("silu", None), ("relu", None), ("swiglu", None),
         ("geglu", "none"), ("geglu", "tanh")]


pytestmark = pytest.mark.usefixtures("plans_on")  # tests/conftest.py


def _call(op, approximate, x, up):
    fn = getattr(opforge, op)
    args = (x, up) if op in problem.GATED else (x,)
    return fn(*args, approximate=approximate) if approximate is not None else fn(*args)


def _inputs(op, shape, dtype=torch.float32):
    x = torch.randn(shape, device=DEVICE, dtype=dtype)
    return x, (torch.randn_like(x) if op in problem.GATED else None)


def _reference(op, approximate, x, up):
    return reference.run(op, x.double(), None if up is None else up.double(), approximate)


def test_signature_for_packed_inputs_and_strided_cpu_ones():
    x = torch.randn(4, 64)
    assert problem.signature("silu", x, None, None) == ("silu", None, x.shape, x.dtype, x.device)
    assert problem.signature("gelu", x, None, "tanh") == ("gelu", "tanh", x.shape, x.dtype, x.device)
    assert problem.signature("gelu", x, None, ["tanh"]) is None
    # on the CPU (torch plans call torch's functions) strided inputs have a signature with their
    # strides; the Triton variant offers plans only for packed ones (layout "flat")
    assert problem.signature("silu", x.t(), None, None)[-2:] == (x.t().stride(), None)
    assert problem.signature("swiglu", x, torch.randn(4, 128)[:, :64], None)[-2:] == ((64, 1), (128, 1))
    assert problem.signature("swiglu", x, torch.randn(4, 65), None) is None
    assert problem.signature("swiglu", x, x.half(), None) is None
    assert problem.signature("swiglu", x, "up", None) is None


@cpu_seams
@pytest.mark.parametrize("op,approximate", CALLS)
def test_a_plan_launches_what_the_general_path_launches(op, approximate, launch_log):
    launched, record = launch_log
    record((triton_kernels._pointwise,))
    with opforge.backend("triton"):
        x1, u1 = _inputs(op, (2, 3, 77))
        y1 = _call(op, approximate, x1, u1)
        x2, u2 = _inputs(op, (2, 3, 77))
        y2 = _call(op, approximate, x2, u2)
    assert max_rel_error(y1, _reference(op, approximate, x1, u1)) <= TOLERANCE[torch.float32]
    assert [kind for kind, _, _ in launched] == ["general", "plan"]
    (_, grid1, args1), (_, grid2, args2) = launched
    assert grid1 == grid2

    def pointers(x, u, y):
        return (x.data_ptr(), (u if u is not None else x).data_ptr(), y.data_ptr())
    assert args1[:3] == pointers(x1, u1, y1) and args2[:3] == pointers(x2, u2, y2)
    assert args1[3:] == args2[3:]
    assert y2.shape == x2.shape and y2.dtype == x2.dtype and y2.is_contiguous()


@cpu_seams
def test_no_plan_for_what_a_plan_cannot_repeat(launch_log):
    launched, record = launch_log
    record((triton_kernels._pointwise,))
    x = torch.randn(4, 40)
    with opforge.backend("triton"):
        for _ in range(2):
            opforge.silu(x.t())                                        # dense transposed: no plan
            opforge.swiglu(torch.randn(4, 80)[:, :40], torch.randn(4, 40))  # strided gate: no plan
        opforge.silu(x)
        opforge.silu(torch.randn(4 * 40 + 1)[1:].view(4, 40))          # unaligned: general path
        with pytest.raises(ValueError):
            opforge.gelu(x, approximate="fast")                        # errors as on the general path
    assert [kind for kind, _, _ in launched] == ["general"] * 6


@needs_gpu
@pytest.mark.parametrize("op,approximate", CALLS)
@pytest.mark.parametrize("shape", [(4, 3, 77), (8, 128, 768), (1, 1, 8192)])
def test_plan_outputs_equal_general_path_outputs(op, approximate, shape):
    x, u = _inputs(op, shape, torch.bfloat16)
    plans.set_enabled(False)
    general = _call(op, approximate, x, u)
    plans.set_enabled(True)
    for _ in range(2):
        _call(op, approximate, x, u)
    assert problem.signature(op, x, u, approximate) in problem.PLANS
    assert torch.equal(general, _call(op, approximate, x, u))
    x2, u2 = _inputs(op, shape, torch.bfloat16)
    assert max_rel_error(_call(op, approximate, x2, u2), _reference(op, approximate, x2, u2)) \
        <= TOLERANCE[torch.bfloat16]
