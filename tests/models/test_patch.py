"""opforge.patch on transformers models: same logits, per instance only."""
from __future__ import annotations

import pytest
import torch

import opforge
from opforge.models.testing import TINY_LLAMA
from opforge.testing import rel_error

transformers = pytest.importorskip("transformers")


def _logits_before_and_after_patch(model, ids):
    """(logits unpatched, logits patched, the patch report, opforge ops traced in the patched forward)."""
    with torch.no_grad():
        before = model(ids).logits
        report = opforge.patch(model)
        with opforge.trace() as t:
            after = model(ids).logits
    return before, after, report, {e.op for e in t}


def _llama(model_type="llama", seed=0, config=None):
    torch.manual_seed(seed)
    cfg = config or transformers.AutoConfig.for_model(
        **{k: v for k, v in dict(TINY_LLAMA, model_type=model_type).items() if k != "architectures"})
    model = transformers.AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return model


@pytest.mark.parametrize("model_type", ["llama", "qwen2", "mistral", "qwen3"])
def test_patched_logits_equal_unpatched(model_type):
    model = _llama(model_type)
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(1))
    before, after, report, ops = _logits_before_and_after_patch(model, ids)
    assert rel_error(after, before) <= 1e-5
    assert {"rms_norm", "swiglu", "rotary_embedding", "attention"} <= ops, ops
    assert report.replaced["attention implementation -> opforge"] == 1
    assert sum(n for k, n in report.replaced.items() if k.endswith("(swiglu)")) == 2


def test_patched_generation_with_cache_equals_unpatched():
    model = _llama()
    ids = torch.randint(0, 64, (1, 8), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        before = model.generate(ids, max_new_tokens=12, do_sample=False, pad_token_id=0)
        opforge.patch(model)
        after = model.generate(ids, max_new_tokens=12, do_sample=False, pad_token_id=0)
    assert torch.equal(before, after)


def test_patch_leaves_other_models_untouched():
    a = _llama(seed=0)
    b = _llama(seed=1, config=a.config)        # shares a's config object
    ids = torch.randint(0, 64, (1, 9), generator=torch.Generator().manual_seed(3))
    opforge.patch(a)
    assert b.config._attn_implementation != "opforge"
    assert a.config is not b.config
    with torch.no_grad(), opforge.trace() as t:
        b(ids)
    assert len(t) == 0, [e.op for e in t]      # no opforge op ran inside the unpatched model
    c = _llama(seed=2)                          # a model created after the patch
    with torch.no_grad(), opforge.trace() as t:
        c(ids)
    assert len(t) == 0


def test_gpt2_layernorm_and_gelu():
    cfg = transformers.GPT2Config(vocab_size=50, n_positions=32, n_embd=32, n_layer=2, n_head=4)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    ids = torch.randint(0, 50, (1, 10), generator=torch.Generator().manual_seed(4))
    before, after, report, ops = _logits_before_and_after_patch(model, ids)
    assert report.replaced["LayerNorm"] == 5
    assert any(k.startswith("NewGELUActivation") for k in report.replaced)
    assert "attention/rotary" in report.left
    assert {"layer_norm", "gelu"} <= ops
    assert rel_error(after, before) <= 1e-5


@pytest.mark.parametrize("name", ["cache", "past_key_values", "past_key_value"])
def test_patched_attention_takes_the_cache_under_each_transformers_name(name):
    """transformers 5 passes the KV cache as ``cache``, 4.56-4.57 as ``past_key_values``, 4.53-4.55
    as ``past_key_value``: the patched attention updates it under each name, and the tokens
    generated with it equal those of a full forward without a cache."""
    model = _llama()
    opforge.patch(model)
    ids = torch.randint(0, 64, (1, 6), generator=torch.Generator().manual_seed(4))
    attn = model.model.layers[0].self_attn
    forward = attn.forward
    seen = []

    def renamed(hidden_states, *args, **kwargs):
        cache = kwargs.pop("cache", None) or kwargs.pop("past_key_values", None) or kwargs.pop("past_key_value", None)
        seen.append(cache is not None)
        return forward(hidden_states, *args, **{name: cache}, **kwargs)

    attn.forward = renamed
    with torch.no_grad():
        cached = model.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=0, min_new_tokens=4)
        full = ids
        for _ in range(4):
            logits = model(full, use_cache=False).logits
            full = torch.cat([full, logits[:, -1:].argmax(-1)], dim=1)
    assert any(seen) and torch.equal(cached, full)
