"""The engine against solo ``generate``: every request's greedy tokens equal its own run, whatever
the batch does around it (chunked prefill, prefix hits, preemption, aborts), float32."""
from __future__ import annotations

import asyncio
import os
import random
import threading

import pytest
import torch

import opforge
from opforge.models.testing import tiny_decoder
from opforge.serve import LLM, Engine, EngineStoppedError, RequestOutput, SamplingParams, generate
from opforge.testing import DEVICE

EOS = 2


@pytest.fixture(scope="module")
def model():
    return tiny_decoder(max_seq_len=128, max_batch=1, device=DEVICE)


@pytest.fixture(scope="module")
def solo(model):
    """Greedy tokens of one prompt run alone through ``generate`` (memoized)."""
    memo: dict = {}

    def run(prompt: list[int], max_tokens: int, stop_at_eos: bool = False) -> list[int]:
        key = (tuple(prompt), max_tokens, stop_at_eos)
        if key not in memo:
            memo[key] = generate(model, [prompt], max_tokens, stop_ids=(EOS,) if stop_at_eos else ())[0]
        return memo[key]
    return run


@pytest.fixture(params=[False, True], ids=["serial", "overlap"])
def overlap(request):
    """Steps one after the other, or a decode step's successor launched before its tokens are read."""
    return request.param


def _prompts(seed: int, n: int, shared: list[int] = ()) -> list[list[int]]:
    rng = random.Random(seed)
    return [list(shared) + [rng.randrange(3, 64) for _ in range(rng.randint(1, 40))] for _ in range(n)]


def _drain(engine: Engine, streams: dict) -> dict[str, list[RequestOutput]]:
    while engine.has_unfinished():
        engine.step()
        engine.cache.check()
    return {rid: list(s) for rid, s in streams.items()}


def _tokens(outputs: list[RequestOutput]) -> list[int]:
    return [t for o in outputs for t in o.new_token_ids]


def test_mixed_lengths_and_limits_equal_solo_generate(model, solo, overlap):
    engine = Engine(model, overlap=overlap, max_num_seqs=5, block_size=4, kv_blocks=200, max_num_batched_tokens=16)
    prompts = _prompts(0, 12)
    limits = [random.Random(i).randint(1, 30) for i in range(12)]
    streams = {f"r{i}": engine.add_request(f"r{i}", p, SamplingParams(max_tokens=m, ignore_eos=True))
               for i, (p, m) in enumerate(zip(prompts, limits))}
    outs = _drain(engine, streams)
    for i, (p, m) in enumerate(zip(prompts, limits)):
        got = outs[f"r{i}"]
        assert _tokens(got) == solo(p, m), f"request {i}"
        assert got[-1].finished and got[-1].finish_reason == "length"
        assert [o.completion_tokens for o in got] == list(range(1, m + 1))
        assert got[-1].prompt_tokens == len(p) and got[-1].time_to_first_token > 0
    assert engine.stats().steps > 12 and engine.stats().blocks_used == 0
    assert (engine.overlapped_steps > 10) == overlap
    assert len({tuple(_tokens(o)) for o in outs.values()}) > 6           # real, different outputs


def test_end_of_sequence_stops_a_request_like_generate_with_stop_ids(model, solo, overlap):
    engine = Engine(model, overlap=overlap, max_num_seqs=8, block_size=4, kv_blocks=200)
    prompts = _prompts(1, 24)
    streams = {f"r{i}": engine.add_request(f"r{i}", p, SamplingParams(max_tokens=40)) for i, p in enumerate(prompts)}
    outs = _drain(engine, streams)
    stopped = 0
    for i, p in enumerate(prompts):
        want = solo(p, 40, stop_at_eos=True)
        assert _tokens(outs[f"r{i}"]) == want
        stopped += want[-1] == EOS
        assert outs[f"r{i}"][-1].finish_reason == ("stop" if want[-1] == EOS else "length")
    assert stopped > 0, "no request reached the end-of-sequence token: the test proves nothing"
    assert (engine.overlapped_steps > 10) == overlap


