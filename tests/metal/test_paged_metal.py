"""The Metal paged kernels (the unchanged src/opforge/ops/paged/paged.metal) in the MSL emulator,
against the float64 oracle: shuffled and shared blocks, NaN in every slot no sequence owns, mixed
query lengths, several KV splits, the appends; and mutants of the source (a wrong block index, an
off-by-one length, a causal mask aligned to the start instead of the end) that the same checks
must catch."""
import pytest
import torch

import opforge
from opforge.ops.paged import cases, metal as paged_metal, reference
from opforge.ops.paged.problem import prepare_attention
from opforge.ops.rotary.cases import rope_tables
from opforge.testing import TOLERANCE, check_case, max_rel_error

pytestmark = pytest.mark.usefixtures("emulate")

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
ATTENTION = [
    ([40, 7, 16, 1], [1, 1, 1, 1], 4, 2, 32, 16),     # decode: mid-block, block end, one token
    ([33, 16, 5, 48], [1, 2, 5, 17], 4, 2, 32, 16),   # mixed decode / chunks
    ([70, 9], [3, 9], 6, 2, 24, 8),                    # GQA 3, a whole sequence new, D not a power of 2
]


@pytest.mark.parametrize("shape", ATTENTION, ids=lambda s: "L" + "-".join(map(str, s[0])))
def test_attention_matches_float64(shape):
    lengths, new, hq, hkv, d, bs = shape
    for dtype in DTYPES:
        event, _, _ = check_case(cases.attention_case(lengths, new, hq, hkv, d, bs, dtype), "metal", device="cpu")
        assert event.variant == "split_kv"


@pytest.mark.parametrize("dtype", DTYPES)
def test_tiled_prefill_beside_decode_tokens(dtype):
    """D = 64 and chunks of more than 16 tokens: the tiled kernel takes those sequences (one longer
    than a 32-row tile), the split kernel the decode tokens and the 16-token draft."""
    case = cases.attention_case([70, 45, 5, 33, 16], [1, 40, 3, 17, 16], 4, 2, 64, 16, dtype)
    event, _, _ = check_case(case, "metal", device="cpu")
    assert event.variant == "split_kv" and paged_metal.tiled(prepare_attention(*case.make("cpu")[0], 40,
                                                                                None).problem)


def test_tiled_kernel_alone_on_every_sequence():
    """The tiled kernel serves short sequences and queries that see no key (zeros) too."""
    args, ref = _attention_inputs([40, 3, 20], [1, 5, 20], 4, 1, 64, 8)
    out = paged_metal.launch_prefill(prepare_attention(*args, 20, None))
    assert max_rel_error(out, ref) <= TOLERANCE[torch.float32]
    assert torch.equal(out[1:3], torch.zeros_like(out[1:3]))     # sequence 1: 5 queries over 3 keys


@pytest.mark.parametrize("n_split", [1, 3, 5])
def test_attention_split_counts(n_split):
    args, ref = _attention_inputs([70, 5, 33], [1, 3, 2], 4, 2, 32, 16)
    out = paged_metal.launch_attention(prepare_attention(*args, 3, None), n_split=n_split)
    assert max_rel_error(out, ref) <= TOLERANCE[torch.float32]


@pytest.mark.parametrize("shape", [([33, 16, 5, 48], [1, 2, 5, 17], 2, 32, 16), ([9, 24], [9, 8], 3, 24, 8)],
                         ids=["mixed", "prompt"])
def test_append_matches_float64(shape):
    lengths, new, hkv, d, bs = shape
    for dtype in DTYPES:
        check_case(cases.append_case(lengths, new, hkv, d, bs, dtype), "metal", device="cpu")


