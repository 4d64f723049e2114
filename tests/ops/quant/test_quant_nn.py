"""opforge.nn.QuantLinear and opforge.quantize_model."""
import pytest
import torch

import opforge
from opforge.nn import QuantLinear, quantize_model
from opforge.testing import DEVICE, TOLERANCE, rel_error


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("bits", [4, 8])
def test_quant_linear_forward_is_linear_of_its_weight(bias, bits):
    lin = torch.nn.Linear(256, 64, bias=bias, device=DEVICE, dtype=torch.float16)
    q = QuantLinear.from_linear(lin, bits=bits, group_size=64)
    x = torch.randn(2, 5, 256, device=DEVICE, dtype=torch.float16)
    with opforge.trace() as t:
        y = q(x)
    assert y.shape == (2, 5, 64) and y.dtype == torch.float16
    ref = x.double() @ q.weight.dequantize(torch.float64).T + (lin.bias.double() if bias else 0)
    assert rel_error(y, ref) < TOLERANCE[torch.float16]
    assert t[0].op == "linear"
    # the format's own error against the dense layer: reported, loosely bounded
    dense = lin(x).double()
    err = rel_error(y, dense)
    print(f"int{bits} g64 QuantLinear vs nn.Linear: {err:.4f}")
    assert err < (0.2 if bits == 4 else 0.02)


def test_state_dict_and_to():
    lin = torch.nn.Linear(128, 32)
    q = QuantLinear.from_linear(lin, bits=4, group_size=32)
    sd = q.state_dict()
    assert set(sd) == {"qweight", "scales_t", "zeros_t", "bias"}
    fresh = QuantLinear(opforge.quantize_weight(torch.randn(32, 128), 4, 32), torch.zeros(32))
    fresh.load_state_dict(sd)
    x = torch.randn(3, 128)
    assert torch.equal(fresh(x), q(x))
    assert q.to("cpu").weight.device.type == "cpu"
    assert "bits=4" in repr(q)


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.block = torch.nn.ModuleDict({"up": torch.nn.Linear(64, 128), "down": torch.nn.Linear(128, 64)})
        self.lm_head = torch.nn.Linear(64, 100, bias=False)

    def forward(self, x):
        return self.lm_head(self.block["down"](torch.relu(self.block["up"](x))))


def test_quantize_model_replaces_in_place_and_reports():
    model = Tiny()
    x = torch.randn(4, 64)
    before = model(x)
    done = quantize_model(model, bits=8, group_size=32)
    assert [r.name for r in done] == ["block.up", "block.down"]
    assert isinstance(model.block["up"], QuantLinear) and isinstance(model.lm_head, torch.nn.Linear)
    up = done[0]
    assert up.bytes_before == (128 * 64 + 128) * 4
    assert up.bytes_after == 128 * 64 + 2 * 128 * 2 * 2 + 128 * 4
    assert rel_error(model(x), before.double()) < 0.03


def test_quantize_model_refuses_before_replacing_anything():
    model = Tiny()
    model.block["down"] = torch.nn.Linear(96, 64)     # K=96 is not a multiple of 64
    with pytest.raises(ValueError, match="block.down .*not a multiple of group_size=64"):
        quantize_model(model, bits=4, group_size=64)
    assert isinstance(model.block["up"], torch.nn.Linear)


def test_quantize_model_skip_by_full_name():
    model = Tiny()
    done = quantize_model(model, bits=4, group_size=64, skip=("block.up",))
    assert [r.name for r in done] == ["block.down", "lm_head"]


def test_module_dtype_casts_leave_the_quantized_weight_alone():
    model = torch.nn.Sequential(torch.nn.Linear(128, 32))
    quantize_model(model, bits=4, group_size=32)
    before = model[0].weight.dequantize()
    model.to(torch.bfloat16)
    assert torch.equal(model[0].weight.dequantize(), before) and model[0].weight.scales.dtype == torch.float16
    assert model[0].bias.dtype == torch.bfloat16
    x = torch.randn(2, 128, dtype=torch.bfloat16)
    ref = x.double() @ before.double().T + model[0].bias.double()
    assert rel_error(model(x), ref) < TOLERANCE[torch.bfloat16]


def test_loading_scales_of_another_width_is_refused_not_converted():
    lin = torch.nn.Linear(256, 32)
    q16 = opforge.nn.QuantLinear.from_linear(lin, bits=4, group_size=128)        # float16 scales (int16 bits)
    q32 = opforge.nn.QuantLinear.from_linear(lin, bits=4, group_size=128)
    q32.scales_t = q32.scales_t.view(torch.float16).float().view(torch.int32)      # float32 scales, same values
    q32.zeros_t = q32.zeros_t.view(torch.float16).float().view(torch.int32)
    q32.scale_dtype = torch.float32
    before = q32.scales_t.clone()
    with pytest.raises(RuntimeError, match="a copy would change the weight"):
        q32.load_state_dict(q16.state_dict())
    assert torch.equal(q32.scales_t, before)
    x = torch.randn(2, 256)
    torch.testing.assert_close(q32(x), q16(x), rtol=1e-3, atol=1e-3)               # both still the same weight
