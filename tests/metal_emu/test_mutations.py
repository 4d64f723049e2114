"""The emulator catches real kernel bugs: deliberately broken copies of norm.metal must fail
the same checks the correct kernels pass.

Each mutant is norm.metal with one edit (a barrier removed, an index off by one, a reduction
over 31 lanes), cut down to the float32 kernels it needs so it builds quickly. The launcher
is pointed at the mutant's file, and the ordinary check (public API or variant launcher
against the float64 oracle, NaN-poisoned outputs) runs on it. The check must fail, by a wrong
value or by an error the emulator raises (a write outside a buffer). The unmutated cut-down
source passes the same checks, so each failure is the mutation's doing.
"""
import re

import pytest
import torch

from opforge.ops.norm import metal as norm_metal

from metal_emu.checks import run

pytestmark = pytest.mark.usefixtures("emulate")

KEEP = ("layer_norm", "rms_norm")  # the ops the cut-down source instantiates, float32 only


def cut_down(source: str) -> str:
    """norm.metal with only the float32 kernels of KEEP instantiated."""
    start = source.index("NORM_ALL_OPS(float, float)")
    head = re.sub(r"^#define NORM_ALL_OPS.*?\n\n", "", source[:start], flags=re.S | re.M)
    kernels = {"layer_norm": "false, false", "rms_norm": "true, false"}
    return head + "".join(f"NORM_KERNELS({op}, {kernels[op]}, float, float)\n" for op in KEEP)


def mutate(source: str, function: str, old: str, new: str, occurrence: int = 1) -> str:
    """Replace the ``occurrence``-th ``old`` inside the body of ``function`` with ``new``."""
    start = source.index(f" {function}(")
    end = source.index("\n}\n", start)
    body = source[start:end]
    at = -1
    for _ in range(occurrence):
        at = body.index(old, at + 1)
    return source[:start] + body[:at] + new + body[at + len(old):] + source[end:]


BARRIER = "threadgroup_barrier(mem_flags::mem_threadgroup);"

# (id, function, old text, new text, occurrence, (op, variant, n) checks that must fail).
# A check must exercise the broken value: layer_norm's rough mean m0 is only a shift that the
# correction m1 undoes, so a bug confined to m0's reduction is caught through rms_norm instead.
MUTANTS = [
    ("barrier-before-partials-removed", "threadgroup_sum", BARRIER, "", 1,
     [("layer_norm", "row", 1000), ("rms_norm", "looped", 5000)]),
    ("barrier-before-scratch-reuse-removed", "threadgroup_sum", BARRIER, "", 2,
     [("layer_norm", "row", 1000), ("layer_norm", "looped", 5000)]),
    ("barrier-in-pair-sum-removed", "threadgroup_sum2", BARRIER, "", 1,
     [("layer_norm", "row", 1000), ("rms_norm", "row", 1000)]),
    ("load-index-off-by-one", "norm_row", "load_elem<T, ADD>(xr, rr, sr, i)",
     "load_elem<T, ADD>(xr, rr, sr, i + 1)", 1,
     [("layer_norm", "row", 1000), ("rms_norm", "row", 300)]),
    ("loop-bound-off-by-one", "norm_row", "i < n ? load_elem", "i <= n ? load_elem", 1,
     [("layer_norm", "row", 1000)]),
    ("store-index-off-by-one", "norm_looped", "yr[i] =", "yr[i + 1] =", 1,
     [("layer_norm", "looped", 5000), ("rms_norm", "looped", 4500)]),
    ("lane-index-off-by-one", "norm_multirow", "long(lane) + long(k)", "long(lane + 1) + long(k)", 1,
     [("layer_norm", "multirow", 100), ("rms_norm", "multirow", 33)]),
    ("pair-reduction-over-31-lanes", "threadgroup_sum2", "a = simd_sum(a);\n  b = simd_sum(b);",
     "if (lane < 31) {\n    a = simd_sum(a);\n    b = simd_sum(b);\n  }", 1,
     [("layer_norm", "row", 1000), ("rms_norm", "row", 1000), ("layer_norm", "looped", 5000)]),
    ("reduction-over-31-lanes", "threadgroup_sum", "v = simd_sum(v);",
     "if (lane < 31) { v = simd_sum(v); }", 1,
     [("rms_norm", "looped", 5000)]),
    ("simd-row-sum-over-31-lanes", "norm_multirow", "simd_sum(q)", "simd_sum(lane < 31 ? q : 0.0f)", 1,
     [("rms_norm", "multirow", 200), ("layer_norm", "multirow", 77)]),
]


def _use_source(tmp_path, monkeypatch, source: str, module=norm_metal) -> None:
    """Point ``module``'s launcher (norm.metal's by default) at ``source``, written under tmp_path."""
    path = tmp_path / module.SOURCE.name
    path.write_text(source)
    monkeypatch.setattr(module, "SOURCE", path)