def test_prefix_hits_skip_prefill_and_change_no_token(model, solo, overlap):
    shared = [random.Random(5).randrange(3, 64) for _ in range(21)]
    prompts = _prompts(2, 8, shared)
    engine = Engine(model, overlap=overlap, max_num_seqs=4, block_size=4, kv_blocks=100)
    streams = {}
    for i, p in enumerate(prompts):
        streams[f"r{i}"] = engine.add_request(f"r{i}", p, SamplingParams(max_tokens=10, ignore_eos=True))
        if i == 0:
            engine.step()                 # the first one's prompt is in the cache before the rest arrive
    outs = _drain(engine, streams)
    for i, p in enumerate(prompts):
        assert _tokens(outs[f"r{i}"]) == solo(p, 10)
    stats = engine.stats()
    assert stats.prefix_cache_hits >= 7 * 20 and stats.blocks_cached > 0
    # again, all at once: the whole shared prefix now comes from the cache
    again = {f"s{i}": engine.add_request(f"s{i}", p, SamplingParams(max_tokens=10, ignore_eos=True))
             for i, p in enumerate(prompts)}
    outs = _drain(engine, again)
    assert all(_tokens(outs[f"s{i}"]) == solo(p, 10) for i, p in enumerate(prompts))
    assert engine.stats().prefix_cache_hits - stats.prefix_cache_hits >= 8 * 20


def test_preemption_by_a_tiny_pool_changes_no_token(model, solo, overlap):
    prompts = _prompts(3, 10)
    engine = Engine(model, overlap=overlap, max_num_seqs=8, block_size=4, kv_blocks=24, max_num_batched_tokens=32)
    streams = {f"r{i}": engine.add_request(f"r{i}", p, SamplingParams(max_tokens=30, ignore_eos=True))
               for i, p in enumerate(prompts)}
    outs = _drain(engine, streams)
    assert engine.scheduler.preemptions > 3 and (engine.overlapped_steps > 0) == overlap
    for i, p in enumerate(prompts):
        assert _tokens(outs[f"r{i}"]) == solo(p, 30), f"request {i}"
    engine.cache.check(idle=True)


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_aborts_midway_free_blocks_at_once_and_leave_the_others_exact(model, solo, prefix_caching, overlap):
    prompts = _prompts(4, 8)
    engine = Engine(model, overlap=overlap, max_num_seqs=8, block_size=4, kv_blocks=60, enable_prefix_caching=prefix_caching)
    streams = {f"r{i}": engine.add_request(f"r{i}", p, SamplingParams(max_tokens=25, ignore_eos=True))
               for i, p in enumerate(prompts)}
    for _ in range(6):
        engine.step()
    used = engine.stats().blocks_used
    engine.abort("r1")
    engine.abort("r6")
    assert engine.stats().blocks_used < used
    engine.cache.check()
    with pytest.raises(KeyError, match="r1"):
        engine.abort("r1")
    outs = _drain(engine, streams)
    for i, p in enumerate(prompts):
        got = _tokens(outs[f"r{i}"])
        if i in (1, 6):
            assert outs[f"r{i}"][-1].finish_reason == "abort" and got == solo(p, 25)[:len(got)] and len(got) < 25
        else:
            assert got == solo(p, 25)
    engine.cache.check(idle=True)


def test_random_adds_aborts_and_steps_keep_the_cache_consistent_and_tokens_exact(model, solo, overlap):
    rng = random.Random(7)
    engine = Engine(model, overlap=overlap, max_num_seqs=6, block_size=4, kv_blocks=30, max_num_batched_tokens=20)
    shared = [rng.randrange(3, 64) for _ in range(12)]
    streams, aborted, n = {}, set(), 0
    for _ in range(150):
        op = rng.choices(["add", "abort", "step"], weights=[2, 1, 6])[0]
        if op == "add":
            p = (shared if rng.random() < 0.5 else []) + [rng.randrange(3, 64) for _ in range(rng.randint(1, 20))]
            rid = f"r{n}"
            n += 1
            streams[rid] = (p, rng.randint(1, 12), None)
            streams[rid] = (p, streams[rid][1],
                            engine.add_request(rid, p, SamplingParams(max_tokens=streams[rid][1], ignore_eos=True)))
        elif op == "abort":
            live = sorted(r for r in streams if r not in aborted and engine.is_unfinished(r))
            if live:
                rid = rng.choice(live)
                engine.abort(rid)
                aborted.add(rid)
        else:
            engine.step()
        engine.cache.check()
    while engine.has_unfinished():
        engine.step()
    engine.cache.check(idle=True)
    finished = 0
    for rid, (p, m, stream) in streams.items():
        outs = list(stream)
        got, want = _tokens(outs), solo(p, m)
        assert got == want[:len(got)]
        if rid not in aborted:
            assert got == want
            finished += 1
    assert finished > 10 and aborted


