"""The Triton paged kernels' own paths: every split count of the decode kernel, the merge of empty
slices, and unchecked bad indices (as inside a CUDA graph, where no host check runs): nothing
outside the pools is read or written."""
import pytest
import torch

from opforge.ops.paged import cases, config, reference, triton_kernels as tk
from opforge.ops.paged.problem import prepare_append, prepare_attention
from opforge.testing import DEVICE, TOLERANCE, max_rel_error

I32 = torch.int32


def _attention_args(lengths, new, hq, hkv, d, bs, dtype=torch.float32):
    layout = cases.make_layout(lengths, new, bs)
    kp, vp = cases.make_pools(layout, lengths, hkv, d, dtype, DEVICE)
    q = torch.randn(layout.tokens, hq, d, dtype=dtype, device=DEVICE)
    return (q, kp, vp, layout.block_tables.to(DEVICE), torch.tensor(lengths, dtype=I32, device=DEVICE),
            layout.cu_seqlens.to(DEVICE))


def _oracle(args, scale):
    q, kp, vp, tables, lens, cu = args
    return reference.paged_attention(q.double(), kp.double(), vp.double(), tables, lens, cu, scale)


@pytest.mark.parametrize("splits", [1, 2, 3, 7, 20])
def test_decode_every_split_count(splits):
    """Slices of the length (some empty for the short sequences) merge to the oracle; above 16
    slices the merge reads its partials in several chunks."""
    args = _attention_args([70, 5, 33] if splits < 16 else [400, 5, 33], [1, 3, 2], 4, 2, 32, 16)
    call = prepare_attention(*args, 3, None)
    out = tk.launch_decode(call, splits=splits)
    assert max_rel_error(out, _oracle(args, 32 ** -0.5)) <= TOLERANCE[torch.float32]


@pytest.mark.parametrize("splits", [1, 2])
def test_decode_wide_key_tiles(monkeypatch, splits):
    """The 128-key tile (``WIDE_KEYS_TILE``) over 16-position blocks, with lengths that end inside
    a tile, a block and a slice, equals the oracle (the interpreter runs it when forced)."""
    def wide(d, itemsize, rows, batch, kv_heads, capacity, sms, interpreted=False):
        return (16, *config.WIDE_KEYS_TILE, splits)
    monkeypatch.setattr(config, "decode_tiles", wide)
    args = _attention_args([300, 129, 1, 128], [1, 1, 1, 1], 8, 2, 32, 16)
    out = tk.launch_decode(prepare_attention(*args, 1, None))
    assert max_rel_error(out, _oracle(args, 32 ** -0.5)) <= TOLERANCE[torch.float32]


def test_decode_tiles_rule():
    """16-bit caches, D <= 128, one 16-row query block: slices for two programs per SM, and
    128-key tiles (slices for one program per SM) where those are at most two. The rest keeps the
    contiguous kernel's tiles and split rule."""
    def tiles(d=64, itemsize=2, rows=4, batch=32, kv_heads=8, capacity=4096, interpreted=False):
        return config.decode_tiles(d, itemsize, rows, batch, kv_heads, capacity, 132, interpreted)
    assert tiles()[1:] == (*config.WIDE_KEYS_TILE, 1)
    assert tiles(d=128, batch=16)[1:] == (*config.WIDE_KEYS_TILE, 1)   # 2 slices at 2 per SM
    assert tiles(batch=8)[1:] == (64, 4, 3, 4)                     # 264 // 64 programs
    assert tiles(batch=1)[1:] == (64, 4, 3, 33)
    assert tiles(batch=1, capacity=1024)[-1] == 16                 # one slice per 64 positions at most
    assert tiles(d=256)[1:] == (32, 4, 2, 1) and tiles(itemsize=4)[1:] == (32, 8, 2, 1)   # their own tiles, 1 per SM
    assert tiles(d=256, batch=1)[-1] == 16 and tiles(itemsize=4, batch=1)[-1] == 16
    assert tiles(rows=64)[:2] == (64, 64)                          # 16 new tokens of a group of 4
    assert tiles(interpreted=True)[1] == 16


def test_decode_tiles_equal_at_a_cuda_graphs_padded_batch():
    """A decode step padded to its CUDA graph's batch size (``serve.graphs.padded_sizes``) runs the
    slices and tiles of the unpadded step: both give the same bits."""
    from opforge.serve.graphs import padded_sizes
    for max_num_seqs in (48, 64, 100, 256):
        sizes = padded_sizes(max_num_seqs)
        for batch in range(1, max_num_seqs + 1):
            padded = next(s for s in sizes if s >= batch)
            for d, itemsize, kv_heads in ((64, 2, 2), (128, 2, 8), (64, 4, 8), (256, 2, 8)):
                def tiles(b):
                    return config.decode_tiles(d, itemsize, 4, b, kv_heads, 4096, 132)
                assert tiles(batch) == tiles(padded), (max_num_seqs, batch, d, itemsize, kv_heads)


@pytest.mark.parametrize("splits", [1, 3])
def test_mixed_step_runs_each_sequence_once(splits):
    """Decode tokens, a 16-token draft and prefill chunks in one step: the split kernel takes the
    sequences with at most 16 new tokens, the prefill kernel the others, no row written twice or
    left out (outputs start as NaN)."""
    args = _attention_args([70, 40, 5, 33, 16], [1, 30, 3, 16, 17], 4, 2, 32, 16)
    out = tk.launch_mixed(prepare_attention(*args, 30, None), splits=splits)
    assert max_rel_error(out, _oracle(args, 32 ** -0.5)) <= TOLERANCE[torch.float32]