def _assert_mutant_fails(mutant, module, cut, check, tmp_path, monkeypatch) -> None:
    """Every ``check(kind)`` of ``mutant`` = (id, function, old, new, kinds) fails on the cut-down mutated source."""
    import metal_emu
    name, function, old, new, kinds = mutant
    original = cut(module.SOURCE.read_text())
    source = mutate(original, function, old, new)
    assert source != original
    _use_source(tmp_path, monkeypatch, source, module)
    for kind in kinds:
        with pytest.raises((AssertionError, metal_emu.EmulatorError)):
            check(kind)


def test_cut_down_source_passes_every_check(tmp_path, monkeypatch):
    _use_source(tmp_path, monkeypatch, cut_down(norm_metal.SOURCE.read_text()))
    for *_, checks in MUTANTS:
        for op, variant, n in checks:
            run(op, (3, n), torch.float32, variant=variant)
            if variant == "row" or variant == "multirow":
                run(op, (3, n), torch.float32)  # through the public API too


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m[0] for m in MUTANTS])
def test_mutant_fails_the_checks(mutant, tmp_path, monkeypatch):
    import metal_emu
    name, function, old, new, occurrence, checks = mutant
    source = mutate(cut_down(norm_metal.SOURCE.read_text()), function, old, new, occurrence)
    assert source != cut_down(norm_metal.SOURCE.read_text())
    _use_source(tmp_path, monkeypatch, source)
    for op, variant, n in checks:
        with pytest.raises((AssertionError, metal_emu.EmulatorError)):
            run(op, (3, n), torch.float32, variant=variant)


# ---------------------------------------------------------------------------
# attention.metal: a wrong causal-mask offset or a missed online-softmax rescale must fail the
# float64 checks of tests/ops/attention/test_attention_metal.py (the unmutated file passes them there
# and in test_unmutated_attention_passes below).

from opforge.ops.attention import metal as attn_metal  # noqa: E402

from metal_emu import attention_checks as attn_checks  # noqa: E402

ATTENTION_MUTANTS = [
    ("prefill-mask-aligned-to-start", "attention_prefill", "const long shift = p.sk - p.sq;",
     "const long shift = 0;", ("prefill",)),
    ("prefill-mask-off-by-one", "attention_prefill", "key <= qi + shift", "key < qi + shift", ("prefill",)),
    ("prefill-accumulator-not-rescaled", "attention_prefill", "simdgroup_multiply(acc[i], cf, acc[i]);", "",
     ("prefill",)),
    ("prefill-sum-not-rescaled", "attention_prefill", "row_l[r] * alpha", "row_l[r]", ("prefill",)),
    ("prefill-barrier-before-staging-removed", "attention_prefill",
     "threadgroup_barrier(mem_flags::mem_threadgroup);  // every simdgroup", "// every simdgroup", ("prefill",)),
    ("prefill-barrier-after-staging-removed", "attention_prefill",
     "threadgroup_barrier(mem_flags::mem_threadgroup);\n\n    simdgroup_float8x8 s", "simdgroup_float8x8 s",
     ("prefill",)),
    ("decode-mask-off-by-one", "attention_decode", "len - p.sq + qi + 1", "len - p.sq + qi", ("decode",)),
    ("decode-accumulator-not-rescaled", "attention_decode", "acc[i] *= alpha;", "", ("decode",)),
    ("decode-sum-not-rescaled", "attention_decode", "l = l * alpha + simd_sum(e);", "l = l + simd_sum(e);",
     ("decode",)),
]


def _attention_check(kind: str) -> None:
    """Prefill (GQA, Sq < Sk, two tiles, every simdgroup with rows, several key blocks; run in
    both scheduling orders) or decode (several splits, Sq = 4)."""
    import metal_emu
    torch.manual_seed(0)
    if kind == "prefill":
        q, k, v = torch.randn(1, 4, 37, 64), torch.randn(1, 2, 45, 64), torch.randn(1, 2, 45, 64)
        ref = attn_checks.reference(q, k, v, True, 0.3)
        for order in ("forward", "reverse"):
            with metal_emu.schedule(order):
                out = attn_metal.prefill(q, k, v, True, 0.3)
            err = attn_checks.rel_err(out, ref)
            assert err <= attn_checks.TOL[torch.float32], f"{kind} ({order}): rel err {err:.3e}"
    else:
        q, k, v = torch.randn(2, 4, 4, 64), torch.randn(2, 2, 80, 64), torch.randn(2, 2, 80, 64)
        seqlens = torch.tensor([80, 37], dtype=torch.int32)
        out = attn_metal.decode(q, k, v, seqlens, 0.3, n_split=2)
        ref = attn_checks.reference(q, k, v, True, 0.3, seqlens)
    err = attn_checks.rel_err(out, ref)
    assert err <= attn_checks.TOL[torch.float32], f"{kind}: rel err {err:.3e}"


