"""Steps with prefill at padded token and sequence counts (the form CUDA graphs replay): the same
logits for the real rows and the same cache contents as the unpadded step; padding touches only
the scratch block. Off CUDA the padded step runs eagerly, so CI checks the padding itself."""
from __future__ import annotations

import random

import pytest
import torch

from opforge.models.testing import tiny_decoder
from opforge.serve.kv_cache import SCRATCH_BLOCK
from opforge.serve.mixed_graphs import MixedGraphs, token_sizes
from opforge.testing import DEVICE


@pytest.fixture(scope="module")
def model():
    return tiny_decoder(max_seq_len=128, max_batch=1, device=DEVICE)


def test_token_sizes():
    assert token_sizes(16) == []
    assert token_sizes(32) == [32]
    assert token_sizes(100) == [32, 64, 100]


def test_size_for_keeps_a_sequence_for_the_padding(model):
    g = MixedGraphs(model, model.paged_cache(4, 4), max_num_seqs=6, max_blocks_per_seq=8, max_tokens=100)
    assert g.seq_sizes == [2, 4, 7]
    assert g.size_for(1, 20) == (2, 32)
    assert g.size_for(3, 33) == (4, 64)
    assert g.size_for(6, 100) == (7, 100)
    assert g.size_for(7, 10) is None and g.size_for(2, 101) is None
    assert not g.ready(1, 20)           # nothing captured (off CUDA nothing ever is): the engine runs eagerly


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_padded_step_equals_the_unpadded_step(model, seed):
    rng = random.Random(seed)
    bs, blocks = 4, 40
    b = rng.randint(1, 5)
    starts = [rng.randint(0, 20) for _ in range(b)]
    counts = [rng.choice([1, 1, rng.randint(2, 30)]) for _ in range(b)]
    free = list(range(1, blocks))
    rng.shuffle(free)
    tables = [[free.pop() for _ in range(-(-(s + c) // bs))] for s, c in zip(starts, counts)]
    cu = [0]
    for c in counts:
        cu.append(cu[-1] + c)
    ids = [rng.randrange(3, 64) for _ in range(cu[-1])]
    rows = [cu[i + 1] - 1 for i in range(b) if rng.random() < 0.7]
    prefix = model.paged_cache(blocks, bs)
    for k in prefix.k + prefix.v:
        k.normal_()
    eager_pages, padded_pages = [model.paged_cache(blocks, bs) for _ in range(2)]
    for dst in (eager_pages, padded_pages):
        for a, src in zip(dst.k + dst.v, prefix.k + prefix.v):
            a.copy_(src)
    width = max(len(t) for t in tables)
    i32 = dict(dtype=torch.int32, device=model.device)
    flat = torch.tensor([t + [SCRATCH_BLOCK] * (width - len(t)) for t in tables], **i32)
    want = model.paged_step(torch.tensor(ids, device=model.device), eager_pages, flat, torch.tensor(starts, **i32),
                            torch.tensor(cu, **i32), max(counts), torch.tensor(rows, dtype=torch.long,
                                                                                  device=model.device))
    graphs = MixedGraphs(model, padded_pages, max_num_seqs=8, max_blocks_per_seq=16, max_tokens=256)
    got, greedy = graphs.run(ids, tables, starts, cu, rows)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert greedy.tolist() == want.argmax(-1).tolist()
    for a, e in zip(padded_pages.k + padded_pages.v, eager_pages.k + eager_pages.v):
        # equal up to rounding: the padded step's matrix multiplies have more rows
        torch.testing.assert_close(a[SCRATCH_BLOCK + 1:], e[SCRATCH_BLOCK + 1:], atol=1e-5, rtol=1e-5)
