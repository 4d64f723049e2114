"""``opforge.generate``, the engine's thin client: its inputs, errors and timings (its tokens are
checked against the full forward and transformers in tests/models/)."""
import pytest
import torch

import opforge
from opforge.models.testing import tiny_decoder
from opforge.serve import GenerationStats, generate, last_stats


@pytest.fixture(scope="module")
def model():
    return tiny_decoder(max_seq_len=40)


def test_the_top_level_name_is_the_engine_client():
    assert opforge.generate is generate


def test_stats_of_the_last_call(model):
    out = generate(model, [[1, 2, 3], [4, 5, 6, 7, 8]], 6, stop_ids=[])
    s = last_stats(model)
    assert isinstance(s, GenerationStats)
    assert (s.prompt_tokens, s.new_tokens) == (8, sum(len(o) for o in out) - 2) == (8, 10)
    assert s.prefill_s > 0 and s.decode_s > 0 and not s.graphs and s.capture_s == 0.0
    assert s.decode_tokens_per_s == pytest.approx(10 / s.decode_s)
    generate(model, [1, 2], 1)                          # one token: the prefill's, no decode step
    s = last_stats(model)
    assert (s.prompt_tokens, s.new_tokens, s.decode_tokens_per_s) == (2, 0, 0.0) and s.decode_s < s.prefill_s


def test_tensor_and_list_inputs_agree(model):
    ids = torch.tensor([[3, 4, 5], [6, 7, 8]])
    assert generate(model, ids, 5) == generate(model, ids.tolist(), 5)
    assert generate(model, ids[0], 5) == generate(model, [3, 4, 5], 5) == generate(model, ids, 5)[:1]


@pytest.mark.parametrize("args, kwargs, message", [
    (([], 4), {}, "input_ids: every prompt needs at least one token"),
    (([[1, 2], []], 4), {}, "input_ids: every prompt needs at least one token"),
    (([1] * 30, 11), {}, r"prompt \(30\) \+ max_new_tokens \(11\) exceeds max_seq_len \(40\)"),
    (([1, 2], 3), {"readback": 0}, "readback must be an int >= 1"),
])
def test_bad_input_raises_naming_the_argument(model, args, kwargs, message):
    with pytest.raises(ValueError, match=message):
        generate(model, *args, **kwargs)
    assert len(generate(model, [1] * 30, 10)[0]) == 10         # the longest request that fits


def test_a_call_that_fits_runs_on_the_held_engine_with_the_same_tokens():
    model, fresh = tiny_decoder(max_seq_len=40), tiny_decoder(max_seq_len=40)
    assert torch.equal(model.embed, fresh.embed)
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8], [9]]
    first = generate(model, prompts, 8)
    assert not last_stats(model).reused
    # a stop token ends a sequence early: a decode step launched ahead may be left in flight
    stop = first[1][2]
    stopped = generate(model, prompts[1:2], 8, stop_ids=[stop])
    assert last_stats(model).reused and stopped == [first[1][:first[1].index(stop) + 1]]
    again = generate(model, prompts[::-1], 8)
    assert last_stats(model).reused and again == first[::-1]
    sampled = generate(model, prompts, 6, temperature=0.8, generator=torch.Generator().manual_seed(3))
    assert last_stats(model).reused
    assert sampled == generate(fresh, prompts, 6, temperature=0.8, generator=torch.Generator().manual_seed(3))
    assert not last_stats(fresh).reused
    # more prompts (or longer ones) than the held engine was sized for: a new engine
    generate(model, prompts + [[2, 2]], 4)
    assert not last_stats(model).reused
    generate(model, [[5] * 20, [6] * 20, [7], [8]], 16)
    assert not last_stats(model).reused
    assert generate(model, prompts, 8) == first and last_stats(model).reused