def attention_cut_down(source: str) -> str:
    """attention.metal with only the float32 kernels the checks use (D = 64), to build quickly."""
    return source[:source.index("ATTENTION_KERNELS(float)\n")] + \
        "ATTENTION_KERNELS(float)\nATTENTION_PREFILL_KERNEL(float, 64)\n"


def test_unmutated_attention_passes(tmp_path, monkeypatch):
    _use_source(tmp_path, monkeypatch, attention_cut_down(attn_metal.SOURCE.read_text()), attn_metal)
    _attention_check("prefill")
    _attention_check("decode")


@pytest.mark.parametrize("mutant", ATTENTION_MUTANTS, ids=[m[0] for m in ATTENTION_MUTANTS])
def test_attention_mutant_fails_the_checks(mutant, tmp_path, monkeypatch):
    _assert_mutant_fails(mutant, attn_metal, attention_cut_down, _attention_check, tmp_path, monkeypatch)


# ---------------------------------------------------------------------------
# quant.metal: a wrong group index, a dropped zero, a missing barrier or a 31-lane reduction must
# fail the float64 checks of tests/ops/quant/test_quant_metal.py (the unmutated file passes them
# there and in test_unmutated_quant_passes below).

from opforge.ops.quant import metal as quant_metal  # noqa: E402
from opforge.ops.quant.problem import prepare as quant_prepare  # noqa: E402

QUANT_MUTANTS = [
    ("qmv-group-index-halved", "quant_qmv", "const long g = k0 / p.group;", "const long g = k0 / (2 * p.group);",
     ("qmv",)),
    ("qmv-zero-dropped", "quant_qmv", "& kMask) - zr", "& kMask)", ("qmv",)),
    ("qmv-reduction-over-31-lanes", "quant_qmv", "simd_sum(acc[mi][r])", "simd_sum(lane < 31 ? acc[mi][r] : 0.0f)",
     ("qmv",)),
    ("qmm-group-index-halved", "quant_qmm", "const long g = kk / p.group;", "const long g = kk / (2 * p.group);",
     ("qmm",)),
    ("qmm-zero-dropped", "quant_qmm", "& kMask) - zr) * sc", "& kMask)) * sc", ("qmm",)),
    ("qmm-barrier-after-staging-removed", "quant_qmm",
     "threadgroup_barrier(mem_flags::mem_threadgroup);\n\n    for (int kk", "for (int kk", ("qmm",)),
    ("split-sum-drops-the-last-split", "quant_combine", "sp < p.splits", "sp + 1 < p.splits", ("qmv-split",)),
    ("split-chunk-range-overlaps", "quant_qmv", "c_begin + p.split_chunks < chunks",
     "c_begin + p.split_chunks + 32 < chunks", ("qmv-split",)),
]


def quant_cut_down(source: str) -> str:
    """quant.metal with only the float32 kernels the checks use, to build quickly."""
    return source[:source.index("QUANT_KERNELS(float)\n")] + \
        "QUANT_QMV_KERNEL(float, 4, 4)\nQUANT_QMV_KERNEL(float, 8, 4)\n" \
        "QUANT_QMM_KERNEL(float, 4)\nQUANT_QMM_KERNEL(float, 8)\nQUANT_COMBINE_KERNEL(float)\n"


def _quant_check(kind: str) -> None:
    """int4 and int8, group 32, with zeros; qmv at M = 3 (``qmv-split``: 3 K splits), qmm at M = 33,
    both scheduling orders. K = 1056: every qmv lane reads a chunk, lane 0 two."""
    import metal_emu
    from opforge import quantize_weight
    torch.manual_seed(0)
    m = 33 if kind == "qmm" else 3
    kw = {"n_split": 3} if kind == "qmv-split" else {}
    for bits in (4, 8):
        qw = quantize_weight(torch.randn(40, 1056) * 0.05, bits, 32)
        x = torch.randn(m, 1056)
        ref = x.double() @ qw.dequantize(torch.float64).T
        for order in ("forward", "reverse"):
            with metal_emu.schedule(order):
                out = getattr(quant_metal, kind[:3])(quant_prepare(x, qw, None), **kw)
            err = ((out.double() - ref).norm() / ref.norm()).item()
            assert err <= 2e-5, f"{kind} int{bits} ({order}): rel err {err:.3e}"


def test_unmutated_quant_passes(tmp_path, monkeypatch):
    _use_source(tmp_path, monkeypatch, quant_cut_down(quant_metal.SOURCE.read_text()), quant_metal)
    _quant_check("qmv")
    _quant_check("qmm")
    _quant_check("qmv-split")


@pytest.mark.parametrize("mutant", QUANT_MUTANTS, ids=[m[0] for m in QUANT_MUTANTS])
def test_quant_mutant_fails_the_checks(mutant, tmp_path, monkeypatch):
    _assert_mutant_fails(mutant, quant_metal, quant_cut_down, _quant_check, tmp_path, monkeypatch)
