"""paged_kv_cache_append, paged_rotary_kv_cache_append and paged_attention refuse bad input with an
error naming the argument, before anything is written."""
import pytest
import torch

import opforge
from opforge.ops.paged import cases

I32 = torch.int32


def _setup(block_size=4, hkv=2, d=8, lengths=(5, 3), new=(1, 3)):
    layout = cases.make_layout(list(lengths), list(new), block_size, share=False)
    shape = (layout.num_blocks, block_size, hkv, d)
    kp, vp = torch.zeros(shape), torch.zeros(shape)
    t = layout.tokens
    k, v = torch.randn(t, hkv, d), torch.randn(t, hkv, d)
    before = torch.tensor([n - m for n, m in zip(lengths, new)], dtype=I32)
    return kp, vp, k, v, layout.block_tables, before, layout.cu_seqlens


def _refuses(error, match, fn, *args, pools=None, **kwargs):
    snapshot = [p.clone() for p in pools] if pools else []
    with pytest.raises(error, match=match):
        fn(*args, **kwargs)
    for before, after in zip(snapshot, pools or ()):
        assert torch.equal(before, after), "a refused call wrote into the pools"


def test_append_bad_metadata_names_the_argument():
    kp, vp, k, v, tables, lens, cu = _setup()
    f = opforge.paged_kv_cache_append
    _refuses(TypeError, "v_pages", f, kp, vp.half(), k, v, tables, lens, cu)
    _refuses(ValueError, "v_pages", f, kp, vp[:-1], k, v, tables, lens, cu)
    _refuses(ValueError, "k must be", f, kp, vp, k[:, :1], v, tables, lens, cu)
    _refuses(TypeError, "k must have", f, kp, vp, k.half(), v, tables, lens, cu)
    _refuses(ValueError, "v must have", f, kp, vp, k, v[:-1], tables, lens, cu)
    _refuses(TypeError, "block_tables", f, kp, vp, k, v, tables.float(), lens, cu)
    _refuses(ValueError, "cache_seqlens", f, kp, vp, k, v, tables, lens[:1], cu)
    _refuses(ValueError, "cu_seqlens", f, kp, vp, k, v, tables, lens, cu[:-1])
    _refuses(ValueError, "block_tables", f, kp, vp, k, v, tables[0], lens, cu)
    _refuses(ValueError, "contiguous", f, kp.transpose(2, 3), vp.transpose(2, 3), k.transpose(1, 2),
             v.transpose(1, 2), tables, lens, cu)


def test_append_bad_values_raise_before_writing():
    kp, vp, k, v, tables, lens, cu = _setup()
    f = opforge.paged_kv_cache_append
    pools = (kp, vp)
    _refuses(ValueError, r"cu_seqlens\[-1\] = 3 must equal T = 4", f, kp, vp, k, v, tables, lens,
             torch.tensor([0, 1, 3], dtype=I32), pools=pools)
    _refuses(ValueError, "must not decrease", f, kp, vp, k, v, tables, lens, torch.tensor([0, 5, 4], dtype=I32),
             pools=pools)
    _refuses(ValueError, r"cu_seqlens\[0\]", f, kp, vp, k, v, tables, lens, torch.tensor([1, 1, 4], dtype=I32),
             pools=pools)
    cap = tables.shape[1] * kp.shape[1]
    _refuses(IndexError, r"cache_seqlens\[1\]", f, kp, vp, k, v, tables, torch.tensor([4, cap - 2], dtype=I32), cu,
             pools=pools)
    _refuses(IndexError, r"cache_seqlens\[0\]", f, kp, vp, k, v, tables, torch.tensor([-1, 0], dtype=I32), cu,
             pools=pools)
    bad = tables.clone()
    bad[1, 0] = kp.shape[0]
    _refuses(IndexError, r"block_tables\[1, 0\]", f, kp, vp, k, v, bad, lens, cu, pools=pools)
    bad[1, 0] = -1
    _refuses(IndexError, r"block_tables\[1, 0\]", f, kp, vp, k, v, bad, lens, cu, pools=pools)


def test_append_ignores_table_entries_it_does_not_need():
    kp, vp, k, v, tables, lens, cu = _setup()
    tables = tables.clone()
    tables[:, -1] = 10 ** 6                      # past every sequence's used blocks: never read
    opforge.paged_kv_cache_append(kp, vp, k, v, tables, lens, cu)
    assert torch.equal(kp[tables[1, 0], :3], k[1:])


