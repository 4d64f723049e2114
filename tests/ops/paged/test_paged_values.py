"""The paged ops on every backend against the float64 oracle, on fresh random data: blocks
shuffled across the pool and shared between sequences, mixed query lengths in one call (decode
tokens, short and long chunks), lengths ending mid-block and at a block's end, NaN in every slot no
sequence owns (a read of one shows), and equality with decode_attention / attention when the pages
happen to be contiguous."""
import pytest
import torch

import opforge
from opforge.ops.paged import cases, reference
from opforge.ops.rotary.cases import rope_tables
from opforge.testing import DEVICE, TOLERANCE, check_case, max_rel_error

BACKENDS = ["triton", "torch"]
DTYPES = (torch.float32, torch.float16, torch.bfloat16)

# (lengths after the step, new tokens per sequence, Hq, Hkv, D, block_size)
DECODE = [
    ([40, 7, 16, 1], [1, 1, 1, 1], 4, 2, 32, 16),          # ends mid-block, at a block's end, one token
    ([33, 64], [2, 16], 8, 1, 64, 16),                     # Sq 2..16 (speculative / short chunks), MQA
    ([70, 9], [3, 9], 4, 4, 24, 8),                         # whole sequence is new; padded head dim
]
PREFILL = [
    ([33, 16, 5, 48], [1, 2, 5, 17], 4, 2, 32, 16),        # mixed: decode, short and long chunks
    ([40, 20], [40, 18], 2, 1, 16, 4),                      # a whole prompt; block size 4
    ([64, 3, 50], [20, 3, 33], 4, 2, 64, 32),
]


def _ids(s):
    return f"L{'-'.join(map(str, s[0]))}_n{'-'.join(map(str, s[1]))}_h{s[2]}-{s[3]}_d{s[4]}_bs{s[5]}"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shape", DECODE + PREFILL, ids=_ids)
def test_attention_matches_float64(backend, shape):
    lengths, new, hq, hkv, d, bs = shape
    for dtype in DTYPES:
        event, args, out = check_case(cases.attention_case(lengths, new, hq, hkv, d, bs, dtype), backend)
        assert out.shape == args[0].shape and out.dtype == dtype
        if backend == "triton":
            assert event.variant == ("split_kv" if max(new) <= 16 else "prefill")


