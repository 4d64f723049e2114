"""Metal quantized-linear kernels (the unchanged src/opforge/ops/quant/quant.metal) in the MSL
emulator, against ``x.double() @ w.dequantize(float64).T (+ bias)``: qmv (M <= 16) and qmm
(simdgroup matrices, M > 16), int4 and int8, symmetric or not, groups 16 (from codes) / 32 / 64 /
128 / -1, bias, strided and 3-D x, float32 / float16 / bfloat16 x and scales."""
import pytest
from hypothesis import given, settings, strategies as st
import torch

import opforge
from opforge.ops.quant import cases
from opforge.ops.quant import metal as quant_metal
from opforge.ops.quant.problem import prepare
from opforge.ops.quant.weight import QuantizedWeight
from opforge.testing import TOLERANCE, max_rel_error

pytestmark = pytest.mark.usefixtures("emulate")

K = 256
MS = (1, 3, 16, 17, 33)


def weight(n, k, bits, group, symmetric, seed=0):
    g = torch.Generator().manual_seed(seed)
    return opforge.quantize_weight(torch.randn(n, k, generator=g) * 0.05, bits, group, symmetric)


def oracle(x, qw, bias=None):
    return cases.oracle((x, qw, bias), {})


def run_public(x, qw, bias=None):
    """``opforge.linear`` on the metal backend: (output, trace event)."""
    with opforge.backend("metal"), opforge.trace() as t:
        out = opforge.linear(x, qw, bias)
    assert len(t) == 1 and t[0].backend == "metal" and t[0].op == "linear", list(t)
    return out, t[0]


def check(out, ref, dtype, what):
    err = max_rel_error(out, ref)
    assert err <= TOLERANCE[dtype], f"{what}: rel err {err:.3e}"


@pytest.mark.parametrize("bits", (4, 8))
@pytest.mark.parametrize("group,symmetric", [(32, False), (64, True), (128, False), (-1, True)])
def test_public_api_every_m(bits, group, symmetric):
    n = 40 + 8 * (bits == 8) + (group == 64) * 16   # N 40..64, tails of the 8-feature qmv groups and 32-feature qmm tiles
    qw = weight(n, K, bits, group, symmetric, seed=bits + group)
    for i, m in enumerate(MS):
        dtype = (torch.float16, torch.bfloat16, torch.float32)[i % 3]
        x = torch.randn(m, K).to(dtype)
        out, event = run_public(x, qw)
        assert out.dtype == dtype and out.shape == (m, n)
        assert event.variant == ("qmv" if m <= 16 else "qmm"), (m, event.variant)
        check(out, oracle(x, qw), dtype, f"int{bits} g{group} sym={symmetric} M={m} {dtype}")


@pytest.mark.parametrize("kind", ("qmv", "qmm"))
@pytest.mark.parametrize("bits", (4, 8))
def test_each_kernel_at_small_m(kind, bits):
    """Both kernels on the M both can take (qmm runs any M), float32 x: tight tolerance."""
    for group, symmetric in ((32, True), (128, False), (-1, False)):
        qw = weight(56, K, bits, group, symmetric, seed=7)
        for m in (1, 3, 16):
            x = torch.randn(m, K)
            out = getattr(quant_metal, kind)(prepare(x, qw, None))
            check(out, oracle(x, qw), torch.float32, f"{kind} int{bits} g{group} M={m}")