def test_attention_bad_input_names_the_argument():
    kp, vp, _, _, tables, _, cu = _setup()
    lens = torch.tensor([5, 3], dtype=I32)
    q = torch.randn(4, 4, 8)
    f = opforge.paged_attention
    _refuses(ValueError, "not a multiple", f, torch.randn(4, 3, 8), kp, vp, tables, lens, cu, max_query_len=3)
    _refuses(TypeError, "q must have", f, q.half(), kp, vp, tables, lens, cu, max_query_len=3)
    _refuses(ValueError, "q must be", f, torch.randn(4, 4, 6), kp, vp, tables, lens, cu, max_query_len=3)
    _refuses(TypeError, "max_query_len", f, q, kp, vp, tables, lens, cu, max_query_len=torch.tensor(3))
    _refuses(ValueError, "max_query_len", f, q, kp, vp, tables, lens, cu, max_query_len=0)
    _refuses(ValueError, "max_query_len = 2", f, q, kp, vp, tables, lens, cu, max_query_len=2)
    _refuses(ValueError, r"cu_seqlens\[-1\]", f, q[:3], kp, vp, tables, lens, cu, max_query_len=3)
    cap = tables.shape[1] * kp.shape[1]
    _refuses(IndexError, "beyond", f, q, kp, vp, tables, torch.tensor([cap + 1, 3], dtype=I32), cu, max_query_len=3)
    bad = tables.clone()
    bad[0, 1] = 99
    _refuses(IndexError, r"block_tables\[0, 1\] = 99", f, q, kp, vp, bad, lens, cu, max_query_len=3)
    _refuses(TypeError, "scale", f, q, kp, vp, tables, lens, cu, max_query_len=3, scale="x")
    _refuses(ValueError, "one device", f, q.to("meta"), kp, vp, tables, lens, cu, max_query_len=3)


def test_rotary_append_bad_input():
    kp, vp, k, v, tables, lens, cu = _setup()
    q = torch.randn(4, 4, 8)
    cos, sin = torch.randn(16, 4), torch.randn(16, 4)
    f = opforge.paged_rotary_kv_cache_append
    pools = (kp, vp)
    _refuses(ValueError, "q has 3 tokens", f, q[:3], k, v, kp, vp, tables, lens, cu, cos, sin)
    _refuses(TypeError, "cos must be a float32", f, q, k, v, kp, vp, tables, lens, cu, cos.double(), sin)
    _refuses(ValueError, "exceeds the head dim", f, q, k, v, kp, vp, tables, lens, cu, torch.randn(16, 5),
             torch.randn(16, 5))
    _refuses(ValueError, "positions", f, q, k, v, kp, vp, tables, lens, cu, cos, sin, torch.zeros(3, dtype=I32))
    _refuses(IndexError, r"positions must be in \[0, 16\)", f, q, k, v, kp, vp, tables, lens, cu, cos, sin,
             torch.tensor([0, 1, 2, 16]), pools=pools)
    _refuses(IndexError, r"rows of cos/sin", f, q, k, v, kp, vp, tables, lens, cu, cos[:4], sin[:4], pools=pools)
    _refuses(TypeError, "bools", f, q, k, v, kp, vp, tables, lens, cu, cos, sin, inplace=1)


def test_empty_step_writes_nothing_and_returns_empty():
    kp, vp, _, _, tables, lens, _ = _setup()
    cu = torch.zeros(3, dtype=I32)
    opforge.paged_kv_cache_append(kp, vp, torch.zeros(0, 2, 8), torch.zeros(0, 2, 8), tables, lens, cu)
    assert not kp.any()
    out = opforge.paged_attention(torch.zeros(0, 4, 8), kp, vp, tables, lens, cu, max_query_len=1)
    assert out.shape == (0, 4, 8)


def test_explain_names_the_variant():
    kp, vp, _, _, tables, _, cu = _setup()
    lens = torch.tensor([5, 3], dtype=I32)
    text = str(opforge.explain("paged_attention", torch.randn(4, 4, 8), kp, vp, tables, lens, cu, max_query_len=3))
    assert "paged_attention" in text and "chosen: torch.reference" in text
