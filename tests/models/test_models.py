"""opforge.models: own-consistency (always) and agreement with transformers (when importable)."""
from __future__ import annotations

import json
import os

import pytest
import torch

import opforge
from opforge.models import UnsupportedModelError, load
from opforge.models.testing import TINY_LLAMA, random_weights, tiny_decoder, write_checkpoint
from opforge.serve import generate, last_stats
from opforge.testing import rel_error


@pytest.fixture(scope="module")
def model():
    return tiny_decoder(max_seq_len=96, max_batch=4)


def test_prefill_then_decode_equals_full_forward(model):
    ids = torch.randint(0, 64, (1, 40), generator=torch.Generator().manual_seed(1))
    full = model.forward(ids)[0]
    steps = [model.prefill(ids[:, :24], torch.tensor([24]))[0]]
    seqlens = model.cache_seqlens[:1]
    for t in range(24, 40):
        steps.append(model.decode_step(ids[:, t], seqlens)[0])
        seqlens.add_(1)
    got = torch.stack(steps)          # logits at positions 23..39
    assert rel_error(got, full[23:40]) < 1e-5
    assert full.abs().max() > 1.0     # real values, not zeros


def test_forward_matches_float64_own_model():
    m32 = tiny_decoder(max_seq_len=64)
    m64 = tiny_decoder(max_seq_len=64, dtype=torch.float64)
    ids = torch.randint(0, 64, (2, 20), generator=torch.Generator().manual_seed(2))
    assert rel_error(m32.forward(ids), m64.forward(ids)) < 1e-5


def test_batched_prompts_of_different_lengths_equal_single_runs(model):
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 64, (n,), generator=g).tolist() for n in (5, 17, 1, 11)]
    batched = generate(model, prompts, 12)
    singles = [generate(model, p, 12)[0] for p in prompts]
    assert batched == singles
    assert len({tuple(s) for s in singles}) > 1


def test_greedy_generation_equals_argmax_of_full_forward(model):
    prompt = [5, 9, 11, 3]
    out = generate(model, prompt, 10)[0]
    seq = list(prompt)
    for _ in range(10):
        seq.append(int(model.forward(torch.tensor([seq]))[0, -1].argmax()))
    assert out == seq[len(prompt):]


def test_sampling_is_reproducible_with_a_seeded_generator(model):
    def run(seed):
        return generate(model, [[1, 2, 3], [7, 8]], 16, temperature=1.0, top_k=20, top_p=0.9,
                              generator=torch.Generator().manual_seed(seed))
    assert run(7) == run(7)
    assert run(7) != run(8)


def test_top_k_one_is_greedy(model):
    greedy = generate(model, [4, 5, 6], 8)
    sampled = generate(model, [4, 5, 6], 8, temperature=0.8, top_k=1, generator=torch.Generator().manual_seed(0))
    assert greedy == sampled


def test_stop_ids_and_stream(model):
    first = generate(model, [4, 5, 6], 8)[0]
    seen = []
    out = generate(model, [4, 5, 6], 8, stop_ids=[first[3]], stream=lambda b, t: seen.append((b, t)))
    stop_at = first.index(first[3])
    assert out[0] == first[:stop_at + 1]
    assert seen == [(0, t) for t in out[0]]


def test_stops_at_different_steps_in_a_batch(model):
    """Batched prompts that stop at different steps (greedy and seeded sampling): each stream
    call in order, each sequence cut at its own stop, greedy = the free run cut there."""
    prompts = [[4, 5, 6], [9, 1], [3, 3, 3, 3, 7]]
    free = generate(model, prompts, 13)
    stops = [free[0][2], free[1][9]]
    for kwargs in ({}, {"temperature": 0.9, "top_k": 12}):
        seen = []
        out = generate(model, prompts, 13, stop_ids=stops, stream=lambda b, t: seen.append((b, t)),
                       generator=torch.Generator().manual_seed(5), **kwargs)
        assert [[t for b, t in seen if b == i] for i in range(3)] == out
        assert all(o[-1] in stops or len(o) == 13 for o in out)
        assert all(t not in stops for o in out for t in o[:-1])
        assert len({len(o) for o in out}) > 1                    # the stops cut sequences at different steps
        if not kwargs:                                            # greedy: the free run, cut at the stops
            assert out == [f[:len(o)] for f, o in zip(free, out)]
    again = generate(model, prompts, 13, stop_ids=stops, generator=torch.Generator().manual_seed(5),
                     temperature=0.9, top_k=12)
    assert again == out


