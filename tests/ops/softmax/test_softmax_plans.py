"""Launch plans of softmax and log_softmax: a repeated call skips the general path and stays correct."""
import threading

import pytest
import torch

import opforge
from opforge.ops.softmax import problem, reference, triton_kernels
from opforge.runtime import plans
from opforge.testing import DEVICE, ON_GPU, TOLERANCE, max_rel_error

needs_gpu = pytest.mark.skipif(not ON_GPU or plans._CHECKING_KEYS,
                               reason="plans need compiled kernels (a GPU) and no launch-key checks")
cpu_seams = pytest.mark.skipif(ON_GPU or plans._CHECKING_KEYS,
                               reason="fakes the interpreter's launch; on a GPU the *_equal_general_path_* "
                                      "tests check real launches")


pytestmark = pytest.mark.usefixtures("plans_on")  # tests/conftest.py


def _reference(op, x):
    return reference.run(op, x.double(), -1)


def test_signature_only_for_packed_last_dim():
    x = torch.randn(4, 64)
    assert problem.signature("softmax", x, -1) == ("softmax", x.shape, x.dtype, x.device)
    assert problem.signature("softmax", x, 1) == problem.signature("softmax", x, -1)
    assert problem.signature("softmax", x, 0) is None
    assert problem.signature("softmax", x[:, :32], -1) is None
    assert problem.signature("softmax", torch.tensor(1.0), -1) is None
    assert problem.signature("softmax", x, True) is None
    assert problem.signature("softmax", [1.0], -1) is None


@cpu_seams
@pytest.mark.parametrize("op", problem.OPS)
@pytest.mark.parametrize("shape", [(2, 3, 77), (2, 1500)])
def test_a_plan_launches_what_the_general_path_launches(op, shape, launch_log):
    launched, record = launch_log
    record((triton_kernels._tile, triton_kernels._looped))
    fn = getattr(opforge, op)
    with opforge.backend("triton"):
        x1 = torch.randn(shape) * 4
        y1 = fn(x1)
        x2 = torch.randn(shape) * 4
        y2 = fn(x2)
    assert max_rel_error(y1, _reference(op, x1)) <= TOLERANCE[torch.float32]
    assert [kind for kind, _, _ in launched] == ["general", "plan"]
    (_, grid1, args1), (_, grid2, args2) = launched
    assert grid1 == grid2
    assert args1[:2] == (x1.data_ptr(), y1.data_ptr()) and args2[:2] == (x2.data_ptr(), y2.data_ptr())
    assert args1[2:] == args2[2:]
    assert y2.shape == x2.shape and y2.dtype == x2.dtype


@cpu_seams
def test_no_plan_for_what_a_plan_cannot_repeat(launch_log):
    launched, record = launch_log
    record((triton_kernels._tile, triton_kernels._looped))
    x = torch.randn(3, 40)
    with opforge.backend("triton"):
        for _ in range(2):
            opforge.softmax(x, dim=0)                       # dim moved by a copy: no plan
            opforge.softmax(torch.randn(3, 80)[:, :40])      # strided rows: no plan
    assert [kind for kind, _, _ in launched] == ["general"] * 4
    # an unaligned x of a planned signature takes the general path
    with opforge.backend("triton"):
        opforge.softmax(torch.randn(3, 40))
        opforge.softmax(torch.randn(3 * 40 + 1)[1:].view(3, 40))
    assert [kind for kind, _, _ in launched][-2:] == ["general", "general"]


def _general_then_planned(fn, x):
    plans.set_enabled(False)
    general = fn(x)
    plans.set_enabled(True)
    fn(x)
    fn(x)
    return general, fn(x)


@needs_gpu
@pytest.mark.parametrize("op", problem.OPS)
@pytest.mark.parametrize("shape", [(4, 3, 77), (8, 2000), (128, 40000), (1, 1, 8192)])
def test_plan_outputs_equal_general_path_outputs(op, shape):
    x = torch.randn(shape, device=DEVICE, dtype=torch.bfloat16) * 4
    fn = getattr(opforge, op)
    general, planned = _general_then_planned(fn, x)
    assert problem.signature(op, x, -1) in problem.PLANS
    assert torch.equal(general, planned)
    fresh = torch.randn_like(x) * 4
    assert max_rel_error(fn(fresh), _reference(op, fresh)) <= TOLERANCE[torch.bfloat16]


@needs_gpu
def test_threads_racing_on_a_first_call_both_get_correct_results():
    shape = (6, 1000)
    xs = [torch.randn(shape, device=DEVICE) for _ in range(8)]
    outs = [None] * len(xs)
    start = threading.Barrier(len(xs))

    def work(i):
        start.wait()
        outs[i] = opforge.softmax(xs[i])
        torch.cuda.synchronize()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(xs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for x, y in zip(xs, outs):
        assert max_rel_error(y, _reference("softmax", x)) <= TOLERANCE[torch.float32]