def test_bad_input_raises_naming_the_field_and_changes_nothing(model):
    engine = Engine(model, max_num_seqs=4, block_size=4, kv_blocks=12, max_model_len=64)
    engine.add_request("ok", [5, 6, 7], SamplingParams(max_tokens=3))
    engine.step()
    before = (engine.stats(), list(engine._requests), [s.computed for s in engine.scheduler.running])
    cases = [
        ("prompt", lambda: engine.add_request("a", [], SamplingParams())),
        ("prompt", lambda: engine.add_request("a", [1] * 64, SamplingParams())),
        ("prompt", lambda: engine.add_request("a", [1, 64], SamplingParams())),
        ("prompt", lambda: engine.add_request("a", [1, -1], SamplingParams())),
        ("prompt", lambda: engine.add_request("a", "text", SamplingParams())),        # no tokenizer
        ("prompt", lambda: engine.add_request("a", [1.5], SamplingParams())),
        ("request_id", lambda: engine.add_request("ok", [1], SamplingParams())),
        ("request_id", lambda: engine.add_request("", [1], SamplingParams())),
        ("params", lambda: engine.add_request("a", [1], {"max_tokens": 3})),
        ("params.stop", lambda: engine.add_request("a", [1], SamplingParams(stop=["x"]))),
        ("kv_blocks", lambda: engine.add_request("a", [1] * 60, SamplingParams(max_tokens=30))),
    ]
    for field, call in cases:
        with pytest.raises(ValueError, match=field):
            call()
    with pytest.raises(KeyError, match="nope"):
        engine.abort("nope")
    after = (engine.stats(), list(engine._requests), [s.computed for s in engine.scheduler.running])
    assert after == before


@pytest.mark.parametrize("field, value", [("max_tokens", 0), ("max_tokens", 1.0), ("temperature", -0.1),
                                          ("temperature", float("nan")), ("top_k", 0), ("top_p", 0.0),
                                          ("top_p", 1.5), ("min_tokens", -1), ("seed", "x"), ("stop", [""]),
                                          ("stop_token_ids", [-3]), ("ignore_eos", 1)])
def test_invalid_sampling_values_name_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})


def test_engine_arguments_are_checked(model):
    for kwargs, field in (({"max_num_seqs": 0}, "max_num_seqs"), ({"block_size": 0}, "block_size"),
                          ({"max_model_len": 1000}, "max_model_len"), ({"kv_blocks": 0}, "kv_blocks"),
                          ({"kv_memory_fraction": 0.0}, "kv_memory_fraction"),
                          ({"max_num_batched_tokens": 0}, "max_num_batched_tokens")):
        with pytest.raises(ValueError, match=field):
            Engine(model, **kwargs)


def test_a_seed_makes_sampling_reproducible_whatever_the_batch(model):
    params = SamplingParams(max_tokens=12, temperature=0.9, top_p=0.95, seed=1234, ignore_eos=True)

    def run(others: int) -> list[int]:
        engine = Engine(model, max_num_seqs=8, block_size=4, kv_blocks=100)
        mine = engine.add_request("mine", [7, 8, 9], params)
        for i in range(others):
            engine.add_request(f"o{i}", [10 + i] * (i + 1), SamplingParams(max_tokens=20, temperature=1.0))
        while engine.has_unfinished():
            engine.step()
        return _tokens(list(mine))
    alone, crowded = run(0), run(5)
    assert alone == crowded
    other_seed = Engine(model, kv_blocks=20)
    s = other_seed.add_request("x", [7, 8, 9], SamplingParams(max_tokens=12, temperature=0.9, top_p=0.95, seed=99,
                                                                ignore_eos=True))
    while other_seed.has_unfinished():
        other_seed.step()
    assert _tokens(list(s)) != alone


