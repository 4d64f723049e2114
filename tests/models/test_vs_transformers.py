"""opforge.models vs Hugging Face transformers in float32 on CPU (skipped without transformers).

The checkpoint is made by transformers itself (random init, ``save_pretrained``), so names,
layouts and config fields are the ones real checkpoints have. Every parameter is random,
norm weights and biases included, the config's ``rms_norm_eps`` is not the default and
``head_dim`` differs from ``hidden_size / num_attention_heads``: a decoder that read the wrong
norm weight, dropped a bias, ignored the eps or scaled attention by the wrong head size would
not match.
"""
from __future__ import annotations

import pytest
import torch

from opforge.models import load
from opforge.models.config import SUPPORTED
from opforge.serve import generate
from opforge.testing import rel_error

transformers = pytest.importorskip("transformers")

_LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 32}
_HIDDEN, _HEADS, _HEAD_DIM = 64, 4, 24          # head_dim != hidden / heads (16)
_EPS = 1e-3                                     # not any architecture's default; the rows' mean square is ~0.02


def _hf_model(model_type: str, tmp_path):
    extra = {"rope_scaling": _LLAMA3_ROPE, "tie_word_embeddings": True} if model_type == "llama" else {}
    cfg = transformers.AutoConfig.for_model(
        model_type, vocab_size=96, hidden_size=_HIDDEN, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=_HEADS, num_key_value_heads=2, head_dim=_HEAD_DIM, max_position_embeddings=256,
        rope_theta=10000.0, rms_norm_eps=_EPS, **extra)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    with torch.no_grad():       # default init is tiny (norms 1, biases 0): randomise every parameter
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.normal_(0, 0.15)          # wide enough that logits are peaked and tokens differ
            elif name.endswith("norm.weight"):
                p.copy_(1 + 0.3 * torch.randn_like(p))
            else:
                p.normal_(0, 0.3)           # qwen2's q/k/v biases
    model.save_pretrained(tmp_path)
    return model


def test_every_supported_architecture_is_compared():
    assert set(SUPPORTED) == {"llama", "mistral", "qwen2", "qwen3"}


@pytest.mark.parametrize("model_type", SUPPORTED)
def test_float32_logits_and_greedy_tokens_equal_transformers(model_type, tmp_path):
    hf = _hf_model(model_type, tmp_path)
    assert hf.config.head_dim * hf.config.num_attention_heads != hf.config.hidden_size
    ours = load(tmp_path, device="cpu", dtype=torch.float32, max_seq_len=128)
    assert ours.config.rms_norm_eps == _EPS and ours.config.head_dim == _HEAD_DIM
    ids = torch.randint(0, 96, (1, 20), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ref = hf(ids).logits
        # an explicit mask: without one, generate takes every pad_token_id in the prompt for padding
        hf.generation_config.eos_token_id = None            # ours has no stop ids here either
        hf_tokens = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=32, do_sample=False,
                                pad_token_id=0)[0, 20:].tolist()
    assert len(hf_tokens) == 32
    got = ours.forward(ids)
    err = rel_error(got, ref)
    assert err <= 1e-4, err
    assert ref.std() > 0.5                       # real logits, not near zero
    assert generate(ours, ids, 32)[0] == hf_tokens
