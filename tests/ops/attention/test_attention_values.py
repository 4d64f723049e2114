"""attention and decode_attention on every backend against the float64 oracle, on fresh random data:
grouped heads, odd lengths, causal with Sq < Sk, Sq == Sk and Sq > Sk (empty rows), every head dim,
transposed views read in place, huge logits, ragged cache lengths, several KV splits."""
import math

import pytest
import torch
import torch.nn.functional as F

import opforge
from opforge.ops.attention import cases, config, reference, triton_kernels as tk
from opforge.ops.attention.problem import prepare_attention, prepare_decode
from opforge.testing import DEVICE, ON_GPU, TOLERANCE, check_case, max_rel_error

BACKENDS = ["triton", "torch"]
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
gpu = pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU")

# (B, Hq, Hkv, Sq, Sk, D, causal): ratios 1, 4 and 8; Sq and Sk in 1, 3, 17, 33, 70; every head dim
PREFILL = [
    (1, 2, 2, 1, 1, 64, False),
    (2, 4, 1, 3, 17, 64, True),       # Sq < Sk
    (1, 4, 4, 33, 33, 80, True),      # Sq == Sk
    (2, 8, 2, 17, 70, 96, False),
    (1, 8, 1, 70, 33, 128, True),     # Sq > Sk: the first 37 rows see no key
    (1, 2, 1, 17, 3, 256, False),
    (1, 2, 2, 33, 70, 40, True),      # a head dim outside the usual set (padded block)
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shape", PREFILL, ids=lambda s: "x".join(map(str, s)))
def test_prefill_matches_float64(backend, shape):
    *dims, causal = shape
    for dtype in DTYPES:
        event, args, out = check_case(cases.prefill_case(*dims, dtype, causal), backend)
        assert out.shape == args[0].shape and out.dtype == dtype
        assert event.variant == ("prefill" if backend == "triton" else "reference")


@pytest.mark.parametrize("backend", BACKENDS)
def test_rows_that_see_no_key_are_zero(backend):
    q, k, v = (torch.randn(1, 4, s, 64, device=DEVICE) for s in (9, 5, 5))
    k, v = k[:, :2], v[:, :2]
    with opforge.backend(backend):
        out = opforge.attention(q, k, v, causal=True)
    # query i sees keys j <= i - 4: rows 0..3 see nothing
    assert torch.equal(out[:, :, :4], torch.zeros_like(out[:, :, :4]))
    ref = reference.attention(q.double(), k.double(), v.double(), causal=True)
    assert ref[:, :, 4:].abs().sum() > 0
    assert max_rel_error(out, ref) <= TOLERANCE[torch.float32]


@pytest.mark.parametrize("backend", BACKENDS)
def test_causal_square_matches_sdpa(backend):
    q, k, v = (torch.randn(2, 4, 33, 64, device=DEVICE) for _ in range(3))
    with opforge.backend(backend):
        out = opforge.attention(q, k, v, causal=True, scale=0.3)
    ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True, scale=0.3)
    assert max_rel_error(out, ref) <= TOLERANCE[torch.float32]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("scale", [-0.4, 0.0, 0.2])
def test_scale_of_any_sign(backend, scale):
    """A positive scale folds into one FMA on the unmasked tiles (maximum of the raw scores, then
    scaled); zero and negative scales take the plain path. Sk spans several unmasked tiles."""
    q, k, v = (torch.randn(1, 2, 20, 16, device=DEVICE) for _ in range(3))
    k, v = (torch.randn(1, 2, 50, 16, device=DEVICE) for _ in range(2))
    for causal in (False, True):
        with opforge.backend(backend):
            out = opforge.attention(q, k, v, causal=causal, scale=scale)
        ref = reference.attention(q.double(), k.double(), v.double(), causal, scale)
        assert max_rel_error(out, ref) <= TOLERANCE[torch.float32], (scale, causal)


@pytest.mark.parametrize("backend", BACKENDS)
def test_huge_logits(backend):
    for dtype in DTYPES:
        check_case(cases.prefill_case(1, 4, 2, 17, 33, 64, dtype, True, logit_scale=100.0), backend)
        # scale x 100 through the argument too: the running maximum keeps exp in range
        q, k, v = (torch.randn(1, 2, 17, 64, device=DEVICE, dtype=dtype) for _ in range(3))
        with opforge.backend(backend):
            out = opforge.attention(q, k, v, scale=100 / 8)
        ref = reference.attention(q.double(), k.double(), v.double(), scale=100 / 8)
        assert max_rel_error(out, ref) <= TOLERANCE[dtype] * 2


