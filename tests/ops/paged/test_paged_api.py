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


@pytest.mark.cpu_only
def test_torch_compile_fullgraph_matches_eager():
    """All three ops are single graph nodes under torch.compile (the in-place rotary too)."""
    from opforge.ops.rotary.cases import rope_tables

    layout = cases.make_layout([20, 9], [2, 9], 8, share=False)
    kp, vp = torch.randn(layout.num_blocks, 8, 2, 16), torch.randn(layout.num_blocks, 8, 2, 16)
    q, k, v = torch.randn(11, 4, 16), torch.randn(11, 2, 16), torch.randn(11, 2, 16)
    before = torch.tensor([18, 0], dtype=I32)
    after = before + torch.tensor([2, 9], dtype=I32)
    tables, cu = layout.block_tables, layout.cu_seqlens
    cos, sin = rope_tables(64, 16, "cpu")

    def step(q, kp, vp):
        q = opforge.paged_rotary_kv_cache_append(q, k, v, kp, vp, tables, before, cu, cos, sin, inplace=True)
        opforge.paged_kv_cache_append(kp, vp, k, v, tables, before, cu)
        return opforge.paged_attention(q, kp, vp, tables, after, cu, max_query_len=9)

    inputs = (q.clone(), kp.clone(), vp.clone())
    eager = step(*inputs)
    compiled_inputs = (q.clone(), kp.clone(), vp.clone())
    out = torch.compile(step, fullgraph=True, backend="aot_eager")(*compiled_inputs)
    torch._dynamo.reset()
    assert torch.allclose(out, eager, atol=1e-6)
    for a, b in zip(inputs, compiled_inputs):
        assert torch.allclose(a, b, atol=1e-6)          # q rotated in place, the pools written


def test_a_known_signature_still_checks_values():
    """The second call with the same shapes skips the metadata checks, never the value checks."""
    kp, vp, k, v, tables, lens, cu = _setup()
    opforge.paged_kv_cache_append(kp, vp, k, v, tables, lens, cu)
    _refuses(IndexError, r"cache_seqlens\[1\]", opforge.paged_kv_cache_append, kp, vp, k, v, tables,
             torch.tensor([0, 10 ** 4], dtype=I32), cu, pools=(kp, vp))
    q = torch.randn(4, 4, 8)
    after = lens + (cu[1:] - cu[:-1])
    opforge.paged_attention(q, kp, vp, tables, after, cu, max_query_len=3)
    _refuses(ValueError, "max_query_len = 3", opforge.paged_attention, q, kp, vp, tables, after,
             torch.tensor([0, 0, 4], dtype=I32), max_query_len=3)
    cos, sin = torch.randn(16, 4), torch.randn(16, 4)
    opforge.paged_rotary_kv_cache_append(q, k, v, kp, vp, tables, lens, cu, cos, sin)
    _refuses(IndexError, r"positions must be in \[0, 16\)", opforge.paged_rotary_kv_cache_append, q, k, v, kp, vp,
             tables, lens, cu, cos, sin, torch.tensor([0, 1, 2, 16]), pools=(kp, vp))
    opforge.paged_rotary_kv_cache_append(q, k, v, kp, vp, tables, lens, cu, cos[:8], sin[:8])
    _refuses(IndexError, r"positions must be in \[0, 8\)", opforge.paged_rotary_kv_cache_append, q, k, v, kp, vp,
             tables, torch.tensor([4, 8], dtype=I32), cu, cos[:8], sin[:8], pools=(kp, vp))


@pytest.mark.cpu_only
def test_custom_ops_pass_torch_library_opcheck():
    from opforge.ops.rotary.cases import rope_tables

    layout = cases.make_layout([20, 9], [2, 9], 8, share=False)
    kp, vp = torch.randn(layout.num_blocks, 8, 2, 16), torch.randn(layout.num_blocks, 8, 2, 16)
    q, k, v = torch.randn(11, 4, 16), torch.randn(11, 2, 16), torch.randn(11, 2, 16)
    before = torch.tensor([18, 0], dtype=I32)
    after = before + torch.tensor([2, 9], dtype=I32)
    cos, sin = rope_tables(64, 16, "cpu")
    t, cu = layout.block_tables, layout.cu_seqlens
    checks = [(torch.ops.opforge.paged_attention.default, (q, kp, vp, t, after, cu), {"max_query_len": 9}),
              (torch.ops.opforge.paged_kv_cache_append.default, (kp, vp, k, v, t, before, cu), {}),
              (torch.ops.opforge.paged_rotary_kv_cache_append.default, (q, k, v, kp, vp, t, before, cu, cos, sin), {})]
    for op, args, kwargs in checks:
        result = torch.library.opcheck(op, args, kwargs, test_utils=("test_schema", "test_faketensor"))
        assert set(result.values()) == {"SUCCESS"}, result


def test_explain_every_op():
    kp, vp, k, v, tables, lens, cu = _setup()
    q, cos, sin = torch.randn(4, 4, 8), torch.randn(16, 4), torch.randn(16, 4)
    append = str(opforge.explain("paged_kv_cache_append", kp, vp, k, v, tables, lens, cu, check=False))
    rotary = str(opforge.explain("paged_rotary_kv_cache_append", q, k, v, kp, vp, tables, lens, cu, cos, sin,
                                 positions=torch.zeros(4, dtype=I32), interleaved=True))
    assert "paged_kv_cache_append on T=4 B=2" in append and "R=8 interleaved" in rotary


def test_tokens_without_sequences_are_refused_by_shape():
    """B = 0 with T > 0 is refused from the shapes alone (so on a GPU too): no kernel could place them."""
    kp, vp = torch.zeros(4, 4, 2, 8), torch.zeros(4, 4, 2, 8)
    none = torch.zeros(0, 2, dtype=I32), torch.zeros(0, dtype=I32), torch.zeros(1, dtype=I32)
    _refuses(ValueError, "no sequence", opforge.paged_kv_cache_append, kp, vp, torch.ones(2, 2, 8),
             torch.ones(2, 2, 8), *none, pools=(kp, vp))
    _refuses(ValueError, "no sequence", opforge.paged_attention, torch.ones(2, 4, 8), kp, vp, *none, max_query_len=1)