@pytest.mark.parametrize("readback", [0, -1, 1.5, True, "2"])
def test_readback_must_be_a_positive_int(model, readback):
    with pytest.raises(ValueError, match="readback must be an int >= 1"):
        generate(model, [1, 2], 3, readback=readback)


@pytest.mark.parametrize("model_type", ["mistral", "qwen2", "qwen3"])
def test_other_families_load_and_decode_consistently(tmp_path, model_type):
    config = dict(TINY_LLAMA, model_type=model_type, architectures=[f"{model_type.title()}ForCausalLM"])
    m = load(write_checkpoint(str(tmp_path), config, random_weights(config)), device="cpu",
             dtype=torch.float32, max_seq_len=64)
    ids = torch.randint(0, 64, (1, 12), generator=torch.Generator().manual_seed(4))
    full = m.forward(ids)[0, -1]
    m.prefill(ids[:, :11], torch.tensor([11]))
    step = m.decode_step(ids[:, 11], m.cache_seqlens[:1])[0]
    assert rel_error(step, full) < 1e-5


def test_tied_embeddings(tmp_path):
    config = dict(TINY_LLAMA, tie_word_embeddings=True)
    m = load(write_checkpoint(str(tmp_path), config, random_weights(config)), device="cpu", dtype=torch.float32,
             max_seq_len=32)
    assert m.lm_head is m.embed


