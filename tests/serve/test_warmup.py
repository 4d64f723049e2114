"""The engine's warm-up: it touches only the scratch block, leaves the engine's state as it was,
changes no token, and on CUDA captures every decode graph size before the first request."""
from __future__ import annotations

import random

import pytest
import torch

from opforge.models.testing import tiny_decoder
from opforge.serve import Engine, SamplingParams
from opforge.serve.kv_cache import SCRATCH_BLOCK
from opforge.serve.warmup import token_ladder, warm_up_steps
from opforge.testing import DEVICE


@pytest.fixture(scope="module")
def model():
    return tiny_decoder(max_seq_len=64, max_batch=1, device=DEVICE)


def _serve(engine: Engine, prompts: list[list[int]]) -> list[list[int]]:
    streams = [engine.add_request(f"r{i}", p, SamplingParams(max_tokens=6, ignore_eos=True))
               for i, p in enumerate(prompts)]
    while engine.has_unfinished():
        engine.step()
    return [[t for o in s for t in o.new_token_ids] for s in streams]


def test_token_ladder_ends_at_the_budget():
    assert token_ladder(1) == [1]
    assert token_ladder(8) == [1, 2, 4, 8]
    assert token_ladder(100) == [1, 2, 4, 8, 16, 32, 64, 100]


def test_warm_up_writes_only_the_scratch_block(model):
    pages = model.paged_cache(num_blocks=6, block_size=4)
    for k in pages.k + pages.v:
        k.normal_()
    before = [t.clone() for t in pages.k + pages.v]
    done = warm_up_steps(model, pages, block_size=4, max_model_len=20, max_tokens=48)
    assert done == [1, 2, 4, 8, 16, 32, 48, "mixed"]
    for old, new in zip(before, pages.k + pages.v):
        others = [b for b in range(old.shape[0]) if b != SCRATCH_BLOCK]
        assert torch.equal(old[others], new[others])
        assert not torch.equal(old[SCRATCH_BLOCK], new[SCRATCH_BLOCK])


def test_a_warmed_up_engine_serves_the_same_tokens_and_state(model):
    rng = random.Random(7)
    prompts = [[rng.randrange(3, 64) for _ in range(rng.randint(1, 30))] for _ in range(5)]
    cold = Engine(model, max_num_seqs=4, kv_blocks=24)
    warm = Engine(model, max_num_seqs=4, kv_blocks=24)
    done = warm.warm_up()
    assert done[:len(token_ladder(16 if DEVICE == "cpu" else 8192))] == token_ladder(16 if DEVICE == "cpu" else 8192)
    if torch.device(DEVICE).type == "cuda":
        graphs = done[done.index("mixed") + 1:]
        assert graphs[:3] == ["graph 1", "graph 2", "graph 4"]
        assert graphs[3:] == [f"graph {n}x{t}" for n in (2, 4, 5) for t in (32, 64, 128, 256, 512, 1024, 2048)]
        assert warm.warm_up()[-1] == "mixed"            # the graphs are captured once
    assert warm.stats() == cold.stats()
    assert _serve(warm, prompts) == _serve(cold, prompts)
    assert warm.stats().blocks_used == 0


def test_warm_up_refuses_a_started_engine(model):
    engine = Engine(model, max_num_seqs=2, kv_blocks=8)
    engine.start()
    try:
        with pytest.raises(RuntimeError, match="before start"):
            engine.warm_up()
    finally:
        engine.shutdown()
