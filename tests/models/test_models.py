"""opforge.models: own-consistency (always) and agreement with transformers (when importable)."""
from __future__ import annotations

import json
import os

import pytest
import torch

import opforge
from opforge.models import UnsupportedModelError, load
from opforge.models.testing import TINY_LLAMA, random_weights, tiny_decoder, write_checkpoint


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


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
    assert _rel(got, full[23:40]) < 1e-5
    assert full.abs().max() > 1.0     # real values, not zeros


def test_forward_matches_float64_own_model():
    m32 = tiny_decoder(max_seq_len=64)
    m64 = tiny_decoder(max_seq_len=64, dtype=torch.float64)
    ids = torch.randint(0, 64, (2, 20), generator=torch.Generator().manual_seed(2))
    assert _rel(m32.forward(ids), m64.forward(ids)) < 1e-5


def test_batched_prompts_of_different_lengths_equal_single_runs(model):
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 64, (n,), generator=g).tolist() for n in (5, 17, 1, 11)]
    batched = model.generate(prompts, 12)
    singles = [model.generate(p, 12)[0] for p in prompts]
    assert batched == singles
    assert len({tuple(s) for s in singles}) > 1


def test_greedy_generation_equals_argmax_of_full_forward(model):
    prompt = [5, 9, 11, 3]
    out = model.generate(prompt, 10)[0]
    seq = list(prompt)
    for _ in range(10):
        seq.append(int(model.forward(torch.tensor([seq]))[0, -1].argmax()))
    assert out == seq[len(prompt):]


def test_sampling_is_reproducible_with_a_seeded_generator(model):
    def run(seed):
        return model.generate([[1, 2, 3], [7, 8]], 16, temperature=1.0, top_k=20, top_p=0.9,
                              generator=torch.Generator().manual_seed(seed))
    assert run(7) == run(7)
    assert run(7) != run(8)


def test_top_k_one_is_greedy(model):
    greedy = model.generate([4, 5, 6], 8)
    sampled = model.generate([4, 5, 6], 8, temperature=0.8, top_k=1, generator=torch.Generator().manual_seed(0))
    assert greedy == sampled


def test_stop_ids_and_stream(model):
    first = model.generate([4, 5, 6], 8)[0]
    seen = []
    out = model.generate([4, 5, 6], 8, stop_ids=[first[3]], stream=lambda b, t: seen.append((b, t)))
    stop_at = first.index(first[3])
    assert out[0] == first[:stop_at + 1]
    assert seen == [(0, t) for t in out[0]]


def test_trace_names_every_op_of_a_decode_step(model):
    model.prefill(torch.tensor([[1, 2, 3]]), torch.tensor([3]))
    with opforge.trace() as t:
        model.decode_step(torch.tensor([4]), model.cache_seqlens[:1])
    ops = {e.op for e in t}
    assert {"rms_norm", "add_rms_norm", "swiglu", "rotary_embedding", "kv_cache_append",
            "decode_attention", "linear"} <= ops


@pytest.mark.parametrize("model_type", ["mistral", "qwen2", "qwen3"])
def test_other_families_load_and_decode_consistently(tmp_path, model_type):
    config = dict(TINY_LLAMA, model_type=model_type, architectures=[f"{model_type.title()}ForCausalLM"])
    m = load(write_checkpoint(str(tmp_path), config, random_weights(config)), device="cpu",
             dtype=torch.float32, max_seq_len=64)
    ids = torch.randint(0, 64, (1, 12), generator=torch.Generator().manual_seed(4))
    full = m.forward(ids)[0, -1]
    m.prefill(ids[:, :11], torch.tensor([11]))
    step = m.decode_step(ids[:, 11], m.cache_seqlens[:1])[0]
    assert _rel(step, full) < 1e-5


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


def test_quantize_without_quantized_linear_says_so(tmp_path):
    if opforge.models.ops.have("quantize_weight"):
        m = tiny_decoder(quantize="int8", max_seq_len=32, group_size=32)
        full = tiny_decoder(max_seq_len=32)
        ids = torch.tensor([[1, 2, 3, 4]])
        assert _rel(m.forward(ids), full.forward(ids)) < 5e-2
        assert type(m.layers[0].qkv).__name__ == "QuantizedWeight" and type(m.layers[0].down).__name__ == "QuantizedWeight"
        assert m.weight_bytes() < full.weight_bytes()
        with pytest.warns(UserWarning, match="stay dense"):        # K=32 weights with 64-wide groups
            tiny_decoder(quantize="int8", max_seq_len=32, group_size=64)
        m4 = tiny_decoder(quantize="int4", max_seq_len=32, group_size=32)
        assert _rel(m4.forward(ids), full.forward(ids)) < 0.5
        assert len(m4.generate([1, 2, 3], 4)[0]) == 4
    else:
        with pytest.raises(NotImplementedError, match="quantize_weight"):
            tiny_decoder(quantize="int8")


def test_prompt_too_long_for_the_cache_is_refused(model):
    with pytest.raises(ValueError, match="max_seq_len"):
        model.generate(list(range(60)) * 2, 10)


