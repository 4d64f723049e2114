"""torch.compile (fullgraph, inductor, reduce-overhead), CUDA graphs, and the inference-only guard."""
import pytest
import torch

import opforge
from opforge.runtime.compile_support import InferenceOnlyError
from torch.utils._python_dispatch import TorchDispatchMode
from opforge.testing import ON_GPU, rel_error



def block(x, residual, weight, gate, up):
    """A pre-norm MLP-ish block: add & RMS norm, a gated activation, a softmax over the sum."""
    y, new_residual = opforge.add_rms_norm(x, residual, weight)
    h = opforge.swiglu(gate, up)
    scores = opforge.softmax(y + h, dim=-1)
    return opforge.log_softmax(scores * 4.0, dim=0), opforge.gelu(new_residual), new_residual


def _inputs(device, dtype=torch.float32, rows=6, n=96):
    mk = lambda *s: torch.randn(*s, device=device, dtype=dtype)  # noqa: E731
    return mk(rows, n), mk(rows, n), mk(n), mk(rows, n), mk(rows, n)


def _reference(x, residual, weight, gate, up):
    """The same block in float64 torch ops: the oracle."""
    x, residual, weight, gate, up = (t.double() for t in (x, residual, weight, gate, up))
    s = x + residual
    y = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-6) * weight
    h = torch.nn.functional.silu(gate) * up
    scores = torch.softmax(y + h, dim=-1)
    return torch.log_softmax(scores * 4.0, dim=0), torch.nn.functional.gelu(s), s


def _check(outs, args, tol):
    for out, ref in zip(outs, _reference(*args)):
        assert rel_error(out, ref) < tol


@pytest.mark.cpu_only
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_fullgraph_compile_on_cpu_equals_eager(backend):
    torch._dynamo.reset()
    args = _inputs("cpu")
    compiled = torch.compile(block, fullgraph=True, backend=backend)
    eager = block(*args)
    for _ in range(2):  # new data, same graph
        out = compiled(*args)
        for o, e in zip(out, eager):
            assert o.shape == e.shape and o.dtype == e.dtype
            torch.testing.assert_close(o, e, rtol=1e-6, atol=1e-6)
        _check(out, args, 1e-5)
        args = _inputs("cpu")
        eager = block(*args)


def test_compiled_graph_has_one_node_per_op_and_no_break():
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(block)(*_inputs("cpu"))
    assert explanation.graph_break_count == 0
    assert explanation.graph_count == 1


def test_custom_ops_pass_torch_library_opcheck():
    x, r, w, g, u = _inputs("cpu", rows=3, n=16)
    checks = [
        (torch.ops.opforge.add_rms_norm.default, (x, r, w, 1e-6)),
        (torch.ops.opforge.add_layer_norm.default, (x, r, w, None, 1e-5)),
        (torch.ops.opforge.layer_norm.default, (x, w, None, 1e-5)),
        (torch.ops.opforge.rms_norm.default, (x, None, 1e-6)),
        (torch.ops.opforge.softmax.default, (x.t(), 0)),  # a dim that is not last: a view in eager
        (torch.ops.opforge.log_softmax.default, (x, -1)),
        (torch.ops.opforge.gelu.default, (x, "tanh")),
        (torch.ops.opforge.silu.default, (x,)),
        (torch.ops.opforge.relu.default, (x.t(),)),
        (torch.ops.opforge.swiglu.default, (g, u)),
        (torch.ops.opforge.geglu.default, (g, u, "none")),
    ]
    for op, args in checks:
        torch.library.opcheck(op, args, test_utils=("test_schema", "test_faketensor"))


class _OpLog(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))


def test_eager_calls_take_the_direct_path_and_compiled_calls_the_custom_op():
    x = torch.randn(2, 8)
    with _OpLog() as log:
        opforge.rms_norm(x)
    assert log.names and not any(n.startswith("opforge.") for n in log.names)
    with _OpLog() as log:
        torch.ops.opforge.rms_norm(x)
    assert "opforge.rms_norm.default" in log.names


def test_inputs_requiring_grad_raise_a_clear_error():
    x = torch.randn(3, 16, requires_grad=True)
    with pytest.raises(InferenceOnlyError, match=r"torch\.no_grad\(\).*torch\.inference_mode\(\)"):
        opforge.rms_norm(x)
    w = torch.ones(16, requires_grad=True)  # a parameter counts too
    with pytest.raises(InferenceOnlyError, match="opforge.layer_norm"):
        opforge.layer_norm(x.detach(), weight=w)
    with pytest.raises(RuntimeError):  # InferenceOnlyError is a RuntimeError
        opforge.swiglu(x, x)


