"""GPTQ and AWQ checkpoints, written here from known integer codes by packers written from the
formats' descriptions, come back as QuantizedWeight values that dequantize exactly."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

import opforge
from opforge.io import prequant
from packers import AWQ_SLOT_COLUMNS, awq_tensors, gptq_tensors, pack_cols, pack_rows

PREFIX = "model.layers.0.mlp.up_proj"


def _layer(n: int, k: int, group: int, bits: int, zero_low: int = 0):
    groups = k // group
    codes = torch.randint(0, 2**bits, (n, k))
    zeros = torch.randint(zero_low, 2**bits, (n, groups))
    scales = (torch.rand(n, groups) * 0.05 + 1e-3).to(torch.float16)
    return codes, zeros, scales


def _exact(codes, zeros, scales, group):
    """The weight the checkpoint represents, in float64: (code - zero) * scale per group."""
    z = zeros.to(torch.float64).repeat_interleave(group, dim=1)
    s = scales.to(torch.float64).repeat_interleave(group, dim=1)
    return (codes.to(torch.float64) - z) * s


def _save(folder, tensors: dict, config: dict | None = None) -> None:
    save_file(tensors, str(folder / "model.safetensors"))
    if config is not None:
        (folder / "config.json").write_text(json.dumps({"model_type": "llama", "quantization_config": config}))


def _check(qw, codes, zeros, scales, group):
    assert isinstance(qw, opforge.QuantizedWeight)
    assert qw.shape == tuple(codes.shape)
    assert torch.equal(qw.codes(), codes.to(torch.int32))
    assert torch.equal(qw.dequantize(torch.float64), _exact(codes, zeros, scales, group))
    assert torch.equal(qw.dequantize(torch.float32), _exact(codes, zeros, scales, group).to(torch.float32))


def test_packers_match_hand_computed_words():
    assert pack_cols(torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8]]), 4).item() == 0x87654321 - 2**32
    assert pack_rows(torch.tensor([[1], [2], [3], [4], [5], [6], [7], [8]]), 4).item() == 0x87654321 - 2**32
    assert pack_cols(torch.arange(8).view(1, 8), 4, AWQ_SLOT_COLUMNS).item() == 0x75316420
    assert pack_cols(torch.tensor([[0x12, 0x34, 0x56, 0x78]]), 8).item() == 0x78563412


@pytest.mark.parametrize("bits", [4, 8])
def test_unpack_inverts_the_packers(bits):
    codes = torch.randint(0, 2**bits, (64, 24))
    assert torch.equal(prequant.unpack(pack_rows(codes, bits), bits, 0), codes.to(torch.int32))
    assert torch.equal(prequant.unpack(pack_cols(codes, bits), bits, 1), codes.to(torch.int32))
    if bits == 4:
        assert torch.equal(prequant.unpack(pack_cols(codes, 4, AWQ_SLOT_COLUMNS), 4, 1, prequant.AWQ_ORDER),
                           codes.to(torch.int32))


@pytest.mark.parametrize("bits, n, k, group", [(4, 48, 256, 128), (4, 16, 512, 64), (8, 24, 128, 32),
                                               (4, 8, 96, 96)])
def test_gptq_v1_default(tmp_path, bits, n, k, group):
    codes, zeros, scales = _layer(n, k, group, bits, zero_low=1)  # v1 stores zero - 1
    t = {f"{PREFIX}.{name}": v for name, v in gptq_tensors(codes, zeros, scales, bits, v1=True).items()}
    bias = torch.randn(n, dtype=torch.float16)
    t[f"{PREFIX}.bias"] = bias
    t["model.norm.weight"] = torch.randn(k, dtype=torch.float16)
    _save(tmp_path, t)
    got = opforge.load_safetensors(tmp_path, dtype=torch.float32)
    assert set(got) == {f"{PREFIX}.weight", f"{PREFIX}.bias", "model.norm.weight"}
    _check(got[f"{PREFIX}.weight"], codes, zeros, scales, group)
    assert got[f"{PREFIX}.weight"].scales.dtype == torch.float16  # scales kept exactly
    assert torch.equal(got[f"{PREFIX}.bias"], bias.float())


def test_gptq_v2_by_argument_and_by_config(tmp_path):
    codes, zeros, scales = _layer(32, 256, 128, 4, zero_low=0)
    zeros[0, 0] = 0
    t = {f"{PREFIX}.{name}": v for name, v in gptq_tensors(codes, zeros, scales, 4, v1=False).items()}
    _save(tmp_path, t)
    _check(opforge.load_safetensors(tmp_path, gptq_format="v2")[f"{PREFIX}.weight"], codes, zeros, scales, 128)
    v1_reading = opforge.load_safetensors(tmp_path)[f"{PREFIX}.weight"]  # the default adds 1 to every zero
    _check(v1_reading, codes, zeros + 1, scales, 128)
    _save(tmp_path, t, {"quant_method": "gptq", "bits": 4, "group_size": 128, "checkpoint_format": "gptq_v2"})
    _check(opforge.load_safetensors(tmp_path)[f"{PREFIX}.weight"], codes, zeros, scales, 128)


def test_gptq_act_order_is_refused_clearly(tmp_path):
    codes, zeros, scales = _layer(16, 256, 128, 4, zero_low=1)
    t = {f"{PREFIX}.{name}": v for name, v in gptq_tensors(codes, zeros, scales, 4).items()}
    t[f"{PREFIX}.g_idx"] = t[f"{PREFIX}.g_idx"][torch.randperm(256)]
    _save(tmp_path, t)
    with pytest.raises(opforge.SafetensorsError, match=r"g_idx.*act-order.*desc_act=False") as e:
        opforge.load_safetensors(tmp_path)
    assert e.value.tensor == f"{PREFIX}.g_idx"


def test_gptq_without_g_idx_and_parts_in_different_shards(tmp_path):
    codes, zeros, scales = _layer(16, 128, 64, 4, zero_low=1)
    parts = gptq_tensors(codes, zeros, scales, 4, g_idx=False)
    save_file({f"{PREFIX}.qweight": parts["qweight"], "a": torch.ones(2)}, str(tmp_path / "s1.safetensors"))
    save_file({f"{PREFIX}.qzeros": parts["qzeros"], f"{PREFIX}.scales": parts["scales"]},
              str(tmp_path / "s2.safetensors"))
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
        f"{PREFIX}.qweight": "s1.safetensors", "a": "s1.safetensors",
        f"{PREFIX}.qzeros": "s2.safetensors", f"{PREFIX}.scales": "s2.safetensors"}}))
    got = opforge.load_safetensors(tmp_path)
    _check(got[f"{PREFIX}.weight"], codes, zeros, scales, 64)


@pytest.mark.parametrize("config", [None, {"quant_method": "awq", "bits": 4, "group_size": 64, "version": "gemm"}])
def test_awq(tmp_path, config):
    codes, zeros, scales = _layer(64, 256, 64, 4, zero_low=0)
    t = {f"{PREFIX}.{name}": v for name, v in awq_tensors(codes, zeros, scales).items()}
    _save(tmp_path, t, config)
    _check(opforge.load_safetensors(tmp_path)[f"{PREFIX}.weight"], codes, zeros, scales, 64)


def test_awq_gemv_layout_is_refused(tmp_path):
    codes, zeros, scales = _layer(16, 128, 64, 4)
    t = {f"{PREFIX}.{name}": v for name, v in awq_tensors(codes, zeros, scales).items()}
    _save(tmp_path, t, {"quant_method": "awq", "bits": 4, "group_size": 64, "version": "gemv"})
    with pytest.raises(opforge.SafetensorsError, match="GEMM layout"):
        opforge.load_safetensors(tmp_path)


def test_incomplete_or_inconsistent_layers(tmp_path):
    codes, zeros, scales = _layer(16, 128, 64, 4, zero_low=1)
    parts = gptq_tensors(codes, zeros, scales, 4)
    _save(tmp_path, {f"{PREFIX}.qweight": parts["qweight"], f"{PREFIX}.scales": parts["scales"]})
    with pytest.raises(opforge.SafetensorsError, match=r"lacks .*up_proj\.qzeros"):
        opforge.load_safetensors(tmp_path)
    _save(tmp_path, {f"{PREFIX}.qweight": parts["qweight"][:, :8].contiguous(), f"{PREFIX}.qzeros": parts["qzeros"],
                     f"{PREFIX}.scales": parts["scales"]})
    with pytest.raises(opforge.SafetensorsError, match="neither GPTQ nor AWQ shapes"):
        opforge.load_safetensors(tmp_path)
    _save(tmp_path, {f"{PREFIX}.qweight": parts["qweight"], f"{PREFIX}.qzeros": parts["qzeros"][:, :1].contiguous(),
                     f"{PREFIX}.scales": parts["scales"]}, {"quant_method": "gptq", "bits": 4})
    with pytest.raises(opforge.SafetensorsError, match="GPTQ shapes disagree"):
        opforge.load_safetensors(tmp_path, gptq_format="v1")
    _save(tmp_path, {f"{PREFIX}.qweight": parts["qweight"][:3], f"{PREFIX}.qzeros": parts["qzeros"],
                     f"{PREFIX}.scales": parts["scales"]})  # K = 24 in 2 groups of 12
    with pytest.raises(opforge.SafetensorsError, match="cannot represent.*group_size"):
        opforge.load_safetensors(tmp_path)
    _save(tmp_path, {f"{PREFIX}.qweight": parts["qweight"].float(), f"{PREFIX}.qzeros": parts["qzeros"],
                     f"{PREFIX}.scales": parts["scales"]})
    with pytest.raises(opforge.SafetensorsError, match="int32"):
        opforge.load_safetensors(tmp_path)


def test_skip_applies_to_the_output_name(tmp_path):
    codes, zeros, scales = _layer(16, 128, 64, 4, zero_low=1)
    t = {f"{PREFIX}.{name}": v for name, v in gptq_tensors(codes, zeros, scales, 4).items()}
    t["other"] = torch.ones(3)
    _save(tmp_path, t)
    assert set(opforge.load_safetensors(tmp_path, skip=f"{PREFIX}.weight")) == {"other"}
