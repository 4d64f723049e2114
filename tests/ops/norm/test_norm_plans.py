"""Launch plans of the norm family: a repeated call skips the general path and stays correct.

Plans exist only where a compiled kernel is launched directly, so the behavioural tests need a
GPU; the signature rules, and a plan's launch arguments with the launch faked, are checked
everywhere (on the test device: CPU tensors under the interpreter, CUDA tensors on a GPU).
"""
import pytest
import torch

import opforge
from opforge.ops.norm import problem, reference, triton_kernels
from opforge.runtime import plans
from opforge.testing import DEVICE, ON_GPU, TOLERANCE, max_rel_error

needs_gpu = pytest.mark.skipif(not ON_GPU or plans._CHECKING_KEYS,
                               reason="plans need compiled kernels (a GPU) and no launch-key checks")
needs_plans = pytest.mark.skipif(plans._CHECKING_KEYS, reason="OPFORGE_CHECK_LAUNCH_KEYS turns plans off")


pytestmark = pytest.mark.usefixtures("plans_on")  # tests/conftest.py


def test_signature_only_for_packed_tensors():
    x = torch.randn(4, 64)
    w = torch.randn(64)
    assert problem.signature("rms_norm", x, None, w, None) == ("rms_norm", x.shape, x.dtype, x.device, None,
                                                               (w.shape, w.dtype, w.device), None)
    assert problem.signature("rms_norm", x.t(), None, None, None) is None
    assert problem.signature("rms_norm", x, None, torch.randn(128)[::2], None) is None
    assert problem.signature("rms_norm", "not a tensor", None, None, None) is None
    assert problem.signature("add_rms_norm", x, [1.0], None, None) is None


@needs_plans
@pytest.mark.parametrize("op", problem.OPS)
@pytest.mark.parametrize("n", [77, 2000, 40000])
@pytest.mark.parametrize("affine", [True, False])
def test_a_plan_launches_what_the_general_path_launches(op, n, affine, monkeypatch):
    """With the compiled launch faked, a plan's launch arguments for new tensors equal the general
    path's, pointer for pointer and scalar for scalar.

    The fakes replace the two seams both machines go through: ``launch_raw`` (the general path's
    launch of an already compiled key; on a GPU, Triton's launcher) and ``raw_launcher`` (what a
    plan keeps; on a GPU, the C launch function under Triton 3.4-3.6's wrapper, see
    ``launch.c_launch``). The tensors live on the test device: Triton runs no CPU tensor on a
    machine with a GPU (no interpreter there), which is what failed when they were CPU tensors."""
    launched = []

    def fake_launch_raw(key, grid, raw_args, num_warps, index):
        launched.append(("general", grid[0], raw_args))
        return True

    def fake_raw_launcher(key):
        def go(grid_x, raw_args, index):
            launched.append(("plan", grid_x, raw_args))
            return True
        return go

    for launcher in (triton_kernels._tile, triton_kernels._looped):
        monkeypatch.setattr(launcher, "launch_raw", fake_launch_raw)
        monkeypatch.setattr(launcher, "raw_launcher", fake_raw_launcher)
    w = torch.randn(n, device=DEVICE) if affine else None
    b = torch.randn(n, device=DEVICE) if affine and "layer" in op else None

    def call(eps):
        x = torch.randn(2, 3, n, device=DEVICE)
        r = torch.randn_like(x) if op.startswith("add_") else None
        args = (x, r) if r is not None else (x,)
        kwargs = {"weight": w, "eps": eps, **({"bias": b} if "layer" in op else {})}
        with opforge.backend("triton"):
            out = getattr(opforge, op)(*args, **kwargs)
        outs = out if isinstance(out, tuple) else (out, None)
        return x, r, outs

    x1, r1, (y1, s1) = call(1e-5)
    x2, r2, (y2, s2) = call(0.25)
    assert [kind for kind, _, _ in launched] == ["general", "plan"]
    (_, grid1, args1), (_, grid2, args2) = launched
    assert grid1 == grid2
    def pointers(x, r, y, s):
        yp = y.data_ptr()
        return (x.data_ptr(), r.data_ptr() if r is not None else x.data_ptr(), yp,
                s.data_ptr() if s is not None else yp, w.data_ptr() if w is not None else yp,
                b.data_ptr() if b is not None else yp)
    assert args1[:6] == pointers(x1, r1, y1, s1)
    assert args2[:6] == pointers(x2, r2, y2, s2)
    eps_at = 6 + 8
    assert args1[6:eps_at] == args2[6:eps_at] and args1[eps_at + 1:] == args2[eps_at + 1:]
    assert (args1[eps_at], args2[eps_at]) == (1e-5, 0.25)