@pytest.mark.parametrize("bits", (4, 8))
def test_group_16_and_float32_scales_from_codes(bits):
    """Group 16 (int4: qmv falls back to one word per lane) and float32 / bfloat16 scales."""
    g = torch.Generator().manual_seed(3)
    n = 44
    codes = torch.randint(0, 2 ** bits, (n, K), generator=g)
    scales = torch.rand(n, K // 16, generator=g) * 0.01 + 1e-3
    zeros = torch.randint(0, 2 ** bits, (n, K // 16), generator=g).float() + 0.5
    for s_dtype in (torch.float32, torch.bfloat16):
        qw = QuantizedWeight.from_codes(codes, scales.to(s_dtype), zeros.to(s_dtype), bits, 16)
        for m in (1, 5, 17, 33):
            x = torch.randn(m, K, dtype=torch.float16)
            out, event = run_public(x, qw)
            check(out, oracle(x, qw), torch.float16, f"int{bits} g16 scales {s_dtype} M={m}")
    assert quant_metal.qmv_vector_words(4, 16) == 1 and quant_metal.qmv_vector_words(8, 16) == 4


@pytest.mark.parametrize("m", (3, 40))
def test_bias_strided_and_3d_x(m):
    qw = weight(64, K, 4, 64, False, seed=11)
    bias = torch.randn(64, dtype=torch.bfloat16)
    x = torch.randn(m, K + 24, dtype=torch.bfloat16)[:, 8:8 + K]
    assert x.stride(0) == K + 24
    out, event = run_public(x, qw, bias)
    assert event.note == "", "strided rows must be read in place"
    check(out, oracle(x, qw, bias), torch.bfloat16, f"strided +bias M={m}")
    x3 = torch.randn(2, m, K, dtype=torch.float16)
    b16 = bias.to(torch.float16)
    out3, _ = run_public(x3, qw, b16)
    assert out3.shape == (2, m, 64)
    check(out3, oracle(x3, qw, b16), torch.float16, f"3-D x +bias M={m}")


@pytest.mark.parametrize("bits", (4, 8))
def test_long_k_every_lane_reads(bits):
    """K = 2080: each qmv lane walks several chunks (int4: 65 chunks of 32 codes, int8: 130 of 16)
    and qmm 65 K tiles."""
    qw = weight(40, 2080, bits, 32, bits == 8, seed=13)
    for m in (1, 16, 17):
        x = torch.randn(m, 2080)
        out, event = run_public(x, qw)
        check(out, oracle(x, qw), torch.float32, f"K=2080 int{bits} M={m}")


@pytest.mark.parametrize("bits,k", [(4, 264), (8, 100)])
def test_k_not_a_multiple_of_the_tiles(bits, k):
    """One group per row (-1) with K not a multiple of 32: qmv reads one word per lane (a 4-word
    chunk would cross the end of the row), qmm's last K tile is ragged."""
    assert quant_metal.qmv_vector_words(bits, k) == 1
    qw = weight(40, k, bits, -1, False, seed=17)
    for m in (1, 7, 33):
        x = torch.randn(m, k, dtype=torch.float16)
        out, event = run_public(x, qw)
        assert event.variant == ("qmv" if m <= 16 else "qmm")
        check(out, oracle(x, qw), torch.float16, f"K={k} int{bits} g-1 M={m}")


@pytest.mark.parametrize("bits", (4, 8))
def test_qmv_k_splits(bits):
    """K split in 2, 3, 5 parts (the last one shorter), partials added by the combine kernel, + bias;
    and the default split count on a long K (N=40: few feature groups)."""
    qw = weight(40, 2080, bits, 32, False, seed=19)
    bias = torch.randn(40, dtype=torch.float16)
    for m, n_split in ((1, 2), (5, 3), (16, 5)):
        x = torch.randn(m, 2080, dtype=torch.float16)
        out = quant_metal.qmv(prepare(x, qw, bias), n_split=n_split)
        check(out, oracle(x, qw, bias), torch.float16, f"int{bits} M={m} {n_split} splits")
    k = 8192
    qw = weight(40, k, bits, 128, True, seed=23)
    chunks = k // (4 * 32 // bits)
    assert quant_metal.qmv_splits(40, chunks) > 1
    x = torch.randn(2, k)
    out, event = run_public(x, qw)
    assert event.variant == "qmv"
    check(out, oracle(x, qw), torch.float32, f"int{bits} K={k} default splits")


def test_packed_view_not_16_byte_aligned_reads_one_word_per_lane(monkeypatch):
    qw = weight(40, K, 4, 128, False, seed=29)
    buf = torch.empty(qw.packed.numel() + 1, dtype=torch.int32)
    buf[1:] = qw.packed.flatten()
    shifted = QuantizedWeight(buf[1:].view_as(qw.packed), qw.scales_t, qw.zeros_t, 4, 128, qw.shape)
    names = []
    kernel = quant_metal.metal_runtime.kernel
    monkeypatch.setattr(quant_metal.metal_runtime, "kernel", lambda path, name, dev: names.append(name) or
                        kernel(path, name, dev))
    x = torch.randn(3, K)
    out, _ = run_public(x, shifted)
    assert names == ["quant_qmv_float_int4_v1"]
    check(out, oracle(x, qw), torch.float32, "packed view at a 4-byte offset")


def test_verify_cases_pass_on_metal():
    """The family's ``opforge verify`` cases (CPU shapes) on the metal backend."""
    for case in cases.verify_cases("cpu", quick=True):
        event, _, _ = opforge.testing.check_case(case, "metal", device="cpu")
        assert event.variant == ("qmv" if case.shape[0] <= 16 else "qmm")


def test_metal_is_chosen_and_explained_under_emulation():
    """CPU tensors default to the torch path; with the metal backend asked for (what an MPS
    tensor gets by default), the emulated kernels run and explain names them."""
    qw = weight(48, K, 4, 128, False)
    x = torch.randn(2, K, dtype=torch.float16)
    with opforge.backend("metal"), opforge.trace() as t:
        out = opforge.linear(x, qw)
    assert [(e.backend, e.variant) for e in t] == [("metal", "qmv")]
    check(out, oracle(x, qw), torch.float16, "selection")
    with opforge.backend("metal"):
        e = opforge.explain("linear", torch.randn(20, K, dtype=torch.float16), qw)
        e1 = opforge.explain("linear", x, qw)
    assert e.chosen.qualified_name == "metal.qmm" and e1.chosen.qualified_name == "metal.qmv"
    reasons = {v.qualified_name: r for v, r in e.rejected}
    assert "M=20 rows > 16" in reasons["metal.qmv"]


def test_what_the_metal_kernels_refuse():
    qw = weight(16, 64, 4, 32, False)
    with opforge.backend("metal"), pytest.raises(opforge.NoKernelError, match="float64 runs on the torch path"):
        opforge.linear(torch.randn(2, 64, dtype=torch.float64), qw)
    q8 = QuantizedWeight.from_codes(torch.randint(0, 256, (8, 66)), torch.rand(8, 1), None, 8, -1)
    with opforge.backend("metal"), pytest.raises(opforge.NoKernelError, match="multiple of 4"):
        opforge.linear(torch.randn(2, 66), q8)
    y = opforge.linear(torch.randn(2, 66), q8)   # unforced: the torch path takes it
    assert y.shape == (2, 8)


def test_reverse_schedule_gives_the_same_results():
    import metal_emu
    qw = weight(40, K, 8, 32, False, seed=5)
    x = torch.randn(33, K)
    with metal_emu.schedule("reverse"):
        for m in (3, 33):
            out, _ = run_public(x[:m], qw)
            check(out, oracle(x[:m], qw), torch.float32, f"reverse schedule M={m}")


def test_kernels_without_bfloat_before_metal_3_1():
    from metal_emu import _build, _source
    source = quant_metal.SOURCE.read_text()
    names = {k.name for k in _source.find_kernels(_build._preprocess(_build.compiler(), source, "quant.metal", 300))}
    assert "quant_qmv_half_int4_v4" in names and "quant_qmm_float_int8" in names
    assert not any("bfloat" in n for n in names) and len(names) == 2 * 7


@settings(max_examples=30, deadline=None)
@given(bits=st.sampled_from((4, 8)), group=st.sampled_from((32, 64, 128, -1)), groups=st.integers(1, 5),
       n=st.integers(1, 70), m=st.integers(1, 40), dtype=st.sampled_from((torch.float32, torch.float16, torch.bfloat16)),
       symmetric=st.booleans(), has_bias=st.booleans(), pad=st.sampled_from((0, 8, 40)))
def test_random_shapes(bits, group, groups, n, m, dtype, symmetric, has_bias, pad):
    k = (group if group > 0 else 8 * 9) * groups   # group -1: K = 72 * groups (not a multiple of 32)
    qw = weight(n, k, bits, group, symmetric, seed=n + m)
    g = torch.Generator().manual_seed(n * 1000 + m * 10 + bits)   # the same x when hypothesis replays an example
    x = torch.randn(m, k + pad, generator=g).to(dtype)[:, pad // 2:pad // 2 + k]
    bias = torch.randn(n, generator=g).to(dtype) if has_bias else None
    out, event = run_public(x, qw, bias)
    assert event.variant == ("qmv" if m <= 16 else "qmm") and event.note == ""
    ref = oracle(x, qw, bias)
    # With N = M = 1 the one output can cancel to ~1/300 of a typical dot product, and a float32
    # sum's rounding is relative to the sizes of its terms, not its result: the error is measured
    # against the larger of ‖ref‖ and the typical size of a dot product of these terms,
    # ‖|x| |W|ᵀ‖ / √K (for random signs ‖x Wᵀ‖ ≈ that, so only cancelling draws are affected).
    terms = x.double().abs() @ qw.dequantize(torch.float64).abs().T
    scale = max(ref.norm().item(), terms.norm().item() / k ** 0.5)
    err = (out.double() - ref).norm().item() / scale
    assert err <= TOLERANCE[dtype], f"int{bits} g{group} N={n} K={k} M={m} {dtype}: error {err:.3e}"
