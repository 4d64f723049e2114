"""Quantizing while loading, and QuantizedWeight values saved and loaded back exactly."""
from __future__ import annotations

import json
import warnings

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

import opforge


def _llama_like(k: int = 256) -> dict:
    return {
        "model.embed_tokens.weight": torch.randn(40, k, dtype=torch.bfloat16),
        "model.layers.0.self_attn.q_proj.weight": torch.randn(64, k, dtype=torch.bfloat16),
        "model.layers.0.mlp.down_proj.weight": torch.randn(k, 128, dtype=torch.bfloat16),
        "model.layers.0.input_layernorm.weight": torch.rand(k, dtype=torch.bfloat16),
        "model.layers.0.self_attn.q_proj.bias": torch.randn(64, dtype=torch.bfloat16),
        "lm_head.weight": torch.randn(40, k, dtype=torch.bfloat16),
    }


def _same_qw(a, b) -> None:
    assert isinstance(a, opforge.QuantizedWeight) and isinstance(b, opforge.QuantizedWeight)
    assert (a.shape, a.bits, a.group_size, a.symmetric) == (b.shape, b.bits, b.group_size, b.symmetric)
    assert torch.equal(a.codes(), b.codes())
    assert a.scales.dtype == b.scales.dtype and torch.equal(a.scales, b.scales)
    if not a.symmetric:
        assert torch.equal(a.zeros, b.zeros)
    assert torch.equal(a.dequantize(torch.float64), b.dequantize(torch.float64))


@pytest.mark.parametrize("quantize, bits, symmetric", [("int4", 4, False), ("int8", 8, True)])
def test_quantize_on_load_matches_quantize_weight(tmp_path, quantize, bits, symmetric):
    state = _llama_like()
    save_file(state, str(tmp_path / "m.safetensors"))
    got = opforge.load_safetensors(tmp_path / "m.safetensors", dtype=torch.float16, quantize=quantize,
                                   group_size=64, symmetric=symmetric)
    quantized = {"model.layers.0.self_attn.q_proj.weight", "model.layers.0.mlp.down_proj.weight"}
    for name, t in state.items():
        if name in quantized:
            _same_qw(got[name], opforge.quantize_weight(t.to(torch.float16), bits, 64, symmetric))
            err = (got[name].dequantize(torch.float64) - t.double()).norm() / t.double().norm()
            assert err < (0.1 if bits == 4 else 0.01), (name, err)
        else:
            assert torch.equal(got[name], t.to(torch.float16)), name


def test_quantize_filter_exclude_and_undividable_k(tmp_path):
    state = _llama_like()
    state["model.layers.0.odd.weight"] = torch.randn(8, 100)  # K = 100: no group of 64 divides it
    save_file(state, str(tmp_path / "m.safetensors"))
    p = tmp_path / "m.safetensors"
    with pytest.warns(UserWarning, match=r"1 weight\(s\) left unquantized.*odd\.weight"):
        got = opforge.load_safetensors(p, quantize="int4", group_size=64)
    assert torch.equal(got["model.layers.0.odd.weight"], state["model.layers.0.odd.weight"])
    got = opforge.load_safetensors(p, quantize="int4", group_size=64, quantize_exclude=("embed",),
                                   skip="*.odd.weight")
    assert isinstance(got["lm_head.weight"], opforge.QuantizedWeight)
    assert not isinstance(got["model.embed_tokens.weight"], opforge.QuantizedWeight)
    seen = []

    def only_down(name, meta):
        seen.append((name, meta.device.type, tuple(meta.shape)))
        return "down_proj" in name

    got = opforge.load_safetensors(p, quantize="int8", group_size=64, quantize_filter=only_down)
    assert [n for n, v in got.items() if isinstance(v, opforge.QuantizedWeight)] == ["model.layers.0.mlp.down_proj.weight"]
    assert ("model.layers.0.mlp.down_proj.weight", "meta", (256, 128)) in seen