@pytest.mark.parametrize("change, message", [
    ({"model_type": "gpt_neox"}, "model_type 'gpt_neox'"),
    ({"hidden_act": "gelu"}, "hidden_act='gelu'"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope scaling 'yarn'"),
    ({"architectures": ["LlamaForSequenceClassification"]}, "LlamaForSequenceClassification"),
    ({"quantization_config": {"quant_method": "gptq"}}, "quantization_config"),
])
def test_unsupported_configs_raise_naming_the_field(tmp_path, change, message):
    config = dict(TINY_LLAMA, **change)
    write_checkpoint(str(tmp_path), config, random_weights(TINY_LLAMA))
    with pytest.raises(UnsupportedModelError, match=message.replace("(", r"\(").replace("[", r"\[")):
        load(str(tmp_path), device="cpu", dtype=torch.float32)


def test_unused_weights_are_refused(tmp_path):
    weights = random_weights(TINY_LLAMA)
    weights["model.layers.0.self_attn.rotary_scale"] = torch.ones(4)
    write_checkpoint(str(tmp_path), TINY_LLAMA, weights)
    with pytest.raises(UnsupportedModelError, match="rotary_scale"):
        load(str(tmp_path), device="cpu", dtype=torch.float32)


def test_sliding_window_shorter_than_the_cache_is_refused(tmp_path):
    config = dict(TINY_LLAMA, model_type="mistral", sliding_window=16)
    write_checkpoint(str(tmp_path), config, random_weights(config))
    with pytest.raises(UnsupportedModelError, match="sliding_window=16"):
        load(str(tmp_path), device="cpu", dtype=torch.float32, max_seq_len=64)
    assert load(str(tmp_path), device="cpu", dtype=torch.float32, max_seq_len=16).max_seq_len == 16


def test_quantized_models_run_close_to_dense():
    m = tiny_decoder(quantize="int8", max_seq_len=32, group_size=32)
    full = tiny_decoder(max_seq_len=32)
    ids = torch.tensor([[1, 2, 3, 4]])
    assert rel_error(m.forward(ids), full.forward(ids)) < 5e-2
    assert type(m.layers[0].qkv).__name__ == "QuantizedWeight" and type(m.layers[0].down).__name__ == "QuantizedWeight"
    assert isinstance(m.lm_head, torch.Tensor)          # the output head stays dense
    assert m.weight_bytes() < full.weight_bytes()
    with pytest.warns(UserWarning, match="stay dense"):        # K=32 weights with 64-wide groups
        tiny_decoder(quantize="int8", max_seq_len=32, group_size=64)
    m4 = tiny_decoder(quantize="int4", max_seq_len=32, group_size=32)
    assert rel_error(m4.forward(ids), full.forward(ids)) < 0.5
    assert len(generate(m4, [1, 2, 3], 4)[0]) == 4
    # the oracle for a quantized model: the dense model with the weights it was given (dequantized)
    for quantized in (m, m4):
        assert rel_error(quantized.forward(ids), _dequantized_twin(quantized).forward(ids)) < 1e-5



def test_int4_layout_is_the_devices_unless_named_and_holds_the_same_weights():
    """int4 weights take ``opforge.preferred_layout`` (rows on the CPU) unless ``int4_layout``
    names one; planes and rows hold the same codes, so the model computes the same logits."""
    config = dict(TINY_LLAMA, hidden_size=128, intermediate_size=256, head_dim=32)
    kwargs = dict(quantize="int4", max_seq_len=32, group_size=128, quantize_head=True)
    rows = tiny_decoder(config, **kwargs)
    planes = tiny_decoder(config, int4_layout="planes", **kwargs)
    assert {w.layout for w in (rows.layers[0].qkv, rows.layers[1].down, rows.lm_head)} == {"rows"}
    assert {w.layout for w in (planes.layers[0].qkv, planes.layers[1].down, planes.lm_head)} == {"planes"}
    for a, b in zip(rows.layers, planes.layers):
        assert torch.equal(a.gate_up.dequantize(), b.gate_up.dequantize())
    ids = torch.tensor([[1, 2, 3, 4]])
    assert rel_error(planes.forward(ids), rows.forward(ids)) < 1e-6
    with pytest.raises(ValueError, match="int4_layout must be None or one of"):
        tiny_decoder(config, int4_layout="tiles", **kwargs)
    with pytest.raises(ValueError, match="K a multiple of 128"):      # K=32 cannot take the planes layout
        tiny_decoder(quantize="int4", max_seq_len=32, group_size=32, int4_layout="planes")

def _dequantized_twin(model):
    """A dense float32 model whose projections are ``model``'s quantized weights, dequantized."""
    twin = tiny_decoder(max_seq_len=32)
    for ours, theirs in zip(twin.layers, model.layers):
        for name in ("qkv", "o", "gate_up", "down"):
            w = getattr(theirs, name)
            setattr(ours, name, w.dequantize(torch.float32) if hasattr(w, "dequantize") else w)
    return twin


def test_quantize_head_quantizes_a_copy_of_the_tied_embedding():
    """quantize_head: the output head becomes a QuantizedWeight whose logits match the dense-head
    model's up to the head's own quantization; the (tied) embedding stays dense for the lookup."""
    ids = torch.tensor([[1, 2, 3, 4]])
    config = dict(TINY_LLAMA, tie_word_embeddings=True)
    dense_head = tiny_decoder(config, quantize="int8", max_seq_len=32, group_size=32)
    q_head = tiny_decoder(config, quantize="int8", max_seq_len=32, group_size=32, quantize_head=True)
    assert type(q_head.lm_head).__name__ == "QuantizedWeight" and isinstance(q_head.embed, torch.Tensor)
    assert torch.equal(q_head.embed, dense_head.embed)
    y = q_head._run(ids, lambda i, layer, h: q_head._out(layer, opforge.attention(
        *q_head._qkv(layer, h, torch.arange(4, dtype=torch.int32)[None]), causal=True, scale=q_head.scale)))
    want = y.double() @ q_head.lm_head.dequantize(torch.float64).T
    assert rel_error(q_head.logits(y), want) < 1e-5
    assert rel_error(q_head.forward(ids), dense_head.forward(ids)) < 5e-2
    assert q_head.weight_bytes() < dense_head.weight_bytes()


_STEP_OPS = {"linear", "rms_norm", "add_rms_norm", "swiglu", "rotary_kv_cache_append", "decode_attention"}


def test_trace_of_a_decode_step_lists_every_op_with_its_backend(model):
    """The model calls the public ops only: a traced decode step shows each of them, none bridged."""
    model.prefill(torch.tensor([[1, 2, 3]]), torch.tensor([3]))
    with opforge.trace() as t:
        model.decode_step(torch.tensor([4]), model.cache_seqlens[:1])
    assert {e.op for e in t} == _STEP_OPS, {e.op for e in t}
    assert all(e.backend for e in t) and not any(e.variant == "bridge" for e in t)
    per_layer = [e.op for e in t].count("decode_attention")
    assert per_layer == len(model.layers)
    with opforge.trace() as t:
        model.prefill(torch.tensor([[1, 2, 3]]), torch.tensor([3]))
    assert {"attention", "rotary_embedding", "kv_cache_append"} <= {e.op for e in t}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_generation_with_graphs_equals_eager():
    """Greedy generation and seeded sampling give the same tokens with CUDA graphs as without,
    for one prompt and for two of different lengths, twice: the second call replays the graphs
    the first captured (on the engine ``generate`` keeps)."""
    m = tiny_decoder(device="cuda", dtype=torch.bfloat16)
    for prompts in ([[1, 2, 3, 4, 5]], [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10]]):
        eager = generate(m, prompts, 12, graphs=False)
        assert generate(m, prompts, 12, graphs=True) == eager
        s = last_stats(m)
        assert s.graphs and s.capture_s > 0 and not s.reused
        assert generate(m, prompts, 12, graphs=True) == eager
        s = last_stats(m)
        assert s.graphs and s.capture_s == 0 and s.reused
        sampled = [generate(m, prompts, 8, temperature=0.8, top_k=10, graphs=graphs,
                            generator=torch.Generator("cuda").manual_seed(3)) for graphs in (False, True)]
        assert sampled[0] == sampled[1]


