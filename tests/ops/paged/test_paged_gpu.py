"""The paged ops on a CUDA GPU: real sizes against the float64 oracle, equality with the contiguous
decode_attention at the same lengths, and CUDA graphs captured once and replayed with new lengths,
tables and token placement (equal to eager calls on the same inputs)."""
import pytest
import torch

import opforge
from opforge.ops.paged import cases, reference
from opforge.ops.rotary.cases import rope_tables
from opforge.testing import TOLERANCE, check_case, max_rel_error

pytestmark = pytest.mark.gpu
I32 = torch.int32


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_real_sizes(dtype):
    for bs in (16, 64):
        check_case(cases.attention_case([16384, 1, 9000, 333], [1, 1, 1, 1], 32, 8, 128, bs, dtype), "triton")
        check_case(cases.attention_case([4100, 2048, 700, 64], [4, 2048, 16, 1], 32, 8, 128, bs, dtype), "triton")
    check_case(cases.attention_case([3000, 2000], [16, 5], 16, 2, 64, 16, dtype), "triton")
    # 32 decode sequences of 8 key/value heads: the 128-key tiles (config.WIDE_KEYS_TILE)
    lengths = [512, 513, 1, 127, 128, 129, 4000, 16] * 4
    check_case(cases.attention_case(lengths, [1] * 32, 32, 8, 64, 16, dtype), "triton")
    check_case(cases.attention_case(lengths, [1] * 32, 32, 8, 128, 16, dtype), "triton")
    check_case(cases.attention_case([2048, 1500], [512, 1500], 8, 8, 256, 32, dtype), "triton")
    check_case(cases.append_case([4100, 2048, 700, 64], [4, 2048, 16, 1], 8, 128, 16, dtype), "triton")


def test_contiguous_pages_equal_decode_attention_at_real_sizes():
    b, hq, hkv, d, bs, s_max = 8, 32, 8, 128, 16, 8192
    ck = torch.randn(b, s_max, hkv, d, device="cuda", dtype=torch.bfloat16)
    cv = torch.randn(b, s_max, hkv, d, device="cuda", dtype=torch.bfloat16)
    kp, vp = ck.view(-1, bs, hkv, d), cv.view(-1, bs, hkv, d)
    tables = torch.arange(b * s_max // bs, dtype=I32, device="cuda").view(b, -1)
    lens = torch.tensor([8192, 1, 4097, 16, 17, 3000, 8191, 100], dtype=I32, device="cuda")
    q = torch.randn(b, hq, 1, d, device="cuda", dtype=torch.bfloat16)
    cu = torch.arange(b + 1, dtype=I32, device="cuda")
    paged = opforge.paged_attention(q[:, :, 0], kp, vp, tables, lens, cu, max_query_len=1)
    dense = opforge.decode_attention(q, ck.transpose(1, 2), cv.transpose(1, 2), lens)
    ref = reference.paged_attention(q[:, :, 0].double(), kp.double(), vp.double(), tables, lens, cu, d ** -0.5)
    assert max_rel_error(paged, ref) <= TOLERANCE[torch.bfloat16]
    assert max_rel_error(paged, dense[:, :, 0].double()) <= TOLERANCE[torch.bfloat16]


def _step(q, k, v, kp, vp, tables, before, after, cu, cos, sin, max_query_len):
    q_rot = opforge.paged_rotary_kv_cache_append(q, k, v, kp, vp, tables, before, cu, cos, sin, check=False)
    return opforge.paged_attention(q_rot, kp, vp, tables, after, cu, max_query_len=max_query_len)


@pytest.mark.parametrize("max_query_len", [1, 4, 64])
def test_cuda_graph_replays_with_new_lengths_and_tables(max_query_len):
    """One captured step (rotary append + attention) replayed with new lengths, tables and cu_seqlens
    equals the eager step on the same inputs, and both match the oracle."""
    b, hq, hkv, d, bs, blocks = 4, 16, 4, 128, 16, 64
    dtype = torch.bfloat16
    t = b * max(max_query_len // 2, 1)
    kp = torch.randn(blocks * 8, bs, hkv, d, device="cuda", dtype=dtype)
    vp = torch.randn_like(kp)
    cos, sin = rope_tables(blocks * bs, d, "cuda")
    q, k, v = (torch.randn(t, h, d, device="cuda", dtype=dtype) for h in (hq, hkv, hkv))
    tables = torch.zeros(b, blocks, dtype=I32, device="cuda")
    before, after = (torch.zeros(b, dtype=I32, device="cuda") for _ in range(2))
    cu = torch.zeros(b + 1, dtype=I32, device="cuda")

    def place(lengths, counts):
        perm = torch.randperm(kp.shape[0], device="cuda")[:b * blocks].view(b, blocks).to(I32)
        tables.copy_(perm)
        before.copy_(torch.tensor(lengths, dtype=I32))
        after.copy_(torch.tensor([n + c for n, c in zip(lengths, counts)], dtype=I32))
        cu.copy_(torch.tensor([0] + list(torch.tensor(counts).cumsum(0)), dtype=I32))
        for x in (q, k, v):
            x.normal_()

    m = max_query_len
    even = [max(m // 2, 1)] * b
    uneven = [m, 1, m // 2, m // 2 - 1] if m > 1 else even    # the same T, new maximum and placement
    place([5, 0, 100, 700], even)
    _step(q, k, v, kp, vp, tables, before, after, cu, cos, sin, m)   # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = _step(q, k, v, kp, vp, tables, before, after, cu, cos, sin, m)
    for lengths, counts in (([17, 1000 - m, 3, 64], even), ([0, 15, 16, 1023 - 2 * m], uneven)):
        place(lengths, counts)
        graph.replay()
        torch.cuda.synchronize()
        replayed = out.clone()
        eager = _step(q, k, v, kp, vp, tables, before, after, cu, cos, sin, m)
        assert torch.equal(replayed, eager)
        q_rot = reference.paged_rotary_kv_cache_append(q.double(), k.double(), v.double(), kp.double().clone(),
                                                       vp.double().clone(), tables, before, cu, cos.double(),
                                                       sin.double())
        ref = reference.paged_attention(q_rot, kp.double(), vp.double(), tables, after, cu, d ** -0.5)
        assert max_rel_error(replayed, ref) <= TOLERANCE[dtype], (lengths, counts)