def test_no_grad_and_inference_mode_run_and_match_reference():
    x = torch.randn(3, 16, requires_grad=True)
    w = torch.nn.Parameter(torch.randn(16))
    ref = x.double() * torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-6) * w.double()
    with torch.no_grad():
        y = opforge.rms_norm(x, w)
    assert not y.requires_grad and rel_error(y, ref) < 1e-5
    with torch.inference_mode():
        y = opforge.rms_norm(x, w)
    assert rel_error(y, ref) < 1e-5
    # nn modules whose parameters require grad run under no_grad as users do for inference
    with torch.no_grad():
        out = opforge.nn.RMSNorm(16)(x)
    assert out.shape == x.shape


@pytest.mark.gpu
@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gpu_compile_with_triton_kernels_equals_eager(mode, dtype):
    if not ON_GPU:
        pytest.skip("needs CUDA")
    torch._dynamo.reset()
    compiled = torch.compile(block, fullgraph=True, mode=mode)
    for _ in range(4):  # reduce-overhead records a CUDA graph after warm-up runs, then replays it
        args = _inputs("cuda", dtype, rows=64, n=1024)
        with opforge.trace() as t:
            eager = block(*args)
        assert {e.backend for e in t} == {"triton"}
        out = [o.clone() for o in compiled(*args)]
        for o, e in zip(out, eager):
            torch.testing.assert_close(o, e, rtol=2e-2 if dtype == torch.bfloat16 else 2e-3, atol=1e-2)
        _check(out, args, 1e-2)


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_hand_captured_cuda_graph_replays_on_new_data(dtype):
    static = _inputs("cuda", dtype, rows=32, n=512)
    block(*static)  # warm up: compile the kernels and fill the caches outside the capture
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        block(*static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = block(*static)
    for _ in range(3):
        fresh = _inputs("cuda", dtype, rows=32, n=512)
        for buf, new in zip(static, fresh):
            buf.copy_(new)
        graph.replay()
        torch.cuda.synchronize()
        eager = block(*fresh)
        for o, e in zip(static_out, eager):
            torch.testing.assert_close(o, e, rtol=0, atol=0)
        _check(static_out, fresh, 1e-2)


@pytest.mark.parametrize("cls", [opforge.nn.LayerNorm, opforge.nn.RMSNorm])
def test_nn_modules_record_a_graph_in_grad_mode_and_run_opforge_for_inference(cls):
    module = cls(32)
    with torch.no_grad():
        for p in module.parameters():
            p.normal_()
    x = torch.randn(4, 32, requires_grad=True)
    with opforge.trace() as t:
        y = module(x)
    assert len(t) == 0 and y.requires_grad  # torch's forward ran, with a graph
    y.square().sum().backward()
    torch_module = (torch.nn.LayerNorm if cls is opforge.nn.LayerNorm else torch.nn.RMSNorm)(32)
    torch_module.load_state_dict(module.state_dict())
    x2 = x.detach().clone().requires_grad_()
    torch_module(x2).square().sum().backward()
    torch.testing.assert_close(x.grad, x2.grad)
    with torch.no_grad(), opforge.trace() as t:
        y = module(x)
    assert [e.op for e in t] == ["layer_norm" if cls is opforge.nn.LayerNorm else "rms_norm"]
    assert rel_error(y, torch_module(x).detach().double()) < 1e-5


def test_dynamic_shapes_compile_once_and_match_eager():
    torch._dynamo.reset()

    def f(x, r, w):
        y, h = opforge.add_rms_norm(x, r, w)
        return opforge.softmax(opforge.gelu(y) + opforge.silu(h), dim=0), opforge.layer_norm(h, w, None)

    compiled = torch.compile(f, fullgraph=True, dynamic=True, backend="aot_eager")
    for rows, n in [(3, 16), (5, 32), (7, 48)]:
        x, r, w = torch.randn(rows, n), torch.randn(rows, n), torch.randn(n)
        for a, b in zip(compiled(x, r, w), f(x, r, w)):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def test_a_model_with_opforge_modules_compiles_under_inference_mode():
    torch._dynamo.reset()
    model = torch.nn.Sequential(opforge.nn.RMSNorm(16), torch.nn.Linear(16, 16), opforge.nn.LayerNorm(16))
    with torch.inference_mode():
        x = torch.randn(4, 16)
        compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-6, atol=1e-6)


def test_compiled_calls_with_inputs_requiring_grad_fail_naming_no_grad():
    torch._dynamo.reset()
    f = torch.compile(lambda x: opforge.rms_norm(x) * 2, fullgraph=True, backend="aot_eager")
    x = torch.randn(3, 8, requires_grad=True)
    with pytest.raises(Exception, match=r"inference-only.*torch\.no_grad\(\)"):
        f(x)
    with torch.no_grad():
        y = f(x)
    assert rel_error(y, 2 * x.double() * torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-6)) < 1e-5