@pytest.mark.parametrize("interleaved", [False, True], ids=["half", "interleaved"])
@pytest.mark.parametrize("inplace", [False, True], ids=["new", "inplace"])
def test_rotary_append(interleaved, inplace):
    lengths, new, hq, hkv, d, bs = [33, 16, 5], [1, 2, 5], 4, 2, 32, 16
    layout = cases.make_layout(lengths, new, bs)
    before = torch.tensor([n - m for n, m in zip(lengths, new)], dtype=torch.int32)
    cos, sin = rope_tables(64, 16, "cpu")                       # partial rotary: R = 16 of D = 32
    for dtype in DTYPES:
        kp, vp = cases.make_pools(layout, before.tolist(), hkv, d, dtype, "cpu")
        q, k, v = (torch.randn(layout.tokens, h, d, dtype=dtype) for h in (hq, hkv, hkv))
        ek, ev = kp.double(), vp.double()
        eq = reference.paged_rotary_kv_cache_append(q.double(), k.double(), v.double(), ek, ev, layout.block_tables,
                                                    before, layout.cu_seqlens, cos.double(), sin.double(), None,
                                                    interleaved)
        q_in = q.clone()
        with opforge.backend("metal"), opforge.trace() as t:
            out = opforge.paged_rotary_kv_cache_append(q_in, k, v, kp, vp, layout.block_tables, before,
                                                       layout.cu_seqlens, cos, sin, interleaved=interleaved,
                                                       inplace=inplace)
        assert t[0].backend == "metal" and (out is q_in) == inplace
        assert max_rel_error(out, eq) <= TOLERANCE[dtype]
        written = ~torch.isnan(ek)
        assert torch.equal(torch.isnan(kp), ~written)
        assert max_rel_error(kp[written], ek[written]) <= TOLERANCE[dtype]
        assert torch.equal(vp[written].double(), ev[written])


def _attention_inputs(lengths, new, hq, hkv, d, bs, dtype=torch.float32):
    layout = cases.make_layout(lengths, new, bs)
    kp, vp = cases.make_pools(layout, lengths, hkv, d, dtype, "cpu")
    q = torch.randn(layout.tokens, hq, d, dtype=dtype)
    args = (q, kp, vp, layout.block_tables, torch.tensor(lengths, dtype=torch.int32), layout.cu_seqlens)
    ref = reference.paged_attention(q.double(), kp.double(), vp.double(), *args[3:], d ** -0.5)
    return args, ref


# ---- mutants: each one edit of paged.metal that the checks above must catch --------------------

# (id, old text, new text, head dim): D = 32 runs the split kernel only, D = 64 the tiled kernel
# for the 17-token sequence too.
MUTANTS = [
    ("wrong-block-index", "pos / block_size]", "pos / block_size + 1]", 32),
    ("length-off-by-one", "clamp_l(len - n + (t - first) + 1, 0, len)", "clamp_l(len - n + (t - first) + 2, 0, len)",
     32),
    ("mask-aligned-to-start", "clamp_l(len - n + (t - first) + 1, 0, len)", "clamp_l((t - first) + 1, 0, len)", 32),
    ("slot-ignores-block-offset", "((j0 + u) % p.block_size)", "((j0 + u) % p.block_size + 1) % p.block_size", 32),
    ("tiled-mask-aligned-to-start", "const long shift = len - n;  //", "const long shift = 0;  //", 64),
    ("tiled-length-off-by-one", "const bool seen = key < len && key <= qi + shift;",
     "const bool seen = key < len && key <= qi + shift + 1;", 64),
    ("tiled-wrong-slot", "const long slot = key % p.block_size;", "const long slot = (key + 1) % p.block_size;", 64),
    ("tiled-decode-rows-dropped", "n > p.max_n ? start", "n >= p.max_n ? start", 64),
]


def _mutant_check(d):
    args, ref = _attention_inputs([33, 16, 5, 48], [1, 2, 16, 17], 4, 2, d, 16)
    out = paged_metal.launch_attention(prepare_attention(*args, 17, None))
    return max_rel_error(out, ref)


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m[0] for m in MUTANTS])
def test_mutants_are_caught(mutant, tmp_path, monkeypatch):
    _, old, new, d = mutant
    source = paged_metal.SOURCE.read_text()
    assert source.count(old) == 1
    path = tmp_path / "paged.metal"
    path.write_text(source.replace(old, new))
    monkeypatch.setattr(paged_metal, "SOURCE", path)
    assert not _mutant_check(d) <= TOLERANCE[torch.float32]


@pytest.mark.parametrize("d", [32, 64])
def test_unmutated_source_passes_the_mutant_check(d, tmp_path, monkeypatch):
    path = tmp_path / "paged.metal"
    path.write_text(paged_metal.SOURCE.read_text())
    monkeypatch.setattr(paged_metal, "SOURCE", path)
    assert _mutant_check(d) <= TOLERANCE[torch.float32]


def test_int64_index_tensors():
    """int64 tables, lengths and cu_seqlens are bound as int32 copies (a device op, no host read)."""
    args, ref = _attention_inputs([40, 7, 20], [1, 2, 17], 4, 2, 32, 8)
    wide = args[:3] + tuple(a.long() for a in args[3:])
    out = paged_metal.launch_attention(prepare_attention(*wide, 17, None))
    assert max_rel_error(out, ref) <= TOLERANCE[torch.float32]
