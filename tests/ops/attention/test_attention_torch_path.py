"""The attention torch path: PyTorch's SDPA (grouped heads, valid cache slots only) for float32 and
half inputs, the careful composite for float64, both against an einsum oracle written here; and
the contract that a cache slot at or past a sequence's length never reaches the output."""
import pytest
import torch

import opforge
from opforge.ops.attention import reference
from opforge.testing import DEVICE, TOLERANCE, rel_error

FAST_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def oracle(q, k, v, seen, scale):
    """float64 attention over the (B, Sq, Sk) mask ``seen``; rows that see no key give zeros."""
    q, k, v = q.double(), k.double(), v.double()
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = torch.einsum("bhid,bhjd->bhij", q, k) * scale
    s = s.masked_fill(~seen[:, None], float("-inf"))
    p = torch.softmax(s, -1).nan_to_num(0.0)
    return torch.einsum("bhij,bhjd->bhid", p, v)


def decode_oracle(q, kc, vc, lens, scale):
    sq, s_max = q.shape[2], kc.shape[2]
    i, j = torch.arange(sq).view(1, sq, 1), torch.arange(s_max).view(1, 1, s_max)
    seen = j <= lens.long().view(-1, 1, 1) - sq + i
    # the oracle reads only valid slots: what lies past a length is replaced by zeros first
    valid = (j.view(1, 1, s_max, 1) < lens.long().view(-1, 1, 1, 1))
    return oracle(q, torch.where(valid, kc, 0), torch.where(valid, vc, 0), seen, scale)


def caches_with_garbage(b, hkv, s_max, d, dtype, lens, garbage=float("nan")):
    kc, vc = torch.randn(b, hkv, s_max, d).to(dtype), torch.randn(b, hkv, s_max, d).to(dtype)
    for i, n in enumerate(lens.tolist()):
        kc[i, :, n:] = garbage
        vc[i, :, n:] = garbage
    return kc, vc


# (B, Hq, Hkv, Sq, S_max, lengths): uniform and ragged lengths, Sq 1 and 4, a length below Sq
DECODE = [
    (1, 9, 3, 1, 64, [37]),
    (3, 4, 2, 1, 40, [40, 7, 19]),
    (2, 8, 1, 4, 32, [12, 12]),
    (2, 4, 4, 4, 32, [2, 30]),       # sequence 0: its first two queries see no key (zeros)
    (2, 4, 2, 1, 16, [0, 5]),        # an empty sequence gives zeros
]


@pytest.mark.parametrize("backend,garbage", [("torch", float("nan")), ("torch", float("inf")),
                                             ("triton", float("nan"))])   # the interpreter is slow
@pytest.mark.parametrize("shape", DECODE, ids=lambda s: "x".join(map(str, s[:5])) + "-" + ",".join(map(str, s[5])))
def test_decode_never_reads_past_the_lengths(backend, garbage, shape):
    b, hq, hkv, sq, s_max, lengths = shape
    lens = torch.tensor(lengths, dtype=torch.int32)
    dtypes = (torch.float32, torch.bfloat16, torch.float64) if backend == "torch" else (torch.float32,)
    device = "cpu" if backend == "torch" else DEVICE     # Triton: the GPU, or the interpreter without one
    for dtype in dtypes:
        q = torch.randn(b, hq, sq, 64).to(dtype)
        kc, vc = caches_with_garbage(b, hkv, s_max, 64, dtype, lens, garbage)
        with opforge.backend(backend):
            out = opforge.decode_attention(q.to(device), kc.to(device), vc.to(device), lens.to(device)).cpu()
        assert torch.isfinite(out).all(), dtype
        assert rel_error(out, decode_oracle(q, kc, vc, lens, 64 ** -0.5)) <= TOLERANCE[dtype], dtype


@pytest.mark.parametrize("shape", DECODE, ids=lambda s: "x".join(map(str, s[:5])) + "-" + ",".join(map(str, s[5])))
def test_decode_careful_form_ignores_slots_past_the_lengths(shape):
    # The form the torch path runs for lengths that live on a GPU (read on the host: never).
    b, hq, hkv, sq, s_max, lengths = shape
    lens = torch.tensor(lengths)
    q = torch.randn(b, hq, sq, 64, dtype=torch.float64)
    kc, vc = caches_with_garbage(b, hkv, s_max, 64, torch.float64, lens)
    out = reference.decode_attention(q, kc, vc, lens)
    assert rel_error(out, decode_oracle(q, kc, vc, lens, 64 ** -0.5)) <= 1e-12


