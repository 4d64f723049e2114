"""The scheduler's bound on prompt tokens in steps that also decode (max_prefill_tokens_while_decoding):
the exact chunks it plans, the invariant under random load with preemption, and unchanged tokens."""
import random

import pytest

from opforge.models.testing import tiny_decoder
from opforge.serve import Engine, SamplingParams
from opforge.serve.kv_cache import BlockManager
from opforge.serve.scheduler import Scheduler, Sequence
from scheduling import complete
from opforge.testing import DEVICE


def _plan(sched: Scheduler) -> list[tuple[str, int, int]]:
    return [(c.seq.request_id, c.start, c.count) for c in sched.schedule()]


def _run(sched: Scheduler, plan_chunks, token: int = 9) -> None:
    """Record a planned step as computed; each chunk that ends its sequence gets ``token``."""
    for c in plan_chunks:
        sched.computed(c)
        if c.samples:
            c.seq.tokens.append(token)


def _decoding_scheduler(bound):
    sched = Scheduler(BlockManager(64, 4), max_num_seqs=8, max_num_batched_tokens=32,
                      max_prefill_tokens_while_decoding=bound)
    a = Sequence("a", [1, 2], SamplingParams())
    sched.add(a)
    _run(sched, sched.schedule())                 # a's prompt: now a decodes
    sched.add(Sequence("b", list(range(3, 23)), SamplingParams()))    # 20 tokens
    sched.add(Sequence("c", list(range(30, 35)), SamplingParams()))   # 5 tokens
    return sched, a


def test_a_step_with_decode_rows_carries_at_most_the_bound_of_prompt_tokens():
    sched, a = _decoding_scheduler(6)
    chunks = sched.schedule()
    assert [(c.seq.request_id, c.start, c.count) for c in chunks] == [("a", 2, 1), ("b", 0, 6)]
    assert [s.request_id for s in sched.waiting] == ["c"]           # the bound is spent: c waits
    _run(sched, chunks)
    chunks = sched.schedule()                     # b's prompt goes on 6 tokens a step
    assert [(c.seq.request_id, c.start, c.count) for c in chunks] == [("a", 3, 1), ("b", 6, 6)]
    _run(sched, chunks)
    _run(sched, chunks := sched.schedule())
    assert [(c.seq.request_id, c.start, c.count) for c in chunks] == [("a", 4, 1), ("b", 12, 6)]
    # b has 2 prompt tokens left: the running chunk and an admission share the bound
    chunks = sched.schedule()
    assert [(c.seq.request_id, c.start, c.count) for c in chunks] == [("a", 5, 1), ("b", 18, 2), ("c", 0, 4)]
    assert sum(c.count for c in chunks if c.seq is not a) == 6


def test_a_step_without_decode_rows_keeps_the_whole_budget():
    sched, a = _decoding_scheduler(6)
    sched.remove(a)                               # nothing decodes now
    assert _plan(sched) == [("b", 0, 20), ("c", 0, 5)]


def test_without_the_bound_a_decode_step_takes_the_whole_budget():
    sched, _ = _decoding_scheduler(None)
    assert _plan(sched) == [("a", 2, 1), ("b", 0, 20), ("c", 0, 5)]


def test_a_bound_above_the_budget_changes_nothing():
    sched, _ = _decoding_scheduler(1000)
    assert _plan(sched) == [("a", 2, 1), ("b", 0, 20), ("c", 0, 5)]


@pytest.mark.parametrize("bound", [1, 3, 7])
def test_random_load_with_preemption_keeps_the_bound(bound):
    rng = random.Random(bound)
    cache = BlockManager(num_blocks=10, block_size=4)
    budget = 12
    sched = Scheduler(cache, max_num_seqs=5, max_num_batched_tokens=budget, max_prefill_tokens_while_decoding=bound)
    live, mixed, full, finished = [], 0, 0, 0
    for i in range(3000):
        if rng.random() < 0.3:
            seq = Sequence(f"r{i}", [rng.randrange(50) for _ in range(rng.randint(1, 20))],
                           SamplingParams(max_tokens=rng.randint(1, 16)))
            sched.add(seq)
            live.append(seq)
            continue
        decoding = {id(s) for s in sched.running if s.pending == 1}
        chunks = sched.schedule()
        decodes = [c for c in chunks if id(c.seq) in decoding]
        prompt = sum(c.count for c in chunks if id(c.seq) not in decoding)
        assert all(c.count == 1 for c in decodes) and len(decodes) + prompt <= budget
        if decodes:
            assert prompt <= bound
            mixed += prompt > 0
        else:
            full += prompt > bound
        for c in chunks:
            finished += complete(sched, c, rng, live)
        cache.check()
    # the run exercised what it claims: steps that mix in prompt tokens, steps past the bound
    # with nothing decoding, preemption, and requests finishing
    assert mixed > 50 and full > 20 and sched.preemptions > 5 and finished > 300


@pytest.fixture(scope="module")
def model():
    return tiny_decoder(max_seq_len=128, max_batch=1, device=DEVICE)


@pytest.mark.parametrize("overlap", [False, True], ids=["serial", "overlap"])
def test_the_bound_changes_steps_but_no_token(model, overlap):
    rng = random.Random(5)
    prompts = [[rng.randrange(3, 64) for _ in range(rng.randint(1, 40))] for _ in range(10)]
    lengths = [rng.randint(1, 12) for _ in prompts]

    def run(bound):
        engine = Engine(model, max_num_seqs=4, block_size=4, kv_blocks=80, overlap=overlap,
                        max_prefill_tokens_while_decoding=bound)
        streams = [engine.add_request(f"r{i}", p, SamplingParams(max_tokens=n, ignore_eos=True))
                   for i, (p, n) in enumerate(zip(prompts, lengths))]
        while engine.has_unfinished():
            engine.step()
        return [[t for o in s for t in o.new_token_ids] for s in streams], engine.stats().steps

    (free, free_steps), (bounded, bounded_steps) = run(None), run(3)
    assert bounded == free and [len(t) for t in free] == lengths
    assert bounded_steps > free_steps


def test_the_engine_checks_the_bound(model):
    for value in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="max_prefill_tokens_while_decoding"):
            Engine(model, kv_blocks=8, max_prefill_tokens_while_decoding=value)
