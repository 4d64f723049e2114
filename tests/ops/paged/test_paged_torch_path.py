"""The paged ops' fast torch forms (float32 and half CPU tensors) against the float64 oracle: one
sequence decoding (the single-slot write and table slice), one sequence's prefill chunk starting
mid-block, several sequences of mixed query lengths, explicit positions, interleaved and partial
rotary, in place; NaN in every slot no sequence owns; and the host checks, which run once per set
of index tensors, run again when those tensors change in place."""
import pytest
import torch

import opforge
from opforge.ops.paged import cases, reference
from opforge.ops.rotary.cases import rope_tables
from opforge.testing import TOLERANCE, max_rel_error

DTYPES = (torch.float32, torch.float16, torch.bfloat16)

# (lengths after the step, new tokens per sequence, Hq, Hkv, D, block_size)
SHAPES = [
    ([37], [1], 8, 2, 32, 16),             # one sequence, one decode token, mid-block
    ([32], [1], 4, 4, 16, 16),             # ... the token ends a block
    ([29], [11], 4, 2, 32, 8),             # one sequence, a chunk starting mid-block
    ([40, 7, 16], [1, 7, 3], 6, 2, 16, 4),  # several, mixed
]


def _ids(s):
    return f"L{'-'.join(map(str, s[0]))}_n{'-'.join(map(str, s[1]))}_h{s[2]}-{s[3]}_d{s[4]}_bs{s[5]}"


