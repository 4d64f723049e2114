"""Metal attention kernels (the unchanged src/opforge/ops/attention/attention.metal) in the MSL
emulator, against a float64 reference (tests/metal_emu/attention_checks.py): prefill (causal /
not, end-aligned mask, GQA, strided views, D 64 / 80 / 128) and split-KV decode (different lengths per sequence, Sq 1 and 4,
several splits, including splits and rows that see no key)."""
import math
from types import SimpleNamespace

import pytest
import torch

from metal_emu.attention_checks import TOL, reference, rel_err
from opforge.ops.attention import metal as attn_metal

pytestmark = pytest.mark.usefixtures("emulate")


def rand(*shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype)


PREFILL = [
    # (B, Hq, Hkv, Sq, Sk, D, causal)
    (1, 2, 2, 9, 9, True),
    (2, 4, 2, 5, 13, True),      # Sq < Sk: the mask is aligned to the end; GQA 2
    (1, 2, 1, 12, 7, True),      # Sq > Sk: the first rows see no key (zeros)
    (1, 2, 2, 7, 11, False),
    (1, 4, 1, 3, 17, False),     # MQA
]


@pytest.mark.parametrize("d", [64, 128, 80])
@pytest.mark.parametrize("case", PREFILL, ids=lambda c: "x".join(map(str, c)))
def test_prefill_float32(case, d):
    b, hq, hkv, sq, sk, causal = case
    q, k, v = (rand(b, h, s, d, dtype=torch.float32, seed=i) for i, (h, s) in
               enumerate(((hq, sq), (hkv, sk), (hkv, sk))))
    scale = 1.0 / math.sqrt(d)
    out = attn_metal.prefill(q, k, v, causal, scale)
    ref = reference(q, k, v, causal, scale)
    assert rel_err(out, ref) <= TOL[torch.float32]
    if sq > sk and causal:
        assert torch.equal(out[:, :, : sq - sk], torch.zeros_like(out[:, :, : sq - sk]))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_prefill_half_and_bfloat(dtype):
    b, hq, hkv, sq, sk, d = 1, 4, 2, 10, 19, 64
    q, k, v = (rand(b, h, s, d, dtype=dtype, seed=10 + i) for i, (h, s) in
               enumerate(((hq, sq), (hkv, sk), (hkv, sk))))
    out = attn_metal.prefill(q, k, v, True, 0.125)
    assert out.dtype == dtype
    assert rel_err(out, reference(q, k, v, True, 0.125)) <= TOL[dtype]


def test_prefill_reads_strided_views_in_place():
    # (B, S, H, D) tensors seen as (B, H, S, D): batch/head/seq strides are not packed.
    b, hq, hkv, sq, sk, d = 2, 4, 2, 6, 10, 96
    q = rand(b, sq, hq, d, dtype=torch.float16, seed=20).transpose(1, 2)
    k = rand(b, sk, hkv, d, dtype=torch.float16, seed=21).transpose(1, 2)
    v = rand(b, sk, hkv, d, dtype=torch.float16, seed=22).transpose(1, 2)
    assert not q.is_contiguous()
    out = attn_metal.prefill(q, k, v, True, 0.1)
    assert rel_err(out, reference(q, k, v, True, 0.1)) <= TOL[torch.float16]


DECODE = [
    # (B, Hq, Hkv, Sq, S_max, seqlens, n_split)
    (3, 2, 1, 1, 40, (1, 17, 40), None),
    (3, 4, 2, 1, 70, (70, 33, 5), 3),     # several splits, some of them empty
    (2, 2, 2, 4, 50, (4, 50), 2),         # Sq = 4, causal among the new tokens
    (2, 4, 1, 4, 24, (2, 9), 1),          # len < Sq: the first queries see no key
    (1, 12, 1, 2, 33, (33,), 2),          # GQA 12: two threadgroups of 6 heads per kv head
]


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("case", DECODE, ids=lambda c: f"B{c[0]}Hq{c[1]}Hkv{c[2]}Sq{c[3]}S{c[4]}split{c[6]}")
def test_decode_float32(case, d):
    b, hq, hkv, sq, s_max, lens, n_split = case
    q = rand(b, hq, sq, d, dtype=torch.float32, seed=30)
    kc = rand(b, hkv, s_max, d, dtype=torch.float32, seed=31)
    vc = rand(b, hkv, s_max, d, dtype=torch.float32, seed=32)
    seqlens = torch.tensor(lens, dtype=torch.int32)
    scale = 1.0 / math.sqrt(d)
    out = attn_metal.decode(q, kc, vc, seqlens, scale, n_split=n_split)
    ref = reference(q, kc, vc, True, scale, seqlens)
    assert rel_err(out, ref) <= TOL[torch.float32]