@pytest.mark.parametrize("backend", BACKENDS)
def test_transposed_views_run_in_place(backend):
    """(B, S, H, D) tensors viewed as (B, H, S, D): no copy (empty trace note), right values."""
    b, s, d = 2, 17, 64
    q = torch.randn(b, s, 8, d, device=DEVICE, dtype=torch.float16).transpose(1, 2)
    k = torch.randn(b, s + 16, 2, d, device=DEVICE, dtype=torch.float16).transpose(1, 2)
    v = torch.randn(b, s + 16, 2, d, device=DEVICE, dtype=torch.float16).transpose(1, 2)
    with opforge.backend(backend), opforge.trace() as t:
        out = opforge.attention(q, k, v, causal=True)
    assert t[0].note == ""
    ref = reference.attention(q.double(), k.double(), v.double(), causal=True)
    assert max_rel_error(out, ref) <= TOLERANCE[torch.float16]
    # a cache sliced from a bigger buffer is a strided view too
    big_k = torch.randn(b, 2, 100, d, device=DEVICE, dtype=torch.float16)
    big_v = torch.randn(b, 2, 100, d, device=DEVICE, dtype=torch.float16)
    lens = torch.tensor([40, 7], dtype=torch.int32, device=DEVICE)
    qd = torch.randn(b, 1, 8, d, device=DEVICE, dtype=torch.float16).transpose(1, 2)
    with opforge.backend(backend), opforge.trace() as t:
        out = opforge.decode_attention(qd, big_k[:, :, :64], big_v[:, :, :64], lens)
    assert t[0].note == ""
    ref = reference.decode_attention(qd.double(), big_k[:, :, :64].double(), big_v[:, :, :64].double(), lens)
    assert max_rel_error(out, ref) <= TOLERANCE[torch.float16]


@pytest.mark.parametrize("backend", BACKENDS)
def test_non_contiguous_head_dim_is_copied_and_noted(backend):
    case = cases.prefill_case(1, 2, 1, 17, 33, 64, torch.float32, False, layout="sliced")
    event, _, _ = check_case(case, backend)
    assert "q copied" in event.note and "k copied" in event.note and "v copied" in event.note