@pytest.mark.parametrize("shape", SHAPES, ids=_ids)
@pytest.mark.parametrize("interleaved", [False, True], ids=["half", "interleaved"])
@pytest.mark.parametrize("partial", [False, True], ids=["full", "partial"])
def test_fast_rotary_append_then_attention_match_float64(shape, interleaved, partial):
    lengths, new, hq, hkv, d, bs = shape
    layout = cases.make_layout(lengths, new, bs)
    before = torch.tensor([n - m for n, m in zip(lengths, new)], dtype=torch.int32)
    after = torch.tensor(lengths, dtype=torch.int32)
    tables, cu = layout.block_tables, layout.cu_seqlens
    cos, sin = rope_tables(64, d // 2 if partial else d, "cpu")
    for dtype in DTYPES:
        kp, vp = cases.make_pools(layout, before.tolist(), hkv, d, dtype, "cpu")
        t = layout.tokens
        q, k, v = (torch.randn(t, h, d, dtype=dtype) for h in (hq, hkv, hkv))
        ek, ev = kp.double(), vp.double()
        eq = reference.paged_rotary_kv_cache_append(q.double(), k.double(), v.double(), ek, ev, tables, before, cu,
                                                    cos.double(), sin.double(), None, interleaved)
        want = reference.paged_attention(eq, ek, ev, tables, after, cu, d ** -0.5)
        with opforge.backend("torch"):
            q_rot = opforge.paged_rotary_kv_cache_append(q, k, v, kp, vp, tables, before, cu, cos, sin,
                                                         interleaved=interleaved)
            out = opforge.paged_attention(q_rot, kp, vp, tables, after, cu, max_query_len=max(new))
        tol = TOLERANCE[dtype]
        assert max_rel_error(q_rot, eq) <= tol
        written = ~torch.isnan(ek)                     # NaN where no sequence owns the slot
        assert torch.equal(torch.isnan(kp), ~written) and torch.equal(torch.isnan(vp), ~written)
        assert max_rel_error(kp[written], ek[written]) <= tol and torch.equal(vp[written].double(), ev[written])
        assert not out.isnan().any() and max_rel_error(out, want) <= 2 * tol
        assert want.abs().max() > 0.1


def test_fast_forms_explicit_positions_inplace_and_queries_that_see_nothing():
    lengths, new, hq, hkv, d, bs = [21], [3], 4, 2, 16, 8
    layout = cases.make_layout(lengths, new, bs)
    before, tables, cu = torch.tensor([18]), layout.block_tables, layout.cu_seqlens
    cos, sin = rope_tables(32, d, "cpu")
    kp, vp = cases.make_pools(layout, [18], hkv, d, torch.float32, "cpu")
    q, k, v = (torch.randn(3, h, d) for h in (hq, hkv, hkv))
    positions = torch.tensor([5, 0, 30])
    ek, ev = kp.double(), vp.double()
    eq = reference.paged_rotary_kv_cache_append(q.double(), k.double(), v.double(), ek, ev, tables, before, cu,
                                                cos.double(), sin.double(), positions)
    got = reference.fast_paged_rotary_kv_cache_append(q, k, v, kp, vp, tables, before, cu, cos, sin, positions,
                                                      inplace=True)
    assert got is q and max_rel_error(q, eq) <= TOLERANCE[torch.float32]
    written = ~torch.isnan(ek)
    assert max_rel_error(kp[written], ek[written]) <= TOLERANCE[torch.float32]
    # lengths clamped below the queries: the first queries see no key and give zeros, as the oracle
    short = torch.tensor([2])
    want = reference.paged_attention(q.double(), ek, ev, tables, short, cu, 0.5)
    out = reference.fast_paged_attention(q, kp, vp, tables, short, cu, 0.5)
    assert (out[0] == 0).all() and max_rel_error(out, want) <= TOLERANCE[torch.float32]


def test_checks_run_again_when_the_index_tensors_change_in_place():
    kp, vp = torch.zeros(4, 4, 1, 8), torch.zeros(4, 4, 1, 8)
    tables = torch.tensor([[1, 2]], dtype=torch.int32)
    lens, cu = torch.tensor([3], dtype=torch.int32), torch.tensor([0, 1], dtype=torch.int32)
    q = torch.randn(1, 2, 8)
    for _ in range(2):                                  # checked once, then remembered
        opforge.paged_attention(q, kp, vp, tables, lens, cu, max_query_len=1)
    tables[0, 0] = 9                                    # in place: now outside the pool
    with pytest.raises(IndexError, match=r"block_tables\[0, 0\] = 9"):
        opforge.paged_attention(q, kp, vp, tables, lens, cu, max_query_len=1)
    k = torch.randn(1, 1, 8)
    tables[0, 0] = 1
    for _ in range(2):
        opforge.paged_rotary_kv_cache_append(q, k, k, kp, vp, tables, lens, cu, torch.ones(8, 4), torch.zeros(8, 4))
    lens.fill_(8)                                       # past the table row's 8 positions
    with pytest.raises(IndexError, match="cache_seqlens"):
        opforge.paged_rotary_kv_cache_append(q, k, k, kp, vp, tables, lens, cu, torch.ones(8, 4), torch.zeros(8, 4))
    lens.fill_(3)
    with pytest.raises(IndexError, match="positions must be in"):   # the same tensors, a shorter table
        opforge.paged_rotary_kv_cache_append(q, k, k, kp, vp, tables, lens, cu, torch.ones(3, 4), torch.zeros(3, 4))


def test_inference_tensors_are_checked_every_call():
    """Tensors made under ``torch.inference_mode`` have no version counter: nothing is remembered."""
    kp, vp = torch.zeros(4, 4, 1, 8), torch.zeros(4, 4, 1, 8)
    q = torch.randn(1, 2, 8)
    with torch.inference_mode():
        tables = torch.tensor([[1, 2]], dtype=torch.int32)
        lens, cu = torch.tensor([3], dtype=torch.int32), torch.tensor([0, 1], dtype=torch.int32)
        for _ in range(2):
            opforge.paged_attention(q, kp, vp, tables, lens, cu, max_query_len=1)
        tables[0, 0] = 9
        with pytest.raises(IndexError, match=r"block_tables\[0, 0\] = 9"):
            opforge.paged_attention(q, kp, vp, tables, lens, cu, max_query_len=1)