@pytest.mark.parametrize("dtype, d", [(torch.float16, 96), (torch.bfloat16, 64)])
def test_decode_half_and_bfloat(dtype, d):
    b, hq, hkv, sq, s_max = 2, 4, 2, 4, 45
    q = rand(b, hq, sq, d, dtype=dtype, seed=40)
    kc = rand(b, hkv, s_max, d, dtype=dtype, seed=41)
    vc = rand(b, hkv, s_max, d, dtype=dtype, seed=42)
    seqlens = torch.tensor([45, 12], dtype=torch.int64)
    out = attn_metal.decode(q, kc, vc, seqlens, 0.2, n_split=2)
    assert rel_err(out, reference(q, kc, vc, True, 0.2, seqlens)) <= TOL[dtype]


def test_variant_table_glue_runs_call_objects():
    """The VARIANTS rows take the family's call objects (only their attribute names are used)."""
    q = rand(1, 2, 3, 64, dtype=torch.float32, seed=50)
    k = rand(1, 1, 8, 64, dtype=torch.float32, seed=51)
    v = rand(1, 1, 8, 64, dtype=torch.float32, seed=52)
    problem = SimpleNamespace(dtype=torch.float32, head_dim=64, device_type="cpu")
    (name, supports, launch, _), = attn_metal.VARIANTS["attention"]
    assert name == "prefill" and supports(problem) is None
    call = SimpleNamespace(problem=problem, q=q, k=k, v=v, causal=True, scale=0.125)
    assert rel_err(launch(call), reference(q, k, v, True, 0.125)) <= TOL[torch.float32]
    (name, supports, launch, _), = attn_metal.VARIANTS["decode_attention"]
    seqlens = torch.tensor([6], dtype=torch.int32)
    call = SimpleNamespace(problem=problem, q=q, k_cache=k, v_cache=v, cache_seqlens=seqlens, scale=0.125)
    assert rel_err(launch(call), reference(q, k, v, True, 0.125, seqlens)) <= TOL[torch.float32]
    assert "take D in" in attn_metal.supports_prefill(SimpleNamespace(dtype=torch.float32, head_dim=60,
                                                                          device_type="cpu"))
    assert attn_metal.supports_decode(SimpleNamespace(dtype=torch.float64, head_dim=64, device_type="cpu"))


@pytest.mark.parametrize("order", ["forward", "reverse"])
@pytest.mark.parametrize("causal", [True, False])
def test_prefill_several_tiles_and_simdgroups(order, causal):
    """Sq > 32: several threadgroups, all four simdgroups with rows, the last tile ragged; both
    scheduling orders (a simdgroup running ahead exposes a missing barrier)."""
    import metal_emu
    b, hq, hkv, sq, sk, d = 1, 2, 1, 41, 47, 64
    q, k, v = (rand(b, h, s, d, dtype=torch.float32, seed=60 + i) for i, (h, s) in
               enumerate(((hq, sq), (hkv, sk), (hkv, sk))))
    with metal_emu.schedule(order):
        out = attn_metal.prefill(q, k, v, causal, 0.125)
    assert rel_err(out, reference(q, k, v, causal, 0.125)) <= TOL[torch.float32]


def test_decode_in_reverse_schedule_order():
    """Several simdgroups (query heads) per threadgroup, the highest-numbered running first."""
    import metal_emu
    q = rand(2, 8, 3, 64, dtype=torch.float32, seed=70)
    kc = rand(2, 2, 50, 64, dtype=torch.float32, seed=71)
    vc = rand(2, 2, 50, 64, dtype=torch.float32, seed=72)
    seqlens = torch.tensor([50, 21], dtype=torch.int32)
    with metal_emu.schedule("reverse"):
        out = attn_metal.decode(q, kc, vc, seqlens, 0.125, n_split=3)
    assert rel_err(out, reference(q, kc, vc, True, 0.125, seqlens)) <= TOL[torch.float32]


def test_head_dim_256_prefill_and_decode():
    q = rand(1, 2, 9, 256, dtype=torch.float16, seed=80)
    k = rand(1, 1, 12, 256, dtype=torch.float16, seed=81)
    v = rand(1, 1, 12, 256, dtype=torch.float16, seed=82)
    assert rel_err(attn_metal.prefill(q, k, v, True, 0.0625), reference(q, k, v, True, 0.0625)) <= TOL[torch.float16]
    seqlens = torch.tensor([12], dtype=torch.int32)
    out = attn_metal.decode(q[:, :, :3], k, v, seqlens, 0.0625, n_split=2)
    assert rel_err(out, reference(q[:, :, :3], k, v, True, 0.0625, seqlens)) <= TOL[torch.float16]