# (B, Hq, Hkv, Sq, S_max, D, lengths): lengths 1 and S_max, int32; Sq 1 and 4; ratios 1, 4, 8
DECODE = [
    (2, 8, 2, 1, 70, 64, (70, 1)),
    (3, 4, 1, 4, 33, 128, (4, 33, 17)),
    (1, 8, 1, 1, 17, 96, (17,)),
    (2, 2, 2, 4, 40, 80, (9, 40)),
    (1, 2, 1, 1, 20, 256, (20,)),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shape", DECODE, ids=lambda s: "x".join(map(str, s[:-1])))
def test_decode_matches_float64(backend, shape):
    *dims, lens = shape
    for dtype in DTYPES:
        event, args, out = check_case(cases.decode_case(*dims, dtype, lens), backend)
        assert out.shape == args[0].shape and out.dtype == dtype
        assert event.variant == ("split_kv" if backend == "triton" else "reference")


@pytest.mark.parametrize("backend", BACKENDS)
def test_decode_is_prefill_over_each_sequence(backend):
    """Sequence b's queries are its last Sq positions: the same as causal prefill over its keys."""
    q = torch.randn(3, 8, 4, 64, device=DEVICE)
    kc, vc = torch.randn(3, 2, 50, 64, device=DEVICE), torch.randn(3, 2, 50, 64, device=DEVICE)
    lengths = [50, 4, 23]
    with opforge.backend(backend):
        out = opforge.decode_attention(q, kc, vc, torch.tensor(lengths, device=DEVICE))   # int64 lengths
        for b, n in enumerate(lengths):
            ref = opforge.attention(q[b:b + 1], kc[b:b + 1, :, :n], vc[b:b + 1, :, :n], causal=True)
            assert max_rel_error(out[b:b + 1], ref.double()) <= 1e-5


@pytest.mark.parametrize("backend", BACKENDS)
def test_decode_zero_length_and_short_sequences_give_zeros(backend):
    """Length 0 (an idle slot): zeros; length 2 with Sq 4: the first two queries see nothing."""
    q = torch.randn(2, 4, 4, 64, device=DEVICE)
    kc, vc = torch.randn(2, 4, 20, 64, device=DEVICE), torch.randn(2, 4, 20, 64, device=DEVICE)
    lens = torch.tensor([0, 2], dtype=torch.int32, device=DEVICE)
    with opforge.backend(backend):
        out = opforge.decode_attention(q, kc, vc, lens)
    assert torch.equal(out[0], torch.zeros_like(out[0]))
    assert torch.equal(out[1, :, :2], torch.zeros_like(out[1, :, :2]))
    ref = reference.decode_attention(q.double(), kc.double(), vc.double(), lens)
    assert ref[1, :, 2:].abs().sum() > 0
    assert max_rel_error(out, ref) <= TOLERANCE[torch.float32]


@pytest.mark.parametrize("splits", [2, 3, 7])
def test_decode_several_splits_and_splits_past_the_length(splits):
    """Split-KV with slices past a sequence's length (early exit) and merged partials."""
    for dtype in (torch.float32, torch.bfloat16):
        case = cases.decode_case(3, 8, 2, 4, 96, 64, dtype, (96, 5, 40))
        (q, kc, vc, lens), _ = case.make(DEVICE)
        with opforge.runtime.alloc.poisoned_outputs():
            out = tk.launch_decode(prepare_decode(q, kc, vc, lens, None), splits=splits)
        assert max_rel_error(out, case.oracle((q, kc, vc, lens), {})) <= TOLERANCE[dtype]


@pytest.mark.parametrize("splits", [None, 2, 5])
def test_decode_slices_by_length(splits):
    """Slices that divide the tokens in the cache, not its capacity: short, long and empty
    sequences in one batch, and more slices than a short sequence has key tiles."""
    for dtype in (torch.float32, torch.bfloat16):
        case = cases.decode_case(4, 8, 2, 1, 96, 64, dtype, (96, 5, 40, 0))
        (q, kc, vc, lens), _ = case.make(DEVICE)
        with opforge.runtime.alloc.poisoned_outputs():
            out = tk.launch_decode(prepare_decode(q, kc, vc, lens, None), splits=splits)
        assert max_rel_error(out, case.oracle((q, kc, vc, lens), {})) <= TOLERANCE[dtype]


def test_decode_splits_by_length_fill_the_gpu():
    assert config.decode_splits_by_length(1, 8, 1, 4096, 132, 64) == 16      # 128 programs: 1 per SM
    assert config.decode_splits_by_length(1, 8, 1, 100, 132, 64) == 2        # at most a slice per key tile
    assert config.decode_splits_by_length(64, 8, 1, 4096, 132, 64) == 1


def test_decode_default_splits_on_a_long_cache():
    """The public path with the split heuristic giving several slices."""
    assert config.decode_splits_by_length(1, 1, 1, 100, tk.sm_count(None), 16) > 1
    case = cases.decode_case(1, 4, 1, 1, 100, 64, torch.float16, (73,))
    check_case(case, "triton")


# ---- Q, K and V through tensor descriptors (TMA, Hopper) ----------------------------------------------

# (B, Hq, Hkv, Sq, Sk, D, causal, layout): grouped heads, ragged last tiles, Sq < Sk and Sq > Sk
# (rows that see no key), transposed views
DESCRIPTOR_PREFILL = [
    (2, 4, 2, 37, 37, 64, True, "packed"),
    (1, 4, 1, 20, 45, 64, True, "bshd"),
    (1, 8, 1, 70, 33, 128, True, "packed"),
    (2, 2, 2, 33, 17, 128, False, "bshd"),
]


def _prefill_through_descriptors(shape: tuple, dtype: torch.dtype) -> tuple:
    *dims, causal, layout = shape
    args, _ = cases.prefill_case(*dims, dtype, causal, layout=layout).make(DEVICE)
    out = tk.launch_prefill(prepare_attention(*args, causal, None), tma=True)
    return out, reference.attention(*(t.double() for t in args), causal=causal)


@pytest.mark.parametrize("shape", DESCRIPTOR_PREFILL, ids=lambda s: "x".join(map(str, s)))
def test_prefill_through_descriptors_matches_float64(shape):
    # the interpreter reads descriptors too (its dots run in float32 whatever the dtype)
    for dtype in (torch.bfloat16, torch.float16) if ON_GPU else (torch.float32, torch.bfloat16):
        out, ref = _prefill_through_descriptors(shape, dtype)
        assert out.dtype == dtype and max_rel_error(out, ref) <= TOLERANCE[dtype], (shape, dtype)


def test_descriptor_strides_of_size_one_dimensions():
    """A size-1 dimension's stride never addresses anything, and may be any value (here 1 element,
    which a descriptor refuses): the packed stride replaces it."""
    dtype = torch.bfloat16 if ON_GPU else torch.float32
    base = torch.randn(40 * 64, device=DEVICE, dtype=dtype)
    q = base.as_strided((1, 1, 40, 64), (1, 1, 64, 1))
    assert tk._descriptor_strides(q) == [2560, 2560, 64, 1]
    k = torch.randn(1, 1, 40, 64, device=DEVICE, dtype=dtype)
    out = tk.launch_prefill(prepare_attention(q, k, k, True, None), tma=True)
    ref = reference.attention(q.double(), k.double(), k.double(), causal=True)
    assert max_rel_error(out, ref) <= TOLERANCE[dtype]


def test_descriptors_off_the_gpu():
    q = torch.randn(1, 2, 8, 64)
    assert tk.tma_reason(prepare_attention(q, q, q, False, None)) == "q is not on a CUDA device"


def test_tile_configs():
    assert config.prefill_config(128, 2) == (128, 128, 8, 3)
    assert config.prefill_config(128, 2, tma=True) == (128, 128, 8, 3)
    assert config.prefill_config(64, 2, tma=True) == (128, 64, 8, 3)
    assert config.prefill_config(256, 2)[0] <= 64
    assert config.head_block(80) == 128 and config.head_block(8) == 16
    assert config.decode_config(128, 2, 4 * 4)[0] == 16
    assert config.decode_config(128, 2, 8 * 16)[0] == config.MAX_ROW_BLOCK


# ---- GPU only: real sizes, CUDA graphs ----------------------------------------------------------

@gpu
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_prefill_real_sizes_gpu(d, causal):
    for dtype in (torch.bfloat16, torch.float16):
        check_case(cases.prefill_case(2, 16, 4, 1000, 1300, d, dtype, causal, layout="bshd"), "triton")


@gpu
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_prefill_both_load_paths_gpu(d, causal):
    """Pointers and descriptors at real sizes, whatever the default picks on this GPU."""
    for dtype in (torch.bfloat16, torch.float16):
        q, k, v = (cases.random_heads(2, h, s, d, dtype, "cuda", "bshd") for h, s in ((16, 1000), (4, 1300), (4, 1300)))
        call = prepare_attention(q, k, v, causal, None)
        ref = reference.attention(q.double(), k.double(), v.double(), causal=causal)
        for tma in (False, True):
            assert max_rel_error(tk.launch_prefill(call, tma=tma), ref) <= TOLERANCE[dtype], (dtype, tma)


@gpu
def test_descriptors_where_the_gpu_and_tensors_allow():
    q = torch.randn(1, 32, 2048, 128, device="cuda", dtype=torch.bfloat16)   # 6.9e10 FLOPs
    hopper = torch.cuda.get_device_capability()[0] >= 9
    assert (tk.tma_reason(prepare_attention(q, q, q, False, None)) is None) == hopper
    if not hopper:
        return
    assert "FLOPs" in tk.tma_reason(prepare_attention(q[:, :4, :64], q[:, :4, :64], q[:, :4, :64], True, None))
    assert "float32" in tk.tma_reason(prepare_attention(q.float(), q.float(), q.float(), True, None))
    q80 = torch.randn(1, 32, 2048, 80, device="cuda", dtype=torch.bfloat16)
    assert "head_dim 80" in tk.tma_reason(prepare_attention(q80, q80, q80, False, None))
    odd = torch.randn(q.numel() + 1, device="cuda", dtype=torch.bfloat16)[1:].view(q.shape)
    assert "16-byte" in tk.tma_reason(prepare_attention(odd, q, q, False, None))
    out = opforge.attention(odd, q, q, causal=False)     # pointer loads
    ref = reference.attention(odd.double(), q.double(), q.double(), causal=False)
    assert max_rel_error(out, ref) <= TOLERANCE[torch.bfloat16]


@gpu
def test_decode_real_sizes_gpu():
    for dtype in (torch.bfloat16, torch.float16):
        check_case(cases.decode_case(4, 32, 8, 1, 16384, 128, dtype, (16384, 1, 9000, 333)), "triton")
        check_case(cases.decode_case(2, 8, 1, 16, 4096, 128, dtype, (4096, 16)), "triton")


@gpu
def test_decode_cuda_graph_replays_with_new_lengths():
    torch.manual_seed(0)
    b, hq, hkv, s_max, d = 4, 16, 4, 4096, 128
    q = torch.randn(b, hq, 1, d, device="cuda", dtype=torch.bfloat16)
    kc = torch.randn(b, hkv, s_max, d, device="cuda", dtype=torch.bfloat16)
    vc = torch.randn(b, hkv, s_max, d, device="cuda", dtype=torch.bfloat16)
    lens = torch.tensor([10, 4096, 1, 2000], dtype=torch.int32, device="cuda")
    check_graph_replays(q, kc, vc, lens, lambda: opforge.decode_attention(q, kc, vc, lens))
    one = q[:1, :, :, :]
    check_graph_replays(one, kc[:1], vc[:1], lens[:1],
                        lambda: tk.launch_decode(prepare_decode(one, kc[:1], vc[:1], lens[:1], None)))


def check_graph_replays(q, kc, vc, lens, run):
    """A decode call captured once replays right with new lengths (and new queries)."""
    b = q.shape[0]
    run()  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run()
    for new in ([10, 4096, 1, 2000], [4096, 3, 777, 1], [1, 1, 1, 1]):
        lens.copy_(torch.tensor(new[:b], dtype=torch.int32))
        q.normal_()
        graph.replay()
        torch.cuda.synchronize()
        ref = reference.decode_attention(q.double(), kc.double(), vc.double(), lens)
        assert max_rel_error(out, ref) <= TOLERANCE[torch.bfloat16], new
    assert math.isfinite(out.float().sum().item())


# ---- random shapes (hypothesis) -------------------------------------------------------------------

from hypothesis import given, settings, strategies as st  # noqa: E402


@settings(max_examples=15)
@given(b=st.integers(1, 2), hkv=st.integers(1, 2), ratio=st.sampled_from([1, 2, 4]), sq=st.integers(1, 40),
       sk=st.integers(1, 40), d=st.sampled_from([16, 24, 64, 80]), causal=st.booleans(),
       layout=st.sampled_from(["packed", "bshd"]), dtype=st.sampled_from(DTYPES))
def test_prefill_random_shapes(b, hkv, ratio, sq, sk, d, causal, layout, dtype):
    check_case(cases.prefill_case(b, hkv * ratio, hkv, sq, sk, d, dtype, causal, layout=layout), "triton")


@settings(max_examples=15)
@given(data=st.data(), b=st.integers(1, 3), hkv=st.integers(1, 2), ratio=st.sampled_from([1, 4, 8]),
       sq=st.integers(1, 16), s_max=st.integers(1, 48), d=st.sampled_from([16, 64, 96]),
       dtype=st.sampled_from(DTYPES))
def test_decode_random_shapes(data, b, hkv, ratio, sq, s_max, d, dtype):
    lengths = data.draw(st.lists(st.integers(0, s_max), min_size=b, max_size=b))
    check_case(cases.decode_case(b, hkv * ratio, hkv, sq, s_max, d, dtype, lengths), "triton")


# ---- the GPU-only real-size tests' code paths at interpreter sizes ------------------------------------

@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_prefill_real_size_paths_at_small_sizes(d, causal):
    """As test_prefill_real_sizes_gpu: (B, S, H, D) views, 4 query heads per kv head, Sk > Sq with
    several key tiles and a ragged last one; fewer heads and tokens."""
    check_case(cases.prefill_case(1, 4, 1, 37, 150, d, torch.bfloat16, causal, layout="bshd"), "triton")


def test_decode_real_size_paths_at_small_sizes():
    """As test_decode_real_sizes_gpu: a cache much longer than most lengths (a full one, a single
    token, two ragged), grouped heads, one and 16 queries; a shorter cache."""
    for dtype in (torch.bfloat16, torch.float16):
        check_case(cases.decode_case(4, 8, 2, 1, 600, 128, dtype, (600, 1, 333, 37)), "triton")
        check_case(cases.decode_case(2, 8, 1, 16, 300, 128, dtype, (300, 16)), "triton")
