"""``opforge bench-serve --peer transformers``: transformers' own server on the same checkpoint, on CPU."""
import asyncio
import json
import os
import signal

import httpx
import pytest
import torch
import transformers

from opforge.cli import main
from opforge.serve.loadgen import ragged_workload, run_load, text_sender
from opforge.serve.peer_server import PeerServerError, prompt_texts, start_transformers_server, write_id_tokenizer

from tiny_tokenizer import write_tokenizer

pytestmark = pytest.mark.cpu_only     # transformers serve runs the model on the CPU here


def test_prompt_texts_have_exactly_the_prompt_token_counts(tmp_path):
    # a character tokenizer that prepends <s>: the text of n ids must hold n - 1 characters
    tokenizer = transformers.AutoTokenizer.from_pretrained(write_tokenizer(str(tmp_path)))
    prompts = [r.prompt for r in ragged_workload(20, (2, 12), (1, 1), 64, seed=5)]
    texts = prompt_texts(tokenizer, prompts)
    assert [len(tokenizer(t)["input_ids"]) for t in texts] == [len(p) for p in prompts]
    os.makedirs(tmp_path / "ids")
    ids = transformers.AutoTokenizer.from_pretrained(write_id_tokenizer(str(tmp_path / "ids"), 64))
    assert [ids(t)["input_ids"] for t in prompt_texts(ids, prompts)] == prompts      # the id tokenizer: the same ids


def test_a_checkpoint_without_a_tokenizer_is_refused(tmp_path):
    with pytest.raises(PeerServerError, match="no tokenizer"):
        start_transformers_server(str(tmp_path), "cpu")
    with pytest.raises(PeerServerError, match="vocab_size"):
        write_id_tokenizer(str(tmp_path), 0)


def test_bench_serve_with_the_transformers_peer_on_cpu(tmp_path, capsys):
    out = tmp_path / "peer.json"
    status = main(["bench-serve", "--random", "tiny", "--device", "cpu", "--num-requests", "4", "--warmup", "1",
                   "--prompt-len", "4:8", "--output-len", "2:4", "--concurrency", "2", "--peer", "transformers",
                   "--json", str(out)])
    assert status == 0
    report = json.loads(out.read_text())
    assert "peer_error" not in report
    rows = report["rows"]
    assert [(r["mode"], r["concurrency"]) for r in rows] == [("online", 2), ("transformers-serve", 2)]
    work = ragged_workload(4, (4, 8), (2, 4), 64, 0)
    online, peer = rows
    for r in rows:      # every request finished with exactly its prompt and its forced output length
        assert r["requests"] == 4 and r["failed"] == 0 and r["errors"] == []
        assert r["prompt_tokens"] == sum(len(w.prompt) for w in work)
        assert r["output_tokens"] == sum(w.max_tokens for w in work)
        assert r["ttft_ms"]["p50"] > 0 and r["e2e_ms"]["p99"] >= r["e2e_ms"]["p50"]
    assert peer["peer"]["endpoint"] == "/v1/completions" and peer["peer"]["output_tokens_from"] == "usage"
    assert peer["peer"]["warmup_failed"] == 0 and peer["peer"]["load_seconds"] > 0
    assert peer["peer"]["requested_output_tokens"] == peer["output_tokens"]
    assert peer["opforge_online_over_peer_output_tokens_per_s"] == \
        online["output_tokens_per_s"] / peer["output_tokens_per_s"]
    printed = capsys.readouterr().out
    assert "transformers-serve rate=inf concurrency=2" in printed and "opforge/transformers-serve" in printed


def test_the_chat_endpoint_counts_the_same_tokens(tmp_path):
    # the endpoint used where the installed transformers serve has no /v1/completions
    from opforge.models.testing import TINY_LLAMA, write_random_checkpoint
    model_dir = write_id_tokenizer(write_random_checkpoint(TINY_LLAMA, str(tmp_path), dtype=torch.float32), 64)
    work = ragged_workload(3, (3, 6), (2, 5), 64, seed=2)
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    texts = dict(zip([tuple(r.prompt) for r in work], prompt_texts(tokenizer, [r.prompt for r in work])))
    peer = start_transformers_server(model_dir, "cpu", "float32", timeout_s=300)
    try:
        async def run():
            async with httpx.AsyncClient(timeout=300) as client:
                send = text_sender(client, peer.url, "/v1/chat/completions", peer.model, texts,
                                   {"generation_config": json.dumps({"eos_token_id": -1, "do_sample": False})})
                return await run_load(work, send, concurrency=2)
        records, _ = asyncio.run(run())
    finally:
        assert peer.stop() in (0, -signal.SIGTERM)       # uvicorn exits 0, or the signal ends it
    assert [(r.error, r.prompt_tokens, r.output_tokens, r.counted_from_chunks) for r in records] == \
        [(None, len(w.prompt), w.max_tokens, False) for w in work]


def test_a_peer_that_fails_to_start_keeps_opforge_rows(tmp_path, capsys):
    out = tmp_path / "peer.json"
    status = main(["bench-serve", "--random", "tiny", "--device", "cpu", "--num-requests", "2", "--warmup", "1",
                   "--prompt-len", "4:4", "--output-len", "2:2", "--peer", "transformers",
                   "--peer-args=--no-such-option", "--json", str(out)])
    assert status == 1
    report = json.loads(out.read_text())
    assert [r["mode"] for r in report["rows"]] == ["online"] and report["rows"][0]["failed"] == 0
    assert "transformers serve exited" in report["peer_error"] and "no-such-option" in report["peer_error"]
    assert "transformers serve: no rows" in capsys.readouterr().err


def test_the_peer_needs_a_model():
    with pytest.raises(SystemExit) as e:
        main(["bench-serve", "--url", "http://127.0.0.1:9", "--peer", "transformers"])
    assert e.value.code == 2
