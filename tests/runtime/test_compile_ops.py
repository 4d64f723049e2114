"""torch.compile (fullgraph, aot_eager / inductor / reduce-overhead) of attention, rotary, KV-cache,
delay and quantized-linear ops: equal to eager, one graph, mutations declared, opcheck clean."""
import pytest
import torch

import opforge
from opforge.runtime.compile_support import InferenceOnlyError
from opforge.testing import rel_error

B, HQ, HKV, D, S_MAX, C = 2, 4, 2, 16, 12, 3
DELAYS = [0, 1, 2]


def _inputs(device, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    mk = lambda *s: torch.randn(*s, generator=g).to(device, dtype)  # noqa: E731
    angles = torch.arange(64.0)[:, None] * (0.5 ** torch.arange(D // 2.0))
    lens = torch.tensor([3, 7], dtype=torch.int32)
    qw = opforge.quantize_weight(torch.randn(24, HQ * D, generator=g), bits=4, group_size=32)
    if device != "cpu":
        qw = opforge.QuantizedWeight(qw.packed.to(device), qw.scales_t.to(device),
                                     None if qw.zeros_t is None else qw.zeros_t.to(device), qw.bits, qw.group_size,
                                     qw.shape)
    return dict(
        q=mk(B, HQ, 1, D), k=mk(B, HKV, 1, D), v=mk(B, HKV, 1, D),
        k_cache=mk(B, HKV, S_MAX, D), v_cache=mk(B, HKV, S_MAX, D), lens=lens.to(device),
        cos=angles.cos().to(device), sin=angles.sin().to(device),
        w=mk(24, HQ * D), qw=qw, codes=torch.randint(0, 100, (B, 5, C), generator=g).to(device))


def step(q, k, v, k_cache, v_cache, lens, cos, sin, w, qw, codes):
    """One decoder-like step: rotate, append to the cache, attend, project (dense and int4), delay."""
    q, k = opforge.rotary_embedding(q, k, cos, sin, lens[:, None].long())
    opforge.kv_cache_append(k_cache, v_cache, k, v, lens)
    o = opforge.decode_attention(q, k_cache, v_cache, lens + 1)
    h = o.transpose(1, 2).reshape(o.shape[0], -1).to(w.dtype)
    y = opforge.linear(h, w) + opforge.linear(h, qw)
    return y, opforge.apply_delay(codes, DELAYS, bos_id=-1, pad_id=-2)


def _reference(q, k, v, k_cache, v_cache, lens, cos, sin, w, qw, codes):
    """The same step in float64 torch ops (cache copies): the oracle."""
    q, k, v, kc, vc, cos, sin = (t.double() for t in (q, k, v, k_cache, v_cache, cos, sin))
    pos = lens.long().cpu()

    def rot(x):
        c, s = cos[pos][:, None, None, :].to(x.device), sin[pos][:, None, None, :].to(x.device)
        x1, x2 = x[..., : D // 2], x[..., D // 2:]
        return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], -1)

    q, k = rot(q), rot(k)
    outs = []
    for b in range(B):
        n = int(pos[b])
        kc[b, :, n], vc[b, :, n] = k[b, :, 0], v[b, :, 0]
        kk = kc[b, :, : n + 1].repeat_interleave(HQ // HKV, 0)
        vv = vc[b, :, : n + 1].repeat_interleave(HQ // HKV, 0)
        p = torch.softmax(q[b] @ kk.transpose(-1, -2) / D ** 0.5, -1)
        outs.append(p @ vv)
    h = torch.stack(outs).transpose(1, 2).reshape(B, -1)
    y = h @ w.double().T + h @ qw.dequantize().double().T
    d = codes.clone()
    for c, dc in enumerate(DELAYS):
        d[:, dc:, c] = codes[:, : codes.shape[1] - dc, c]
        d[:, :dc, c] = -1
    return y, d, kc, vc


def _run_and_compare(fn, device, tol, dtype=torch.float32):
    for seed in range(2):  # new data, same graph
        a = _inputs(device, dtype, seed)
        e = dict(a, k_cache=a["k_cache"].clone(), v_cache=a["v_cache"].clone())
        y_ref, d_ref, kc_ref, vc_ref = _reference(**a)
        y, d = fn(**a)
        y_e, d_e = step(**e)
        assert rel_error(y, y_ref) < tol and rel_error(y_e, y_ref) < tol
        torch.testing.assert_close(y, y_e, rtol=tol, atol=tol)
        assert torch.equal(d.cpu(), d_ref.cpu()) and torch.equal(d_e, d)
        assert rel_error(a["k_cache"], kc_ref) < tol and rel_error(a["v_cache"], vc_ref) < tol
        assert torch.equal(a["k_cache"], e["k_cache"]) and torch.equal(a["v_cache"], e["v_cache"])


@pytest.mark.cpu_only
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_decoder_step_compiles_fullgraph_on_cpu_and_equals_eager(backend):
    torch._dynamo.reset()
    _run_and_compare(torch.compile(step, fullgraph=True, backend=backend), "cpu", 1e-5)


def test_decoder_step_is_one_graph_with_one_node_per_op():
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(step)(**_inputs("cpu"))
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1
    targets = [str(n.target) for g in explanation.graphs for n in g.graph.nodes if n.op == "call_function"]
    for name in ("rotary_embedding", "kv_cache_append", "decode_attention", "quantized_linear", "shift_delay"):
        assert any(f"opforge.{name}" in t for t in targets), (name, targets)


def _inplace_step(q, k, v, k_cache, v_cache, lens, cos, sin, codes, out, delays_t):
    opforge.rotary_embedding(q, k, cos, sin, lens[:, None].long(), inplace=True)
    q2 = opforge.rotary_kv_cache_append(q.clone(), k, v, k_cache, v_cache, lens, cos, sin, inplace=True)
    opforge.revert_delay(codes, delays_t, pad_id=-2, out=out)
    return q2 * 1.0, out + 0


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_in_place_and_out_variants_mutate_their_arguments_under_compile(backend):
    torch._dynamo.reset()
    f = torch.compile(_inplace_step, fullgraph=True, backend=backend)
    for seed in range(2):
        a = _inputs("cpu", seed=seed)
        args = dict(q=a["q"], k=a["k"], v=a["v"], k_cache=a["k_cache"], v_cache=a["v_cache"], lens=a["lens"],
                    cos=a["cos"], sin=a["sin"], codes=a["codes"], out=torch.full_like(a["codes"], 7),
                    delays_t=torch.tensor(DELAYS))
        eager = {n: (t.clone() if isinstance(t, torch.Tensor) else t) for n, t in args.items()}
        before_q = args["q"].clone()
        got = f(**args)
        want = _inplace_step(**eager)
        for x, y in zip(got, want):
            torch.testing.assert_close(x, y, rtol=1e-6, atol=1e-6)
        for n in ("q", "k", "k_cache", "v_cache", "out"):  # the compiled call wrote the same inputs
            torch.testing.assert_close(args[n], eager[n], rtol=1e-6, atol=1e-6)
        assert rel_error(args["q"], before_q) > 1e-3  # rotated in place (positions > 0)
        assert torch.equal(args["out"][:, :, 0], args["codes"][:, :, 0])


def test_new_custom_ops_pass_torch_library_opcheck():
    a = _inputs("cpu")
    pos = a["lens"][:, None].long()
    qw = a["qw"]
    h = torch.randn(B, HQ * D)
    d_t = torch.tensor(DELAYS)
    ops = torch.ops.opforge
    checks = [
        (ops.attention.default, (a["q"].expand(B, HQ, 3, D), a["k_cache"], a["v_cache"]), dict(causal=True)),
        (ops.decode_attention.default, (a["q"], a["k_cache"], a["v_cache"], a["lens"]), dict(scale=0.3)),
        (ops.rotary_embedding.default, (a["q"], a["k"], a["cos"], a["sin"], pos), dict(interleaved=True)),
        (ops.rotary_embedding_.default, (a["q"].clone(), a["k"].clone(), a["cos"], a["sin"], pos, False), {}),
        (ops.kv_cache_append.default, (a["k_cache"].clone(), a["v_cache"].clone(), a["k"], a["v"], a["lens"]), {}),
        (ops.rotary_kv_cache_append.default, (a["q"], a["k"], a["v"], a["k_cache"].clone(), a["v_cache"].clone(),
                                              a["lens"], a["cos"], a["sin"]), {}),
        (ops.rotary_kv_cache_append_.default, (a["q"].clone(), a["k"], a["v"], a["k_cache"].clone(),
                                               a["v_cache"].clone(), a["lens"], a["cos"], a["sin"], None, False,
                                               None), {}),
        (ops.shift_delay.default, (a["codes"], DELAYS, None, -1, -2, False), {}),
        (ops.shift_delay.default, (a["codes"], [], d_t, None, -2, True), {}),
        (ops.shift_delay_out.default, (a["codes"], DELAYS, None, -1, -2, False, torch.empty_like(a["codes"])), {}),
        (ops.quantized_linear.default, (h, qw.packed, qw.scales_t, qw.zeros_t, qw.bits, qw.group_size,
                                        qw.shape[0], qw.shape[1], torch.randn(24)), {}),
    ]
    for op, args, kwargs in checks:
        torch.library.opcheck(op, args, kwargs, test_utils=("test_schema", "test_faketensor"))


def test_new_ops_refuse_inputs_requiring_grad():
    a = _inputs("cpu")
    q = a["q"].requires_grad_()
    with pytest.raises(InferenceOnlyError, match="opforge.decode_attention"):
        opforge.decode_attention(q, a["k_cache"], a["v_cache"], a["lens"])
    with pytest.raises(InferenceOnlyError, match="opforge.rotary_embedding"):
        opforge.rotary_embedding(q, a["k"], a["cos"], a["sin"], a["lens"][:, None].long())
    with pytest.raises(InferenceOnlyError, match="opforge.linear"):
        opforge.linear(torch.randn(2, HQ * D), a["w"].requires_grad_())
    with torch.no_grad():
        out = opforge.attention(q, a["k_cache"], a["v_cache"])
    assert not out.requires_grad


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
@pytest.mark.parametrize("dtype", [torch.float16])
def test_decoder_step_compiles_on_gpu_with_triton_kernels(mode, dtype):
    torch._dynamo.reset()
    f = torch.compile(step, fullgraph=True, mode=mode)
    for _ in range(3):  # reduce-overhead: warm-up, record, replay
        _run_and_compare(f, "cuda", 2e-2, dtype)
    with opforge.trace() as t:  # eager: the Triton variants run (not the torch fallback)
        step(**_inputs("cuda", dtype))
    events = [e for e in t if not (e.op == "linear" and e.variant == "dense")]
    assert len(events) == 5 and all(e.backend == "triton" for e in events), str(t)


@pytest.mark.gpu
def test_in_place_variants_under_cuda_graphs():
    torch._dynamo.reset()
    f = torch.compile(_inplace_step, fullgraph=True, mode="reduce-overhead")
    for seed in range(3):
        a = _inputs("cuda", torch.float16, seed)
        args = dict(q=a["q"], k=a["k"], v=a["v"], k_cache=a["k_cache"], v_cache=a["v_cache"], lens=a["lens"],
                    cos=a["cos"], sin=a["sin"], codes=a["codes"], out=torch.full_like(a["codes"], 7),
                    delays_t=torch.tensor(DELAYS, device="cuda"))
        eager = {n: t.clone() for n, t in args.items()}
        got = f(**args)
        want = _inplace_step(**eager)
        for x, y in zip(got, want):
            torch.testing.assert_close(x, y)
        for n in ("q", "k", "k_cache", "v_cache", "out"):
            torch.testing.assert_close(args[n], eager[n])


def _rotate_views_in_place(buf, kbuf, pos, cos, sin):
    q = buf.view(B, 3, HQ, D).transpose(1, 2)  # (B, S, H, D) buffers viewed as (B, H, S, D)
    k = kbuf.view(B, 3, HKV, D).transpose(1, 2)
    opforge.rotary_embedding(q, k, cos, sin, pos, inplace=True)
    return buf.sum(-1)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_in_place_rotary_of_strided_views_writes_the_base_buffers_under_compile(backend):
    torch._dynamo.reset()
    a = _inputs("cpu")
    f = torch.compile(_rotate_views_in_place, fullgraph=True, backend=backend)
    buf, kbuf, pos = torch.randn(B, 3, HQ * D), torch.randn(B, 3, HKV * D), torch.tensor([[1, 2, 3], [4, 5, 6]])
    buf2, kbuf2, before = buf.clone(), kbuf.clone(), buf.clone()
    got = f(buf, kbuf, pos, a["cos"], a["sin"])
    want = _rotate_views_in_place(buf2, kbuf2, pos, a["cos"], a["sin"])
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-5)
    assert torch.equal(buf, buf2) and torch.equal(kbuf, kbuf2) and rel_error(buf, before) > 1e-3
    q_ref, _ = opforge.rotary_embedding(before.view(B, 3, HQ, D).transpose(1, 2), kbuf2.view(B, 3, HKV, D)
                                        .transpose(1, 2), a["cos"], a["sin"], pos)
    assert rel_error(buf.view(B, 3, HQ, D).transpose(1, 2), q_ref) < 1e-6