def test_prefill_kernel_takes_every_sequence():
    """The prefill kernel alone serves short sequences too (tests and tuning call it so)."""
    args = _attention_args([40, 7, 16], [1, 4, 1], 4, 2, 32, 16)
    out = tk.launch_prefill(prepare_attention(*args, 20, None))
    assert max_rel_error(out, _oracle(args, 32 ** -0.5)) <= TOLERANCE[torch.float32]


def test_decode_rows_past_max_query_len_tile():
    """Packed rows group x max_query_len = 40 span several 16-row blocks (float32 caps them at 16)."""
    args = _attention_args([50, 12], [5, 4], 8, 1, 16, 8)
    call = prepare_attention(*args, 5, None)
    out = tk.launch_decode(call, splits=2)
    assert max_rel_error(out, _oracle(args, 0.25)) <= TOLERANCE[torch.float32]


@pytest.mark.parametrize("kernel", ["decode", "prefill"])
def test_out_of_pool_block_ids_read_as_zeros(kernel):
    """Unchecked, a table entry outside the pool is never dereferenced: its keys and values read as
    zeros, which the oracle reproduces with a block of zeros in its place."""
    q, kp, vp, tables, lens, cu = _attention_args([40, 20], [1, 2], 2, 1, 16, 8)
    tables = tables.clone()
    tables[0, 1] = 10 ** 6
    tables[1, 0] = -5
    call = prepare_attention(q, kp, vp, tables, lens, cu, 2 if kernel == "decode" else 20, None)
    out = tk.launch_decode(call) if kernel == "decode" else tk.launch_prefill(call)
    zero = torch.zeros((1,) + kp.shape[1:], dtype=kp.dtype, device=DEVICE)
    kz, vz = torch.cat([kp, zero]), torch.cat([vp, zero])
    tz = tables.clone()
    tz[0, 1] = tz[1, 0] = kp.shape[0]
    ref = reference.paged_attention(q.double(), kz.double(), vz.double(), tz, lens, cu, 0.25)
    assert max_rel_error(out, ref) <= TOLERANCE[torch.float32]


def test_lengths_beyond_capacity_are_clamped():
    q, kp, vp, tables, lens, cu = _attention_args([16, 9], [1, 1], 2, 2, 16, 8)
    call = prepare_attention(q, kp, vp, tables[:, :2], torch.tensor([10 ** 5, 9], dtype=I32, device=DEVICE), cu,
                             1, None)
    out = tk.launch_decode(call)
    ref = reference.paged_attention(q.double(), kp.double(), vp.double(), tables[:, :2],
                                    torch.tensor([16, 9], dtype=I32), cu, 0.25)
    assert max_rel_error(out, ref) <= TOLERANCE[torch.float32]


def test_append_skips_unwritable_tokens():
    """Unchecked, tokens whose slot is outside the table row or the pool are dropped; the others land."""
    layout = cases.make_layout([6, 5, 4], [2, 2, 2], 4, share=False)
    shape = (layout.num_blocks, 4, 2, 8)
    kp, vp = torch.randn(shape, device=DEVICE), torch.randn(shape, device=DEVICE)
    k, v = torch.randn(6, 2, 8, device=DEVICE), torch.randn(6, 2, 8, device=DEVICE)
    tables = layout.block_tables.to(DEVICE).clone()
    cols = tables.shape[1]
    tables[1, 0] = layout.num_blocks + 3                       # sequence 1 writes positions 3, 4: block 0 bad
    lens = torch.tensor([4, 3, cols * 4 - 1], dtype=I32, device=DEVICE)   # sequence 2's second token: past the row
    cu = layout.cu_seqlens.to(DEVICE)
    k0, v0 = kp.clone(), vp.clone()
    tk.launch_append(prepare_append(kp, vp, k, v, tables, lens, cu))
    ek, ev = k0.clone(), v0.clone()
    reference.paged_kv_cache_append(ek, ev, k, v, tables, lens, cu)
    assert torch.equal(kp, ek) and torch.equal(vp, ev)
    changed = (kp != k0).any(-1).any(-1).sum().item()
    assert changed == 4                                        # tokens 0, 1, 4 of seq 0, 1 (pos 4), 2 (first)


def test_token_search_with_empty_sequences():
    """Sequences with no new token between others: the binary search must still find each owner."""
    layout = cases.make_layout([3, 8, 2, 8, 5], [0, 3, 0, 0, 5], 4, share=False)
    shape = (layout.num_blocks, 4, 1, 16)
    kp, vp = torch.zeros(shape, device=DEVICE), torch.zeros(shape, device=DEVICE)
    k = torch.randn(8, 1, 16, device=DEVICE)
    before = torch.tensor([3, 5, 2, 8, 0], dtype=I32, device=DEVICE)
    tables, cu = layout.block_tables.to(DEVICE), layout.cu_seqlens.to(DEVICE)
    tk.launch_append(prepare_append(kp, vp, k, k, tables, before, cu))
    ek = torch.zeros_like(kp)
    reference.paged_kv_cache_append(ek, ek.clone(), k, k, tables, before, cu)
    assert torch.equal(kp, ek) and kp.abs().sum() > 0
