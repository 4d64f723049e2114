"""The block pool and the scheduler on their own: allocation, sharing, prefix caching, preemption."""
import random

import pytest

from opforge.serve.kv_cache import SCRATCH_BLOCK, BlockManager
from opforge.serve.sampling import SamplingParams
from opforge.serve.scheduler import FINISHED, Chunk, Scheduler, Sequence
from scheduling import complete


def test_blocks_are_handed_out_without_the_scratch_block_and_come_back():
    cache = BlockManager(5, 2)
    cache.allocate("a", [1, 2, 3])
    assert cache.grow("a", 7) and cache.table("a") == [1, 2, 3, 4]
    assert cache.num_free == 0 and not cache.can_grow("a", 9) and not cache.grow("a", 9)
    assert cache.table("a") == [1, 2, 3, 4]            # a failed grow takes nothing
    cache.check()
    cache.free("a")
    cache.check(idle=True)
    assert cache.num_free == 4 and SCRATCH_BLOCK not in cache._free


def test_a_shared_prefix_is_computed_once_and_reference_counted():
    cache = BlockManager(16, 4)
    prompt = list(range(100, 110))
    assert cache.allocate("a", prompt) == 0
    cache.grow("a", 10)
    cache.commit("a", prompt, 10)
    # the same 8-token prefix, another tail: the two full blocks are shared
    assert cache.allocate("b", prompt[:8] + [7, 7, 7]) == 8
    assert cache.table("b") == cache.table("a")[:2]
    assert [cache.refs[b] for b in cache.table("a")] == [2, 2, 1]
    # a prompt equal to a cached prefix still leaves its last token to compute
    assert cache.allocate("c", prompt[:8]) == 4
    # a different first block: nothing shared, even with an equal second block
    assert cache.allocate("d", [0] * 4 + prompt[4:8] + [1]) == 0
    cache.check()
    assert cache.queries == 8 + 8 + 4 + 8 and cache.hits == 8 + 4      # full blocks of a, b, c, d


def test_freed_named_blocks_stay_cached_until_needed_least_recent_first():
    cache = BlockManager(5, 2)
    for name, prompt in (("a", [1, 2, 3]), ("b", [4, 5, 6])):
        cache.allocate(name, prompt)
        cache.grow(name, 3)
        cache.commit(name, prompt, 3)
    a_first, b_first = cache.table("a")[0], cache.table("b")[0]
    cache.free("a")
    cache.free("b")
    assert cache.num_cached == 2 and cache.num_free == 4
    cache.allocate("c", [9, 9, 9, 9, 9, 9, 9])
    assert cache.grow("c", 5)                         # 2 free blocks, then the oldest cached: a's
    assert a_first in cache.table("c") and b_first not in cache.table("c")
    assert cache.allocate("d", [4, 5, 6]) == 2        # b's prefix survived
    assert cache.allocate("e", [1, 2, 3]) == 0        # a's was evicted
    cache.check()


def test_without_prefix_caching_nothing_is_shared():
    cache = BlockManager(8, 2, enable_prefix_caching=False)
    cache.allocate("a", [1, 2, 3])
    cache.grow("a", 3)
    cache.commit("a", [1, 2, 3], 3)
    cache.free("a")
    assert cache.allocate("b", [1, 2, 3]) == 0 and cache.num_cached == 0


def _drive(seed: int, operations: int) -> dict:
    """Random adds, aborts and steps on a tiny pool; the invariants hold after each operation."""
    rng = random.Random(seed)
    cache = BlockManager(num_blocks=12, block_size=4)
    sched = Scheduler(cache, max_num_seqs=5, max_num_batched_tokens=9)
    live: list[Sequence] = []
    counts = {"add": 0, "abort": 0, "step": 0, "finished": 0}
    prefixes = [[rng.randrange(50) for _ in range(8)] for _ in range(3)]
    for i in range(operations):
        op = rng.choices(["add", "abort", "step"], weights=[3, 1, 6])[0]
        if op == "add":
            prompt = (rng.choice(prefixes) if rng.random() < 0.5 else []) + \
                [rng.randrange(50) for _ in range(rng.randint(1, 12))]
            seq = Sequence(f"r{i}", prompt, SamplingParams(max_tokens=rng.randint(1, 10)))
            sched.add(seq)
            live.append(seq)
        elif op == "abort" and live:
            sched.remove(live.pop(rng.randrange(len(live))))
        elif op == "step":
            for chunk in sched.schedule():
                assert len(cache.table(chunk.seq.request_id)) * 4 >= chunk.start + chunk.count
                counts["finished"] += complete(sched, chunk, rng, live)
        counts[op] += 1
        cache.check()
        assert len(sched.running) <= 5
        assert all(s.status != FINISHED for s in live)
        assert sum(1 for s in live if s.request_id in cache) == len(sched.running)
    while live:
        sched.remove(live.pop())
    cache.check(idle=True)
    counts["preemptions"] = sched.preemptions
    counts["hits"] = cache.hits
    return counts