@pytest.mark.parametrize("dtype", FAST_DTYPES)
@pytest.mark.parametrize("shape", DECODE, ids=lambda s: "x".join(map(str, s[:5])) + "-" + ",".join(map(str, s[5])))
def test_fast_decode_matches_the_careful_form(dtype, shape):
    b, hq, hkv, sq, s_max, lengths = shape
    lens = torch.tensor(lengths, dtype=torch.int64)
    q = torch.randn(b, hq, sq, 64).to(dtype)
    kc, vc = torch.randn(b, hkv, s_max, 64).to(dtype), torch.randn(b, hkv, s_max, 64).to(dtype)
    out = reference.fast_decode_attention(q, kc, vc, lens, 0.3)
    assert out.dtype == dtype and out.shape == q.shape
    ref = reference.decode_attention(q.double(), kc.double(), vc.double(), lens, 0.3)
    assert rel_error(out, ref) <= TOLERANCE[dtype]


def test_fast_decode_reads_only_the_valid_slots_through_sdpa(monkeypatch):
    # One length for the batch: SDPA sees exactly the first `length` slots, grouped heads unrepeated.
    seen = {}
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, **kwargs):
        seen.update(k=tuple(k.shape), gqa=kwargs.get("enable_gqa"))
        return sdpa(q, k, v, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    q, kc, vc = torch.randn(1, 9, 1, 64), torch.randn(1, 3, 256, 64), torch.randn(1, 3, 256, 64)
    reference.fast_decode_attention(q, kc, vc, torch.tensor([100]))
    assert seen == {"k": (1, 3, 100, 64), "gqa": True}


# (B, Hq, Hkv, Sq, Sk, causal): Sq == Sk, Sq < Sk (end-aligned mask), Sq > Sk (empty rows), no keys
PREFILL = [(2, 4, 2, 9, 9, True), (1, 6, 3, 5, 13, True), (1, 4, 1, 12, 7, True), (2, 4, 4, 7, 11, False),
           (1, 2, 1, 3, 0, False)]


@pytest.mark.parametrize("dtype", FAST_DTYPES)
@pytest.mark.parametrize("shape", PREFILL, ids=lambda s: "x".join(map(str, s)))
def test_fast_prefill_matches_the_oracle(dtype, shape):
    b, hq, hkv, sq, sk, causal = shape
    q, k, v = torch.randn(b, hq, sq, 32).to(dtype), torch.randn(b, hkv, sk, 32).to(dtype), \
        torch.randn(b, hkv, sk, 32).to(dtype)
    with opforge.backend("torch"):
        out = opforge.attention(q, k, v, causal=causal, scale=0.25)
    i, j = torch.arange(sq).view(sq, 1), torch.arange(sk).view(1, sk)
    seen = ((j <= i + sk - sq) if causal else torch.ones(sq, sk, dtype=torch.bool)).expand(b, sq, sk)
    assert out.dtype == dtype
    assert rel_error(out, oracle(q, k, v, seen, 0.25)) <= TOLERANCE[dtype]
    careful = reference.attention(q.double(), k.double(), v.double(), causal, 0.25)
    assert rel_error(careful, oracle(q, k, v, seen, 0.25)) <= 1e-12


@pytest.mark.parametrize("causal", [False, True])
def test_oracle_in_row_chunks_equals_one_piece(monkeypatch, causal):
    """The float64 oracle bounds its score matrix by computing query rows in chunks (a 16K
    sequence would otherwise need 64 GiB): any chunking gives the one-piece result."""
    q, k, v = (torch.randn(2, 4, s, 16, dtype=torch.float64) for s in (37, 29, 29))
    k, v = k[:, :2], v[:, :2]
    whole = reference.attention(q, k, v, causal=causal)
    monkeypatch.setattr(reference, "SCORE_CHUNK_ELEMENTS", 2 * 4 * 29 * 5)   # 5 rows per chunk
    chunked = reference.attention(q, k, v, causal=causal)
    assert chunked.shape == whole.shape and rel_error(chunked, whole) <= 1e-14