def _calls_of_prepare(monkeypatch):
    import opforge.ops.norm as norm
    seen = []
    real = norm.prepare

    def counting(*args, **kwargs):
        seen.append(args[0])
        return real(*args, **kwargs)
    monkeypatch.setattr(norm, "prepare", counting)
    return seen


def _reference(op, x, r, w, b, eps):
    return reference.run(op, x.double(), None if r is None else r.double(), None if w is None else w.double(),
                         None if b is None else b.double(), eps)


@needs_gpu
@pytest.mark.parametrize("op", problem.OPS)
@pytest.mark.parametrize("n", [256, 4096, 70000])
def test_repeated_calls_run_the_plan_on_fresh_data(op, n, monkeypatch):
    seen = _calls_of_prepare(monkeypatch)
    dtype = torch.bfloat16
    w = torch.randn(n, device=DEVICE, dtype=dtype)
    b = torch.randn(n, device=DEVICE, dtype=dtype) if "layer" in op else None
    fn = getattr(opforge, op)
    for i in range(4):
        x = torch.randn(3, 5, n, device=DEVICE, dtype=dtype)
        r = torch.randn_like(x) if op.startswith("add_") else None
        eps = (1e-5, 1e-2, 3.0, 1e-6)[i]  # eps is per call, not part of the plan
        args = (x, r) if r is not None else (x,)
        out = fn(*args, weight=w, bias=b, eps=eps) if b is not None else fn(*args, weight=w, eps=eps)
        assert max_rel_error(out, _reference(op, x, r, w, b, eps)) <= TOLERANCE[dtype], (i, eps)
    assert len(seen) <= 2, "after the kernel is compiled, calls of the same signature run the plan"


@needs_gpu
def test_calls_a_plan_cannot_serve_take_the_general_path(monkeypatch):
    n = 512
    w = torch.randn(n, device=DEVICE)
    for _ in range(3):
        opforge.rms_norm(torch.randn(8, n, device=DEVICE), w)
    seen = _calls_of_prepare(monkeypatch)
    # not 16-byte aligned: same signature, general path
    x = torch.randn(8 * n + 1, device=DEVICE)[1:].view(8, n)
    assert max_rel_error(opforge.rms_norm(x, w), _reference("rms_norm", x, None, w, None, 1e-6)) <= 1e-5
    assert len(seen) == 1
    # a bad eps or weight is reported as on the general path
    with pytest.raises(ValueError):
        opforge.rms_norm(torch.randn(8, n, device=DEVICE), w, eps=-1.0)
    with pytest.raises(ValueError):
        opforge.rms_norm(torch.randn(8, n, device=DEVICE), torch.randn(n + 1, device=DEVICE))
    # strided rows: no plan, read in place
    x = torch.randn(8, 2 * n, device=DEVICE)[:, :n]
    assert max_rel_error(opforge.rms_norm(x, w), _reference("rms_norm", x, None, w, None, 1e-6)) <= 1e-5


@needs_gpu
def test_trace_and_forced_backends_bypass_plans():
    n = 1024
    x = torch.randn(4, n, device=DEVICE)
    for _ in range(3):
        opforge.layer_norm(x)
    with opforge.trace() as t:
        opforge.layer_norm(x)
    assert len(t) == 1 and t[0].backend == "triton"
    with opforge.backend("torch"), opforge.trace() as t:
        y = opforge.layer_norm(x)
    assert t[0].backend == "torch"
    assert max_rel_error(y, _reference("layer_norm", x, None, None, None, 1e-5)) <= 1e-5


@needs_gpu
@pytest.mark.parametrize("op", problem.OPS)
@pytest.mark.parametrize("n", [77, 4096, 40000])
def test_plan_outputs_equal_general_path_outputs(op, n):
    """On real kernels, a planned call gives bit for bit what the general path gives on the same data."""
    dtype = torch.bfloat16
    w = torch.randn(n, device=DEVICE, dtype=dtype)
    b = torch.randn(n, device=DEVICE, dtype=dtype) if "layer" in op else None
    fn = getattr(opforge, op)
    x = torch.randn(4, 3, n, device=DEVICE, dtype=dtype)
    r = torch.randn_like(x) if op.startswith("add_") else None
    args = (x, r) if r is not None else (x,)
    kwargs = {"weight": w, **({"bias": b} if b is not None else {})}
    plans.set_enabled(False)
    general = fn(*args, **kwargs)
    plans.set_enabled(True)
    for _ in range(2):
        fn(*args, **kwargs)  # compiles (if needed) and leaves the plan
    assert problem.signature(op, x, r, w, b) in problem.PLANS
    planned = fn(*args, **kwargs)
    for g, p in zip(general if isinstance(general, tuple) else (general,),
                    planned if isinstance(planned, tuple) else (planned,)):
        assert torch.equal(g, p)
    assert max_rel_error(planned, _reference(op, x, r, w, b, 1e-5 if "layer" in op else 1e-6)) <= TOLERANCE[dtype]