def test_the_step_loop_thread_serves_concurrent_sync_and_async_consumers(model, solo, overlap):
    engine = Engine(model, overlap=overlap, max_num_seqs=4, block_size=4, kv_blocks=80)
    engine.start()
    prompts = _prompts(8, 6)
    results: dict = {}

    def client(i: int) -> None:
        stream = engine.add_request(f"t{i}", prompts[i], SamplingParams(max_tokens=8, ignore_eos=True))
        results[i] = _tokens(list(stream))
    threads = [threading.Thread(target=client, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()

    async def consume(i: int) -> list[int]:
        stream = engine.add_request(f"t{i}", prompts[i], SamplingParams(max_tokens=8, ignore_eos=True))
        return [t async for o in stream for t in o.new_token_ids]

    async def main() -> list:
        return await asyncio.gather(*(consume(i) for i in range(3, 6)))
    for i, toks in zip(range(3, 6), asyncio.run(main())):
        results[i] = toks
    for t in threads:
        t.join(60)
    assert all(results[i] == solo(prompts[i], 8) for i in range(6))
    waiting = engine.add_request("late", [3] * 5, SamplingParams(max_tokens=100, ignore_eos=True))
    engine.shutdown(timeout=30)
    outs = list(waiting)
    assert outs[-1].finished and outs[-1].finish_reason in ("abort", "length")
    assert engine.stats().blocks_used == 0


def test_llm_generate_keeps_the_order_and_accepts_one_params_per_prompt(model, solo):
    llm = LLM(model, kv_blocks=100, block_size=4, max_num_seqs=3)
    prompts = _prompts(9, 5)
    params = [SamplingParams(max_tokens=m, ignore_eos=True) for m in (3, 9, 1, 6, 4)]
    outs = llm.generate(prompts, params, progress=False)
    assert [o.token_ids for o in outs] == [solo(p, q.max_tokens) for p, q in zip(prompts, params)]
    assert all(o.finish_reason == "length" and o.time_to_first_token > 0 for o in outs)
    assert outs[1].decode_tokens_per_s > 0 and outs[0].prompt_token_ids == prompts[0]
    with pytest.raises(ValueError, match="params"):
        llm.generate(prompts, params[:2])
    assert not llm.engine.has_unfinished()


@pytest.mark.skipif(not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1",
                    reason="needs a GPU or Triton's interpreter")
def test_the_triton_paged_kernels_serve_the_same_tokens(model, solo):
    """The engine's step on the Triton kernels (the interpreter on a CPU): strided q/k/v views of
    the fused projection; packed decode tokens and prompts, short (split-KV kernel) and long (tiled)."""
    shared = [9, 8, 7, 6, 5]
    prompts = [shared + [3, 4], shared + [11, 12, 13], [20], [i % 60 + 3 for i in range(40)]]
    engine = Engine(model, max_num_seqs=4, block_size=4, kv_blocks=30, max_num_batched_tokens=64)
    with opforge.backend("triton"), opforge.trace() as t:
        streams = [engine.add_request(f"r{i}", p, SamplingParams(max_tokens=3, ignore_eos=True))
                   for i, p in enumerate(prompts)]
        outs = _drain(engine, dict(enumerate(streams)))
    assert [_tokens(outs[i]) for i in range(4)] == [solo(p, 3) for p in prompts]
    ran = {(e.op, e.backend, e.variant) for e in t if e.op.startswith("paged")}
    assert {e[1] for e in ran} == {"triton"} and len({e[2] for e in ran if e[0] == "paged_attention"}) == 2, ran


def test_a_failing_step_ends_every_stream_and_stops_the_engine(monkeypatch):
    model = tiny_decoder(max_seq_len=64, device=DEVICE)
    engine = Engine(model, kv_blocks=20, block_size=4)
    engine.start()
    with pytest.raises(RuntimeError, match="own thread"):
        engine.step()

    def broken(*args, **kwargs):
        raise MemoryError("no memory for the step")
    monkeypatch.setattr(model, "paged_step", broken)
    stream = engine.add_request("a", [1, 2, 3], SamplingParams(max_tokens=4))
    outs = list(stream)
    assert outs[-1].finished and outs[-1].finish_reason == "abort" and outs[-1].new_token_ids == []
    assert isinstance(engine.error, MemoryError)
    with pytest.raises(EngineStoppedError):
        engine.add_request("b", [1], SamplingParams())
    engine.shutdown(timeout=10)
    assert engine.stats().blocks_used == 0


def test_aborts_from_another_thread_while_the_loop_runs(model, solo, overlap):
    engine = Engine(model, overlap=overlap, max_num_seqs=8, block_size=4, kv_blocks=120)
    engine.start()
    prompts = _prompts(11, 6)
    streams = [engine.add_request(f"a{i}", p, SamplingParams(max_tokens=60, ignore_eos=True))
               for i, p in enumerate(prompts)]
    first = [next(iter(s)) for s in streams[:3]]          # the loop is producing tokens
    for i in range(3):
        engine.abort(f"a{i}")
    outs = [list(s) for s in streams]
    engine.shutdown(timeout=30)
    for i, (p, out) in enumerate(zip(prompts, outs)):
        got = ([first[i]] if i < 3 else []) + out
        tokens = _tokens(got)
        assert tokens == solo(p, 60)[:len(tokens)]
        assert got[-1].finish_reason == ("abort" if i < 3 else "length")
    assert engine.stats().blocks_used == 0
    engine.cache.check(idle=True)


def test_max_model_len_ends_a_request_with_length(model, solo, overlap):
    engine = Engine(model, overlap=overlap, max_model_len=20, block_size=4, kv_blocks=20)
    prompt = list(range(3, 18))                            # 15 tokens: room for 5 new ones
    stream = engine.add_request("r", prompt, SamplingParams(max_tokens=100, ignore_eos=True))
    while engine.has_unfinished():
        engine.step()
    outs = list(stream)
    assert _tokens(outs) == solo(prompt, 5) and outs[-1].finish_reason == "length"
    assert engine.stats().blocks_used == 0