def test_save_load_round_trip_is_exact(tmp_path):
    w = torch.randn(64, 256)
    state = {
        "a.weight": opforge.quantize_weight(w, bits=4, group_size=64),
        "b.weight": opforge.quantize_weight(w.to(torch.bfloat16), bits=8, group_size=128, symmetric=True),
        "c.weight": opforge.quantize_weight(w.half(), bits=4, group_size=-1, symmetric=True),
        "a.bias": torch.randn(64, dtype=torch.bfloat16),
        "norm.weight": torch.rand(256),
    }
    p = tmp_path / "q.safetensors"
    opforge.save_safetensors(state, p)
    with safe_open(str(p), framework="pt") as f:  # the documented key scheme
        keys = set(f.keys())
        meta = json.loads(f.metadata()["opforge.quantized"])
    assert {"a.weight/qweight", "a.weight/scales", "a.weight/zeros", "b.weight/qweight", "b.weight/scales"} <= keys
    assert "b.weight/zeros" not in keys
    assert meta["b.weight"] == {"bits": 8, "group_size": 128, "out_features": 64, "in_features": 256}
    got = opforge.load_safetensors(p, dtype=torch.float16)
    assert set(got) == set(state)
    for k in ("a.weight", "b.weight", "c.weight"):
        _same_qw(got[k], state[k])  # dtype= does not touch quantized weights
    assert torch.equal(got["a.bias"], state["a.bias"].half())
    assert set(opforge.load_safetensors(p, skip="a.*")) == {"b.weight", "c.weight", "norm.weight"}


def test_loaded_quantized_weights_go_into_quant_linear(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(128, 32), torch.nn.Linear(32, 16))
    qmodel = torch.nn.Sequential(opforge.nn.QuantLinear.from_linear(model[0], bits=4, group_size=64),
                                 opforge.nn.QuantLinear.from_linear(model[1], bits=4, group_size=32))
    other = torch.nn.Sequential(torch.nn.Linear(128, 32), torch.nn.Linear(32, 16))
    state = {"0.weight": opforge.quantize_weight(other[0].weight.detach(), 4, 64), "0.bias": other[0].bias.detach(),
             "1.weight": opforge.quantize_weight(other[1].weight.detach(), 4, 32), "1.bias": other[1].bias.detach()}
    opforge.save_safetensors(state, tmp_path / "q.safetensors")
    opforge.io.load_into(qmodel, tmp_path / "q.safetensors")
    _same_qw(qmodel[0].weight, state["0.weight"])
    _same_qw(qmodel[1].weight, state["1.weight"])
    assert torch.equal(qmodel[1].bias, state["1.bias"])
    x = torch.randn(3, 128)
    ref = torch.nn.functional.linear(x, state["0.weight"].dequantize())
    ref = torch.nn.functional.linear(ref + state["0.bias"], state["1.weight"].dequantize(), state["1.bias"])
    assert torch.allclose(qmodel(x), ref, rtol=1e-4, atol=1e-4)


def test_quantized_into_module_applies_nothing_on_mismatch(tmp_path):
    qmodel = torch.nn.Sequential(opforge.nn.QuantLinear.from_linear(torch.nn.Linear(128, 32), bits=4, group_size=64),
                                 opforge.nn.QuantLinear.from_linear(torch.nn.Linear(32, 16), bits=4, group_size=32))
    before = {k: v.clone() for k, v in qmodel.state_dict().items()}
    state = {"0.weight": opforge.quantize_weight(torch.randn(32, 128), 4, 64), "0.bias": torch.randn(32),
             "1.weight": opforge.quantize_weight(torch.randn(16, 32), 8, 32), "1.bias": torch.randn(16)}
    opforge.save_safetensors(state, tmp_path / "q.safetensors")
    with pytest.raises(opforge.SafetensorsError, match=r"'1\.weight'.*disagrees"):
        opforge.io.load_into(qmodel, tmp_path / "q.safetensors")
    for k, v in qmodel.state_dict().items():
        assert torch.equal(v, before[k]), k
    with pytest.raises(opforge.SafetensorsError, match="holds no QuantizedWeight"):
        opforge.io.load_into(torch.nn.Sequential(torch.nn.Linear(128, 32), torch.nn.Linear(32, 16)),
                             tmp_path / "q.safetensors")


def test_quantize_warning_is_silent_when_everything_fits(tmp_path):
    save_file(_llama_like(), str(tmp_path / "m.safetensors"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        opforge.load_safetensors(tmp_path / "m.safetensors", quantize="int4", group_size=128)
