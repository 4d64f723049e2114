"""Text: incremental detokenization across multi-byte characters, stop strings, string prompts."""
from __future__ import annotations

import os
import random

import pytest
import torch

from opforge.models.testing import TINY_LLAMA, tiny_decoder, write_tiny_checkpoint
from opforge.serve import LLM, Engine, SamplingParams
from opforge.serve.sampling import sample_rows
from opforge.serve.tokenizer import Detokenizer, byte_tokenizer
from opforge.testing import DEVICE

BYTE_LLAMA = dict(TINY_LLAMA, vocab_size=258, bos_token_id=256, eos_token_id=257)


@pytest.fixture(scope="module")
def tok():
    return byte_tokenizer()


@pytest.fixture(scope="module")
def model():
    """Greedy output of printable ASCII only: the head's rows of other bytes are zero, so their
    logits (0) lose to the largest of 95 random ones."""
    m = tiny_decoder(BYTE_LLAMA, max_seq_len=128, max_batch=1, device=DEVICE)
    with torch.no_grad():
        m.lm_head[:32] = 0
        m.lm_head[127:] = 0
    return m


@pytest.mark.parametrize("text", ["plain ascii", "héllo wörld", "日本語のテキスト", "emoji 🙂🚀 end", "mixé 日 🙂"])
def test_incremental_text_equals_the_whole_decode_and_never_splits_a_character(tok, text):
    ids = tok.encode(text, add_special_tokens=False).ids
    d = Detokenizer(tok, tok.encode("prompt: ", add_special_tokens=False).ids)
    pieces = [d.add(i) for i in ids] + [d.flush()]
    assert "".join(pieces) == text
    assert not any("\ufffd" in p for p in pieces)
    if len(text.encode()) > len(text):           # a multi-byte character: some tokens released nothing
        assert "" in pieces[:-1]


def _run(engine: Engine, rid: str, prompt, params: SamplingParams):
    stream = engine.add_request(rid, prompt, params)
    while engine.has_unfinished():
        engine.step()
    outs = list(stream)
    return [t for o in outs for t in o.new_token_ids], "".join(o.new_text for o in outs), outs[-1]


def _printable_run(model, tok, seed: int):
    """A prompt (some multi-byte characters in it) and its greedy continuation of 40 tokens."""
    rng = random.Random(seed)
    engine = Engine(model, tokenizer=tok, kv_blocks=64, block_size=4)
    prompt = tok.encode("".join(rng.choice("abcdé 日🙂") for _ in range(8)), add_special_tokens=False).ids
    ids, text, last = _run(engine, "first", prompt, SamplingParams(max_tokens=40, ignore_eos=True))
    assert len(text) == 40 and text.isprintable()
    return engine, prompt, ids, text


def test_streamed_text_equals_decoding_the_tokens(model, tok):
    engine, prompt, ids, text = _printable_run(model, tok, 0)
    assert text == tok.decode(ids, skip_special_tokens=True)


@pytest.mark.parametrize("start, length", [(3, 1), (5, 3), (0, 2)])
def test_a_stop_string_ends_the_request_and_is_not_returned(model, tok, start, length):
    engine, prompt, ids, text = _printable_run(model, tok, 1)
    stop = text[start:start + length]
    cut = text.find(stop)
    got_ids, got_text, last = _run(engine, "s", prompt, SamplingParams(max_tokens=40, stop=[stop, "\x00never"],
                                                                         ignore_eos=True))
    assert last.finish_reason == "stop" and got_text == text[:cut]
    assert got_ids == ids[:len(got_ids)] and len(got_ids) < len(ids)
    assert stop in tok.decode(got_ids)            # the request stopped at the token completing the stop


def test_stop_token_ids_end_the_request_with_the_token_returned(model, tok):
    engine, prompt, ids, _ = _printable_run(model, tok, 2)
    got_ids, _, last = _run(engine, "s", prompt, SamplingParams(max_tokens=40, stop_token_ids=[ids[4]],
                                                                ignore_eos=True))
    assert last.finish_reason == "stop" and got_ids == ids[:ids.index(ids[4]) + 1]


def test_min_tokens_bans_the_stop_tokens_until_reached():
    logits = torch.tensor([[5.0, 1.0, 0.0], [5.0, 1.0, 0.0]])
    greedy = SamplingParams()
    assert sample_rows(logits, [greedy, greedy], [None, None], [(0,), ()]) == [1, 0]


def test_string_prompts_use_the_tokenizer(model, tok):
    engine = Engine(model, tokenizer=tok, kv_blocks=32, block_size=4)
    _, _, last = _run(engine, "a", "héllo", SamplingParams(max_tokens=2))
    assert last.prompt_tokens == len(tok.encode("héllo").ids)


def test_llm_from_a_checkpoint_directory_with_a_tokenizer(tok):
    path = write_tiny_checkpoint(BYTE_LLAMA)
    tok.save(os.path.join(path, "tokenizer.json"))
    llm = LLM(path, device="cpu", dtype=torch.float32, max_num_seqs=4, block_size=8)
    assert llm.engine.max_model_len == 256           # the checkpoint's max_position_embeddings
    outs = llm.generate(["héllo", "wörld 🙂"], SamplingParams(max_tokens=6, ignore_eos=True), progress=False)
    assert [len(o.token_ids) for o in outs] == [6, 6]
    assert all(o.text == tok.decode(o.token_ids) or "\ufffd" in tok.decode(o.token_ids) for o in outs)


def _frequencies(params: SamplingParams, logits: torch.Tensor, n: int = 4000) -> torch.Tensor:
    from opforge.serve.sampling import make_generator
    rows = logits.expand(n, -1)
    gens = [make_generator(SamplingParams(**{**params.__dict__, "seed": i})) for i in range(n)]
    got = sample_rows(rows, [params] * n, gens)
    return torch.bincount(torch.tensor(got), minlength=logits.shape[-1]).double() / n


def test_sampling_follows_the_filtered_distribution():
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0, -3.0]])
    p = torch.softmax(logits[0].double() / 0.7, -1)
    freq = _frequencies(SamplingParams(temperature=0.7), logits)
    assert (freq - p).abs().max() < 0.03
    top2 = _frequencies(SamplingParams(temperature=0.7, top_k=2), logits)
    assert top2[2:].sum() == 0 and (top2[:2] - p[:2] / p[:2].sum()).abs().max() < 0.03
    # top_p 0.8: the smallest prefix of the sorted tokens whose mass reaches 0.8
    keep = int((p.cumsum(0) - p < 0.8).sum())
    nucleus = _frequencies(SamplingParams(temperature=0.7, top_p=0.8), logits)
    assert nucleus[keep:].sum() == 0 and (nucleus[:keep] - p[:keep] / p[:keep].sum()).abs().max() < 0.03
    tiny = _frequencies(SamplingParams(temperature=0.7, top_p=1e-6), logits, 200)
    assert tiny[0] == 1.0                                     # the most likely token always survives top-p


def test_banned_tokens_are_never_sampled():
    from opforge.serve.sampling import make_generator
    params = SamplingParams(temperature=5.0, seed=3)
    logits = torch.zeros(300, 4)
    got = sample_rows(logits, [params] * 300, [make_generator(params)] * 300, [(1, 2)] * 300)
    assert set(got) == {0, 3}