def test_ten_thousand_random_operations_keep_the_allocator_invariants():
    counts = _drive(seed=0, operations=10_000)
    # the run exercised what it claims to: finishing, preemption, prefix hits, aborts
    assert counts["finished"] > 500 and counts["preemptions"] > 20 and counts["hits"] > 0 and counts["abort"] > 500


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_operations_other_seeds(seed):
    _drive(seed, 2_000)


def test_the_step_budget_mixes_decode_tokens_with_a_prefill_chunk():
    cache = BlockManager(64, 4)
    sched = Scheduler(cache, max_num_seqs=8, max_num_batched_tokens=8)
    short = Sequence("short", [1, 2], SamplingParams())
    sched.add(short)
    [first] = sched.schedule()
    sched.computed(first)
    short.tokens.append(3)                               # now decoding
    long = Sequence("long", list(range(20)), SamplingParams())
    sched.add(long)
    plan = sched.schedule()
    assert [(c.seq.request_id, c.count) for c in plan] == [("short", 1), ("long", 7)]
    for c in plan:
        sched.computed(c)
    short.tokens.append(4)
    plan = sched.schedule()                              # the prompt goes on in chunks; the decode never waits
    assert [(c.seq.request_id, c.start, c.count, c.samples) for c in plan] == \
        [("short", 3, 1, True), ("long", 7, 7, False)]


def test_the_most_recently_admitted_is_preempted_and_recomputed_with_its_tokens():
    cache = BlockManager(5, 2)                           # 4 usable blocks
    sched = Scheduler(cache, max_num_seqs=4, max_num_batched_tokens=16)
    a, b = Sequence("a", [1, 2, 3], SamplingParams()), Sequence("b", [4, 5, 6], SamplingParams())
    sched.add(a)
    sched.add(b)
    for _ in range(2):                                   # the prompts, then one decode each: 2 blocks each
        for c in sched.schedule():
            sched.computed(c)
            c.seq.tokens.append(9)
    assert cache.num_free == 0 and a.computed == b.computed == 4
    plan = sched.schedule()                              # a's next token needs a third block: b goes
    assert [(c.seq.request_id, c.start, c.count) for c in plan] == [("a", 4, 1)]
    assert b.status == "waiting" and b.computed == 0 and list(sched.waiting) == [b]
    assert b.tokens == [4, 5, 6, 9, 9] and sched.preemptions == 1
    cache.check()
    sched.remove(a)                                      # room again: b is recomputed, prompt and tokens
    [chunk] = sched.schedule()
    assert (chunk.seq, chunk.start, chunk.count, chunk.samples) == (b, 2, 3, True)   # its first block was cached


def test_prompts_sharing_an_uncomputed_prefix_wait_for_it_then_hit_the_cache():
    cache = BlockManager(32, 4)
    s = Scheduler(cache, max_num_seqs=8, max_num_batched_tokens=100)
    prefix = list(range(1, 13))                                     # three full blocks
    seqs = [Sequence(f"r{i}", prefix + [20 + i, 30 + i], SamplingParams()) for i in range(3)]
    other = Sequence("other", [7, 7, 7, 7, 7, 7], SamplingParams())
    for seq in seqs + [other]:
        s.add(seq)
    # the first step computes the prefix once: r1 waits for it (and "other" behind r1, in order)
    assert [(c.seq.request_id, c.start, c.count) for c in s.schedule()] == [("r0", 0, 14)]
    # before r0's blocks are named, the next plan still holds r1 back
    assert [c.seq.request_id for c in s.schedule()] == ["r0"]
    s.computed(Chunk(seqs[0], 0, 14))
    seqs[0].tokens.append(99)
    plan = [(c.seq.request_id, c.start, c.count) for c in s.schedule()]
    assert plan == [("r0", 14, 1), ("r1", 12, 2), ("r2", 12, 2), ("other", 0, 6)]
    assert cache.table("r1")[:3] == cache.table("r0")[:3] == cache.table("r2")[:3]


def test_without_prefix_caching_shared_prompts_are_admitted_together():
    s = Scheduler(BlockManager(32, 4, enable_prefix_caching=False), max_num_seqs=8, max_num_batched_tokens=100)
    for i in range(2):
        s.add(Sequence(f"r{i}", list(range(1, 13)) + [20 + i], SamplingParams()))
    assert [(c.seq.request_id, c.start, c.count) for c in s.schedule()] == [("r0", 0, 13), ("r1", 0, 13)]
