"""The rotary / KV-cache torch path on CPU tensors (fast forms: positions checked on the host,
table rows indexed directly, caches written by slice or one indexed write) against the careful
forms in float64."""
import pytest
import torch

from opforge.ops.rotary import reference
from opforge.testing import TOLERANCE, rel_error


def tables(rows, half):
    angles = torch.arange(rows, dtype=torch.float32)[:, None] * torch.rand(half)
    return angles.cos(), angles.sin()


# (B, Hq, Hkv, S, D, R/2 columns, lengths): full and partial rotary, uniform and ragged lengths
SHAPES = [(1, 9, 3, 1, 64, 32, [50]), (2, 4, 2, 3, 16, 8, [4, 9]), (3, 2, 1, 2, 24, 4, [0, 7, 7])]


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s[:6])))
def test_fast_rotary_kv_cache_append_matches_the_careful_form(shape, dtype, interleaved):
    b, hq, hkv, s, d, half, lengths = shape
    q, k, v = torch.randn(b, hq, s, d).to(dtype), torch.randn(b, hkv, s, d).to(dtype), torch.randn(b, hkv, s, d).to(dtype)
    cos, sin = tables(64, half)
    lens = torch.tensor(lengths, dtype=torch.int32)
    kc, vc = torch.randn(b, hkv, 60, d).to(dtype), torch.randn(b, hkv, 60, d).to(dtype)
    kc64, vc64 = kc.double(), vc.double()
    out = reference.fast_rotary_kv_cache_append(q, k, v, kc, vc, lens, cos, sin, None, interleaved)
    positions = lens.long().view(-1, 1) + torch.arange(s).view(1, -1)
    ref = reference.rotary_kv_cache_append(q.double(), k.double(), v.double(), kc64, vc64, lens, cos.double(),
                                           sin.double(), positions, interleaved)
    assert out.dtype == dtype and rel_error(out, ref) <= TOLERANCE[dtype]
    assert rel_error(kc, kc64) <= TOLERANCE[dtype] and torch.equal(vc.double(), vc64)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fast_rotary_embedding_in_place_and_shared_positions(dtype):
    q, k = torch.randn(2, 4, 5, 16).to(dtype), torch.randn(2, 2, 5, 16).to(dtype)
    cos, sin = tables(8, 6)
    positions = torch.tensor([0, 3, 7, 2, 1])
    ref = reference.rotary_embedding(q.double(), k.double(), cos.double(), sin.double(), positions)
    q_out, k_out = reference.fast_rotary_embedding(q, k, cos, sin, positions, inplace=True)
    assert q_out is q and k_out is k
    assert rel_error(q, ref[0]) <= TOLERANCE[dtype] and rel_error(k, ref[1]) <= TOLERANCE[dtype]
