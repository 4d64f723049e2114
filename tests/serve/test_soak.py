"""Soak: many requests, 10% of clients disconnecting mid-stream, 5% malformed requests.

The server (an ``opforge serve`` process) stays up, every well-formed request that was not
disconnected gets its full answer, the KV blocks return to idle, and the server's memory (host
RSS, and GPU allocated on CUDA, both read from its /metrics) grows by at most 1% between the end
of the warm-up and the end of the run. (The clients run in the test's process, whose own memory
is not the server's.)

Size: ``OPFORGE_SOAK_REQUESTS`` (default 200 for CI; the full soak is 2000:
``OPFORGE_SOAK_REQUESTS=2000 pytest tests/serve/test_soak.py``), on ``OPFORGE_SOAK_DEVICE``
(default: cuda where there is a GPU, else cpu).
"""
import asyncio
import json
import os
import random

import httpx
import torch

from serving import MODEL, metric, model_dir, start_process, wait_idle

REQUESTS = int(os.environ.get("OPFORGE_SOAK_REQUESTS", "200"))
DEVICE = os.environ.get("OPFORGE_SOAK_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu")
CONCURRENCY = 16

MALFORMED = [b"{oops", b'{"model": "tiny", "prompt": 7}', b'{"model": "nope", "prompt": "x"}',
             b'{"model": "tiny", "prompt": "x", "n": 3}', b'{"model": "tiny", "prompt": "x", "max_tokens": -1}',
             json.dumps({"model": MODEL, "prompt": "a" * 200}).encode(), b'{"model": "tiny", "messages": []}']


def _memory(url: str) -> tuple[float, float]:
    """The server's resident memory and (CUDA) GPU memory allocated, from its /metrics."""
    rss = metric(url, "process_resident_memory_bytes")
    gpu = metric(url, "opforge_device_memory_allocated_bytes") if DEVICE.startswith("cuda") else 0.0
    return rss, gpu


async def _one(http: httpx.AsyncClient, url: str, i: int, rng: random.Random) -> str:
    """Send request ``i``; returns its kind after checking its answer."""
    roll = rng.random()
    chat = rng.random() < 0.5
    path = "/v1/chat/completions" if chat else "/v1/completions"
    if roll < 0.05:
        body = rng.choice(MALFORMED)
        r = await http.post(f"{url}{'/v1/chat/completions' if b'messages' in body else '/v1/completions'}",
                            content=body, headers={"content-type": "application/json"})
        assert 400 <= r.status_code < 500 and set(r.json()["error"]) == {"message", "type", "param", "code"}
        return "malformed"
    max_tokens = rng.randint(1, 8)
    body = {"model": MODEL, "max_tokens": max_tokens, "temperature": rng.choice([0.0, 0.8]), "ignore_eos": True,
            "seed": i}
    if chat:
        body["messages"] = [{"role": "user", "content": f"request {i} " * rng.randint(1, 2)}]
    else:
        body["prompt"] = f"prompt {i} " * rng.randint(1, 4)
    if roll < 0.15:                     # a client that goes away after the first chunk, long before the end
        if chat:
            body["messages"] = [{"role": "user", "content": f"d{i}"}]
        else:
            body["prompt"] = f"d{i}"
        body.update(max_tokens=48, stream=True)      # the longest the context allows a chat prompt here
        async with http.stream("POST", f"{url}{path}", json=body) as r:
            assert r.status_code == 200, (await r.aread()).decode()
            async for line in r.aiter_lines():
                if line.startswith("data: "):
                    break
        return "disconnected"
    if rng.random() < 0.5:
        body.update(stream=True, stream_options={"include_usage": True})
        async with http.stream("POST", f"{url}{path}", json=body) as r:
            assert r.status_code == 200, (await r.aread()).decode()
            events = [line[6:] async for line in r.aiter_lines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        usage = json.loads(events[-2])["usage"]
        reasons = [c["choices"][0]["finish_reason"] for c in map(json.loads, events[:-2])]
        assert [x for x in reasons if x] == ["length"]
    else:
        r = await http.post(f"{url}{path}", json=body)
        assert r.status_code == 200, r.text
        usage = r.json()["usage"]
        assert r.json()["choices"][0]["finish_reason"] == "length"
    assert usage["completion_tokens"] == max_tokens
    return "answered"


async def _run(url: str, indices: range, rng: random.Random) -> list[str]:
    gate = asyncio.Semaphore(CONCURRENCY)
    async with httpx.AsyncClient(timeout=300) as http:
        async def guarded(i: int) -> str:
            async with gate:
                return await _one(http, url, i, rng)
        return await asyncio.gather(*(guarded(i) for i in indices))


def test_soak_disconnects_and_malformed_requests():
    rng = random.Random(1234)
    warmup = max(50, REQUESTS // 10)
    proc, url, _ = start_process(model_dir(), "--max-num-seqs", str(CONCURRENCY), device=DEVICE)
    try:
        kinds = asyncio.run(_run(url, range(warmup), rng))
        wait_idle(url)
        rss0, gpu0 = _memory(url)
        kinds += asyncio.run(_run(url, range(warmup, REQUESTS + warmup), rng))
        wait_idle(url)
        rss1, gpu1 = _memory(url)
        assert metric(url, "opforge_kv_blocks_used") == 0
        assert metric(url, "opforge_kv_blocks_free") == metric(url, "opforge_kv_blocks_total") == 64
        counts = {k: kinds.count(k) for k in ("answered", "disconnected", "malformed")}
        assert sum(counts.values()) == REQUESTS + warmup
        assert counts["disconnected"] > 0.05 * len(kinds) and counts["malformed"] > 0.02 * len(kinds)

        def total(outcome: str) -> float:
            return sum(metric(url, f'opforge_requests_total{{endpoint="{e}",outcome="{outcome}"}}')
                       for e in ("completion", "chat"))
        # a client that went away aborted its request, unless the request had already run to its
        # end (a fast device can finish its 48 tokens before the server reads the disconnect): every
        # request is counted once, and the answered ones all ran to their length
        aborted = total("abort")
        assert 0 < aborted <= counts["disconnected"]
        assert total("length") == counts["answered"] + counts["disconnected"] - aborted
        print(f"soak: {len(kinds)} requests {counts}; server RSS {rss0 / 2**20:.1f} -> {rss1 / 2**20:.1f} MiB, "
              f"GPU allocated {gpu0:.0f} -> {gpu1:.0f} bytes")
        assert rss1 <= rss0 * 1.01, f"server RSS grew {rss1 / rss0 - 1:.2%} ({rss0 / 2**20:.1f} -> {rss1 / 2**20:.1f} MiB)"
        assert gpu1 <= gpu0 * 1.01, f"server GPU allocated grew {gpu0:.0f} -> {gpu1:.0f} bytes"
        r = httpx.post(f"{url}/v1/completions", json={"model": MODEL, "prompt": "still up", "max_tokens": 3})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1
        assert proc.poll() is None
    finally:
        proc.terminate()
        proc.wait(60)