_NATIVE = ("attention", "decode_attention", "rotary_embedding", "kv_cache_append", "rotary_kv_cache_append")


@pytest.mark.skipif(not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1",
                    reason="needs a GPU or Triton's interpreter")
def test_triton_kernels_compose_with_the_decoder_layouts():
    """The Triton kernels (interpreter on CPU) on the decoder's strided views equal the torch path:
    the full forward, the static cache's prefill and decode steps, and ``generate`` (paged cache)."""
    m = tiny_decoder(max_seq_len=32, max_batch=2, device="cuda" if torch.cuda.is_available() else "cpu")
    ids = torch.tensor([[3, 4, 5, 6, 7, 8], [9, 10, 11, 12, 13, 14]])
    prompts = [[1, 2, 3], [4, 5, 6, 7]]

    def static_steps() -> torch.Tensor:
        logits = [m.prefill(ids[:, :3], torch.tensor([3, 3]))]
        for t in range(3, 6):
            logits.append(m.decode_step(ids[:, t].to(m.device), m.cache_seqlens[:2]))
            m.cache_seqlens[:2].add_(1)
        return torch.stack(logits)
    with opforge.backend("torch"):
        ref, ref_steps, ref_tokens = m.forward(ids), static_steps(), generate(m, prompts, 4, graphs=False)
    with opforge.backend("triton"), opforge.trace() as t:
        got, steps, tokens = m.forward(ids), static_steps(), generate(m, prompts, 4, graphs=False)
    assert rel_error(got, ref) < 1e-5 and rel_error(steps, ref_steps) < 1e-5
    assert rel_error(steps, ref[:, 2:].transpose(0, 1)) < 1e-5
    assert tokens == ref_tokens
    ran = {e.op for e in t if e.backend == "triton"}
    paged = {"paged_attention", "paged_rotary_kv_cache_append"}
    assert set(_NATIVE) | paged | {"rms_norm", "add_rms_norm", "swiglu"} <= ran, ran


@pytest.mark.parametrize("device", ["cpu"] + (["cuda"] if torch.cuda.is_available() else []))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("vocab", [64, 5000, 32000, 128256])
def test_argmax_rows_equals_argmax_ties_included(device, dtype, vocab):
    """The two-stage greedy argmax gives torch's index (the first maximum) on fresh random rows,
    on rows whose maximum repeats inside a chunk and across chunks, and on constant rows."""
    from opforge.serve.sampling import _argmax_chunk, argmax_rows
    gen = torch.Generator().manual_seed(vocab)
    x = torch.randn(6, vocab, generator=gen).to(device, dtype)
    x[1, vocab // 3] = x[1, vocab - 1] = 50.0            # the same maximum in two chunks
    x[2, 7] = x[2, 8] = 50.0                             # ... twice in the first chunk
    x[3] = 1.0                                           # everything ties: index 0
    x[4, vocab - 1] = 50.0                               # the last position
    got = argmax_rows(x)
    assert torch.equal(got, x.argmax(-1))
    assert got[1].item() == vocab // 3 and got[2].item() == 7 and got[3].item() == 0 and got[4].item() == vocab - 1
    assert (_argmax_chunk(vocab) is None) == (vocab == 64)
