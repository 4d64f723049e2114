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