@pytest.mark.parametrize("backend", BACKENDS)
def test_attention_long_max_query_len_on_short_sequences(backend):
    """max_query_len above 16 with only short sequences: the step's kernels split them right."""
    check_case(cases.attention_case([40, 7, 16], [1, 4, 1], 4, 2, 32, 16, torch.float32, max_query_len=20), backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_queries_that_see_nothing_are_zero(backend):
    """A sequence with more new queries than positions: its first rows see no key."""
    layout = cases.make_layout([3, 8], [5, 2], 4, share=False)
    kp, vp = cases.make_pools(layout, [3, 8], 1, 16, torch.float32, DEVICE)
    q = torch.randn(7, 2, 16, device=DEVICE)
    args = (q, kp, vp, layout.block_tables.to(DEVICE), torch.tensor([3, 8], dtype=torch.int32, device=DEVICE),
            layout.cu_seqlens.to(DEVICE))
    with opforge.backend(backend):
        out = opforge.paged_attention(*args, max_query_len=5)
    assert torch.equal(out[:2], torch.zeros_like(out[:2]))
    ref = reference.paged_attention(*(a.double() if a.is_floating_point() else a for a in args), 0.25)
    assert max_rel_error(out, ref) <= TOLERANCE[torch.float32]


@pytest.mark.parametrize("backend", BACKENDS)
def test_contiguous_pages_equal_decode_attention_and_attention(backend):
    """Pages laid out in order, one sequence's blocks after another's: the same numbers as the
    contiguous ops on the same cache."""
    b, hq, hkv, d, bs, s_max = 3, 8, 2, 32, 16, 48
    cache_k = torch.randn(b, s_max, hkv, d, device=DEVICE)
    cache_v = torch.randn(b, s_max, hkv, d, device=DEVICE)
    kp, vp = cache_k.view(b * s_max // bs, bs, hkv, d), cache_v.view(b * s_max // bs, bs, hkv, d)
    tables = torch.arange(b * s_max // bs, dtype=torch.int32, device=DEVICE).view(b, s_max // bs)
    lens = torch.tensor([48, 17, 30], dtype=torch.int32, device=DEVICE)
    q = torch.randn(b, hq, 1, d, device=DEVICE)
    cu = torch.arange(b + 1, dtype=torch.int32, device=DEVICE)
    with opforge.backend(backend):
        paged = opforge.paged_attention(q[:, :, 0], kp, vp, tables, lens, cu, max_query_len=1)
        dense = opforge.decode_attention(q, cache_k.transpose(1, 2), cache_v.transpose(1, 2), lens)
    assert max_rel_error(paged, dense[:, :, 0].double()) <= 2 * TOLERANCE[torch.float32]
    # a prefill chunk: the last 20 of sequence 0's 48 positions
    qc = torch.randn(20, hq, d, device=DEVICE)
    with opforge.backend(backend):
        paged = opforge.paged_attention(qc, kp, vp, tables[:1], lens[:1], torch.tensor([0, 20], dtype=torch.int32,
                                        device=DEVICE), max_query_len=20)
        dense = opforge.attention(qc.transpose(0, 1)[None], cache_k[:1].transpose(1, 2), cache_v[:1].transpose(1, 2),
                                  causal=True)
    assert max_rel_error(paged, dense[0].transpose(0, 1).double()) <= 2 * TOLERANCE[torch.float32]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shape", [([33, 16, 5, 48], [1, 2, 5, 17], 2, 32, 16), ([9, 24], [9, 8], 3, 24, 8)],
                         ids=["mixed", "prompt"])
def test_append_matches_float64(backend, shape):
    lengths, new, hkv, d, bs = shape
    for dtype in DTYPES:
        check_case(cases.append_case(lengths, new, hkv, d, bs, dtype), backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("interleaved", [False, True], ids=["half", "interleaved"])
@pytest.mark.parametrize("rotary_dim", [32, 16], ids=["full", "partial"])
def test_rotary_append_equals_rotary_then_append(backend, interleaved, rotary_dim):
    lengths, new, hq, hkv, d, bs = [33, 16, 5], [1, 2, 5], 4, 2, 32, 16
    layout = cases.make_layout(lengths, new, bs)
    before = torch.tensor([n - m for n, m in zip(lengths, new)], dtype=torch.int32, device=DEVICE)
    tables, cu = layout.block_tables.to(DEVICE), layout.cu_seqlens.to(DEVICE)
    cos, sin = rope_tables(64, rotary_dim, DEVICE)
    for dtype in DTYPES:
        kp, vp = cases.make_pools(layout, before.tolist(), hkv, d, dtype, DEVICE)
        t = layout.tokens
        q, k, v = (torch.randn(t, h, d, dtype=dtype, device=DEVICE) for h in (hq, hkv, hkv))
        ek, ev = kp.double(), vp.double()
        eq = reference.paged_rotary_kv_cache_append(q.double(), k.double(), v.double(), ek, ev, tables, before, cu,
                                                    cos.double(), sin.double(), None, interleaved)
        with opforge.backend(backend), opforge.trace() as tr:
            out = opforge.paged_rotary_kv_cache_append(q, k, v, kp, vp, tables, before, cu, cos, sin,
                                                       interleaved=interleaved)
        assert tr[0].backend == backend
        tol = TOLERANCE[dtype]
        assert max_rel_error(out, eq) <= tol
        written = ~torch.isnan(ek)
        assert torch.equal(torch.isnan(kp), ~written) and torch.equal(torch.isnan(vp), ~written)
        assert max_rel_error(kp[written], ek[written]) <= tol
        assert torch.equal(vp[written].double(), ev[written])


@pytest.mark.parametrize("backend", BACKENDS)
def test_rotary_append_explicit_positions_and_inplace(backend):
    lengths, new, hq, hkv, d, bs = [20, 4], [3, 4], 2, 1, 16, 8
    layout = cases.make_layout(lengths, new, bs, share=False)
    before = torch.tensor([17, 0], dtype=torch.int32, device=DEVICE)
    tables, cu = layout.block_tables.to(DEVICE), layout.cu_seqlens.to(DEVICE)
    cos, sin = rope_tables(32, d, DEVICE)
    pos = torch.tensor([5, 6, 7, 30, 31, 0, 1], device=DEVICE)
    kp, vp = cases.make_pools(layout, [17, 0], hkv, d, torch.float32, DEVICE)
    q, k, v = (torch.randn(7, h, d, device=DEVICE) for h in (hq, hkv, hkv))
    ek, ev = kp.double(), vp.double()
    eq = reference.paged_rotary_kv_cache_append(q.double(), k.double(), v.double(), ek, ev, tables, before, cu,
                                                cos.double(), sin.double(), pos)
    q_in = q.clone()
    with opforge.backend(backend):
        out = opforge.paged_rotary_kv_cache_append(q_in, k, v, kp, vp, tables, before, cu, cos, sin, pos,
                                                   inplace=True)
    assert out is q_in
    assert max_rel_error(out, eq) <= TOLERANCE[torch.float32]
    written = ~torch.isnan(ek)
    assert max_rel_error(kp[written], ek[written]) <= TOLERANCE[torch.float32]


# ---- random layouts (hypothesis) -----------------------------------------------------------------

from hypothesis import given, settings, strategies as st  # noqa: E402


@st.composite
def _steps(draw):
    """A step: 1..4 sequences, each with 1..40 positions of which 1..all are new."""
    b = draw(st.integers(1, 4))
    lengths = draw(st.lists(st.integers(1, 40), min_size=b, max_size=b))
    new = [draw(st.integers(1, n)) for n in lengths]
    return lengths, new


@settings(max_examples=8)
@given(step=_steps(), hkv=st.integers(1, 2), ratio=st.sampled_from([1, 3, 4]), d=st.sampled_from([16, 24, 64]),
       block_size=st.sampled_from([1, 4, 16, 32]), decode_kernel=st.booleans(),
       dtype=st.sampled_from(DTYPES))
def test_attention_random_layouts(step, hkv, ratio, d, block_size, decode_kernel, dtype):
    lengths, new = step
    mq = max(new) if decode_kernel and max(new) <= 16 else max(max(new), 17)
    event, _, _ = check_case(cases.attention_case(lengths, new, hkv * ratio, hkv, d, block_size, dtype, mq),
                             "triton")
    assert event.variant == ("split_kv" if mq <= 16 else "prefill")


@pytest.mark.parametrize("backend", BACKENDS)
def test_int64_index_tensors(backend):
    """Tables, lengths and cu_seqlens may be int64 (the kernels read either width)."""
    for new in ([1, 2, 17], [1, 2, 3]):                   # the prefill and split kernels, the decode one
        case = cases.attention_case([33, 16, 25], new, 4, 2, 32, 8, torch.float32)
        args, kwargs = case.make(DEVICE)
        wide = args[:3] + tuple(a.long() for a in args[3:])
        with opforge.backend(backend):
            out = opforge.paged_attention(*wide, **kwargs)
        assert max_rel_error(out, case.oracle(args, kwargs)) <= TOLERANCE[torch.float32]
    append = cases.append_case([33, 16, 25], [1, 2, 17], 2, 32, 8, torch.float32)
    args, _ = append.make(DEVICE)
    kp, vp, k, v, tables, lens, cu, k0, v0 = args
    with opforge.backend(backend):
        opforge.paged_kv_cache_append(kp, vp, k, v, tables.long(), lens.long(), cu.long())
    ek, ev = append.oracle(args, {})
    assert torch.equal(kp.double(), ek) and torch.equal(vp.double(), ev)
