"""The float64 attention reference and tolerances of the Metal attention tests, shared with the
emulator's mutation tests (tests/metal_emu/test_mutations.py)."""
import torch

TOL = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


def reference(q, k, v, causal, scale, seqlens=None):
    """float64 attention; with ``seqlens`` (decode) sequence b holds seqlens[b] keys and the Sq
    queries are its last Sq positions. Rows that see no key are 0."""
    q, k, v = q.double(), k.double(), v.double()
    b, hq, sq, d = q.shape
    hkv, sk = k.shape[1], k.shape[2]
    k = k.repeat_interleave(hq // hkv, dim=1)
    v = v.repeat_interleave(hq // hkv, dim=1)
    s = torch.einsum("bhid,bhjd->bhij", q, k) * scale
    i = torch.arange(sq).view(sq, 1)
    j = torch.arange(sk).view(1, sk)
    if seqlens is None:
        seen = (j <= i + sk - sq) if causal else torch.ones(sq, sk, dtype=torch.bool)
        seen = seen.expand(b, sq, sk)
    else:
        lens = seqlens.long().view(b, 1, 1)
        seen = j.view(1, 1, sk) < (lens - sq + i.view(1, sq, 1) + 1)
    seen = seen.unsqueeze(1)
    s = s.masked_fill(~seen, float("-inf"))
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)
    out = torch.einsum("bhij,bhjd->bhid", p, v)
    return out.masked_fill(~seen.any(-1, keepdim=True), 0.0)


def rel_err(out, ref):
    return ((out.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()