def test_llama3_rope_scaling_matches_its_definition():
    from opforge.models.config import parse_config, rope_tables
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64}
    c = parse_config(dict(TINY_LLAMA, head_dim=64, hidden_size=256, rope_theta=500000.0, rope_scaling=scaling))
    cos, sin = rope_tables(c, 2, torch.device("cpu"))
    inv = 1.0 / 500000.0 ** (torch.arange(0, 64, 2, dtype=torch.float64) / 64)
    wavelength = 2 * torch.pi / inv
    got = torch.atan2(sin[1].double(), cos[1].double())
    assert torch.allclose(got[wavelength < 16], inv[wavelength < 16], rtol=1e-6)          # short: kept
    assert torch.allclose(got[wavelength > 64], inv[wavelength > 64] / 8, rtol=1e-6)      # long: / factor
    mid = (wavelength >= 16) & (wavelength <= 64)
    assert mid.any() and ((got[mid] < inv[mid]) & (got[mid] > inv[mid] / 8)).all()


def test_device_config_cpu():
    cfg = opforge.device_config("cpu")
    assert cfg.dtype == torch.float32 and not cfg.graph_capture


# ---- against Hugging Face transformers ------------------------------------------------------------

def _hf_tiny(tmp_path, config_dict):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.AutoConfig.for_model(**{k: v for k, v in config_dict.items() if k != "architectures"})
    hf = transformers.AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            p.copy_(1.0 + 0.1 * torch.randn_like(p) if "norm" in name else 0.2 * torch.randn_like(p))
    hf.generation_config.eos_token_id = None        # 32 greedy steps, EOS or not
    hf.save_pretrained(str(tmp_path))
    return hf


@pytest.mark.parametrize("model_type", ["llama", "qwen2", "mistral", "qwen3"])
def test_greedy_tokens_and_logits_equal_transformers(tmp_path, model_type):
    config = dict(TINY_LLAMA, model_type=model_type)
    hf = _hf_tiny(tmp_path, config)
    ours = load(str(tmp_path), device="cpu", dtype=torch.float32, max_seq_len=64)
    ids = torch.randint(0, 64, (1, 10), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        hf_logits = hf(ids).logits
        hf_tokens = hf.generate(ids, max_new_tokens=32, do_sample=False, pad_token_id=0)[0, 10:].tolist()
    assert _rel(ours.forward(ids), hf_logits) <= 1e-4
    assert ours.generate(ids, 32)[0] == hf_tokens


def test_llama3_scaled_rope_and_tied_embeddings_equal_transformers(tmp_path):
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 16}
    hf = _hf_tiny(tmp_path, dict(TINY_LLAMA, rope_scaling=scaling, rope_theta=500000.0, tie_word_embeddings=True))
    ours = load(str(tmp_path), device="cpu", dtype=torch.float32, max_seq_len=128)
    ids = torch.randint(0, 64, (2, 60), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        assert _rel(ours.forward(ids), hf(ids).logits) <= 1e-4


# ---- GPU ---------------------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_graph_replay_equals_eager_generation():
    m = tiny_decoder(device="cuda", dtype=torch.float32, max_batch=2)
    prompts = [[1, 2, 3, 4, 5], [6, 7]]
    assert m.generate(prompts, 20, graphs=True) == m.generate(prompts, 20, graphs=False)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("ctx", [1, 37, 100])
def test_graph_replay_equals_eager_step(ctx):
    from opforge.models.generate import _GraphStep
    m = tiny_decoder(device="cuda", dtype=torch.bfloat16, max_batch=1)
    ids = torch.randint(0, 64, (1, ctx + 1), generator=torch.Generator().manual_seed(ctx))
    m.prefill(ids[:, :ctx], torch.tensor([ctx]))
    token = ids[:, ctx].cuda()
    eager = m.decode_step(token, m.cache_seqlens[:1]).clone()
    assert torch.equal(_GraphStep(m, 1)(token), eager)


_NATIVE = ("attention", "decode_attention", "rotary_embedding", "kv_cache_append")


@pytest.mark.skipif(not all(opforge.models.ops.have(n) for n in _NATIVE) or not torch.cuda.is_available()
                    and os.environ.get("TRITON_INTERPRET") != "1",
                    reason="needs the attention/rotary ops merged, and a GPU or Triton's interpreter")
def test_triton_kernels_compose_with_the_decoder_layouts():
    """The Triton kernels (interpreter on CPU) on the decoder's strided views equal the torch path."""
    m = tiny_decoder(max_seq_len=32, max_batch=2, device="cuda" if torch.cuda.is_available() else "cpu")
    ids = torch.tensor([[3, 4, 5, 6, 7, 8], [9, 10, 11, 12, 13, 14]])
    prompts = [[1, 2, 3], [4, 5, 6, 7]]
    with opforge.backend("torch"):
        ref, ref_tokens = m.forward(ids), m.generate(prompts, 4, graphs=False)
    with opforge.backend("triton"), opforge.trace() as t:
        got, tokens = m.forward(ids), m.generate(prompts, 4, graphs=False)
    assert _rel(got, ref) < 1e-5
    assert tokens == ref_tokens
    ran = {e.op for e in t if e.backend == "triton"}
    assert set(_NATIVE) | {"rms_norm", "add_rms_norm", "swiglu"} <= ran, ran
