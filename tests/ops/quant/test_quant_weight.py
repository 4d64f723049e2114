"""QuantizedWeight: exact from_codes/dequantize, packing, quantize_weight's grid, state_dict and errors."""
import pytest
import torch

import opforge
from opforge.ops.quant.weight import QuantizedWeight, pack_codes, unpack_codes, quantize_weight


def random_codes(n, k, bits):
    return torch.randint(0, 2 ** bits, (n, k), dtype=torch.int64)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("group_size", [16, 32, 128, -1])
@pytest.mark.parametrize("scale_dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("symmetric", [False, True])
def test_from_codes_dequantize_is_exact(bits, group_size, scale_dtype, symmetric):
    n, k = 24, 256
    group = k if group_size == -1 else group_size
    codes = random_codes(n, k, bits)
    scales = (torch.rand(n, k // group) * 0.1 + 0.01).to(scale_dtype)
    zeros = None if symmetric else (torch.rand(n, k // group) * 2 ** bits).to(scale_dtype)  # non-integer zeros too
    qw = QuantizedWeight.from_codes(codes.to(torch.int16), scales, zeros, bits, group_size)
    z = torch.full_like(scales, 2.0 ** (bits - 1)) if symmetric else zeros
    want = (codes.float().view(n, k // group, group) - z.float().unsqueeze(-1)) * scales.float().unsqueeze(-1)
    assert torch.equal(qw.dequantize(), want.view(n, k))
    assert torch.equal(qw.dequantize(torch.bfloat16), want.view(n, k).bfloat16())
    want64 = (codes.double().view(n, k // group, group) - z.double().unsqueeze(-1)) * scales.double().unsqueeze(-1)
    assert torch.equal(qw.dequantize(torch.float64), want64.view(n, k))
    assert torch.equal(qw.codes(), codes.int())
    assert qw.bits == bits and qw.group_size == group_size and qw.shape == (n, k) and qw.symmetric == symmetric


@pytest.mark.parametrize("bits", [4, 8])
def test_pack_unpack_round_trip(bits):
    codes = random_codes(5, 64, bits)
    packed = pack_codes(codes, bits)
    assert packed.dtype == (torch.int32 if bits == 4 else torch.uint8)
    assert packed.shape == ((5, 8) if bits == 4 else (5, 64))
    assert torch.equal(unpack_codes(packed, bits), codes.int())


def test_int4_word_layout():
    """Code 8j+i sits in bits 4i..4i+3 of word j (what the kernels unpack)."""
    codes = torch.tensor([[3, 0, 0, 0, 0, 0, 0, 9, 1, 2, 0, 0, 0, 0, 0, 0]])
    words = pack_codes(codes, 4)
    assert [w & 0xFFFFFFFF for w in words[0].tolist()] == [0x90000003, 0x21]


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("group_size", [32, 64, 128, -1])
@pytest.mark.parametrize("symmetric", [False, True])
def test_quantize_weight_grid(bits, group_size, symmetric):
    n, k = 32, 256
    w = torch.randn(n, k) * 0.05
    qw = quantize_weight(w, bits, group_size, symmetric)
    group = k if group_size == -1 else group_size
    assert qw.scales.shape == (n, k // group) and qw.scales.dtype == torch.float16
    codes = qw.codes()
    assert int(codes.min()) >= 0 and int(codes.max()) < 2 ** bits
    step = qw.scales.float().repeat_interleave(group, dim=1)
    err = (qw.dequantize() - w).abs()
    # round to nearest: half a step, except where the rounded zero pushes an extreme one code out
    assert bool((err <= step * 1.0 + 1e-7).all())
    assert float((err <= step * 0.5 + 1e-7).float().mean()) > 0.97
    if symmetric:
        assert qw.zeros is None
    else:
        assert torch.equal(qw.zeros, qw.zeros.round())          # integer zeros: 0 is exact
    print(f"int{bits} g{group_size} {'sym' if symmetric else 'asym'}: quantization error "
          f"{float((qw.dequantize() - w).norm() / w.norm()):.4f} (relative, Gaussian weights)")


def test_quantize_weight_keeps_float32_scales_outside_float16_range():
    w = torch.randn(8, 64) * 1e-7
    qw = quantize_weight(w, 8, 32)
    assert qw.scales.dtype == torch.float32
    assert float((qw.dequantize() - w).norm() / w.norm()) < 0.01


def test_quantize_zero_and_constant_groups():
    """An all-zero group and constant groups (of either sign) whose scale float16 holds exactly are exact."""
    w = torch.zeros(4, 64)
    w[1], w[2] = 15 * 2.0 ** -5, -15 * 2.0 ** -5
    qw = quantize_weight(w, 4, 32)
    assert torch.equal(qw.dequantize(), w)
    w[3] = 0.3   # not a float16 multiple: within half a float16 ulp of the scale, times 15
    assert float((quantize_weight(w, 4, 32).dequantize()[3] - 0.3).abs().max()) < 15 * 0.3 / 15 * 2 ** -11


def test_state_dict_round_trip_and_nbytes():
    qw = quantize_weight(torch.randn(16, 128), 4, 32)
    d = qw.state_dict()
    assert set(d) == {"qweight", "scales", "zeros", "bits", "group_size", "out_features", "in_features"}
    assert all(v.is_contiguous() for v in d.values() if isinstance(v, torch.Tensor))
    again = QuantizedWeight.from_state_dict(d)
    assert torch.equal(again.dequantize(), qw.dequantize())
    assert qw.nbytes == 16 * 128 // 2 + 2 * 16 * 4 * 2
    other = quantize_weight(torch.randn(8, 64), 8, -1, symmetric=True)
    other.load_state_dict(d)
    assert other.bits == 4 and torch.equal(other.dequantize(), qw.dequantize())
    assert qw.to("cpu") is qw
    assert "int4" in repr(qw) and "(16, 128)" in repr(qw)


def test_state_dict_through_safetensors(tmp_path):
    st = pytest.importorskip("safetensors.torch")
    qw = quantize_weight(torch.randn(16, 128), 8, 64, symmetric=True)
    d = {k: (v if isinstance(v, torch.Tensor) else torch.tensor(v)) for k, v in qw.state_dict().items()}
    st.save_file(d, str(tmp_path / "w.safetensors"))
    again = QuantizedWeight.from_state_dict(st.load_file(str(tmp_path / "w.safetensors")))
    assert torch.equal(again.dequantize(), qw.dequantize()) and again.symmetric


@pytest.mark.parametrize("make, error, words", [
    (lambda: quantize_weight(torch.randn(4, 64), bits=3), ValueError, "bits must be 4 or 8"),
    (lambda: quantize_weight(torch.randn(4, 96), group_size=64), ValueError, "not a multiple of group_size=64"),
    (lambda: quantize_weight(torch.randn(4, 64), group_size=48), ValueError, "group_size must be"),
    (lambda: quantize_weight(torch.randn(4, 64), group_size=16), ValueError, "group_size must be"),
    (lambda: quantize_weight(torch.randn(2, 4, 64)), ValueError, "2-D"),
    (lambda: quantize_weight(torch.randint(0, 3, (4, 64))), TypeError, "float"),
    (lambda: quantize_weight(torch.randn(4, 36), bits=4, group_size=-1), ValueError, "multiple of 8"),
    (lambda: QuantizedWeight.from_codes(torch.randn(4, 64), torch.ones(4, 2), None, 4, 32), TypeError, "integer"),
    (lambda: QuantizedWeight.from_codes(torch.full((4, 64), 16), torch.ones(4, 2), None, 4, 32), ValueError,
     "[0, 16)"),
    (lambda: QuantizedWeight.from_codes(torch.zeros(4, 64, dtype=torch.int32), torch.ones(4, 3), None, 4, 32),
     ValueError, "scales must have shape (4, 2)"),
    (lambda: QuantizedWeight.from_codes(torch.zeros(4, 64, dtype=torch.int32), torch.ones(4, 2),
                                        torch.ones(2, 4), 4, 32), ValueError, "zeros must have shape"),
])
def test_bad_weights_raise(make, error, words):
    with pytest.raises(error) as info:
        make()
    assert words in str(info.value)


def test_non_finite_weight_is_named_with_its_position():
    w = torch.randn(4, 64)
    w[2, 17] = float("inf")
    with pytest.raises(ValueError, match=r"non-finite value at \(2, 17\)"):
        quantize_weight(w, group_size=32)
    s = torch.ones(4, 2)
    s[3, 1] = float("nan")
    with pytest.raises(ValueError, match=r"scales has a non-finite value at \(3, 1\)"):
        QuantizedWeight.from_codes(torch.zeros(4, 64, dtype=torch.int32), s, None, 8, 32)


def test_public_names():
    assert opforge.QuantizedWeight is QuantizedWeight and opforge.quantize_weight is quantize_weight
