"""A bounded load generator for serving: workloads, arrival processes, and latency statistics.

A workload is a list of ``LoadRequest`` (prompt token ids, output length), drawn with a fixed
seed. ``run_load`` sends it through a ``send`` coroutine (over HTTP to an OpenAI-compatible
server, or straight into an in-process ``Engine``) with Poisson arrivals at ``rate`` requests/s
(``inf``: all at once) and at most ``concurrency`` requests in flight, and ``summarize`` turns
the per-request records into the serving benchmarks' numbers: request and token throughput,
time to first token (TTFT), time per output token (TPOT), inter-token latency (ITL) and
end-to-end latency, each as mean, p50, p90 and p99.
"""
from __future__ import annotations

import asyncio
import json
import math
import random
import socket
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Awaitable, Callable, Optional

import httpx


@dataclass
class LoadRequest:
    prompt: list[int]
    max_tokens: int


@dataclass
class Record:
    """What one request measured (seconds, from its send)."""

    prompt_tokens: int
    output_tokens: int = 0
    ttft: Optional[float] = None
    itl: list[float] = field(default_factory=list)
    e2e: float = 0.0
    error: Optional[str] = None
    counted_from_chunks: bool = False       # the server gave no usage: output_tokens counts text chunks


def ragged_workload(n: int, prompt_len: tuple[int, int], output_len: tuple[int, int], vocab_size: int,
                    seed: int = 0) -> list[LoadRequest]:
    """``n`` requests, prompt and output lengths uniform in the given inclusive ranges, random
    token ids from the upper half of the vocabulary (clear of special tokens).

    Example:
        >>> w = ragged_workload(3, (4, 8), (2, 5), vocab_size=64, seed=1)
        >>> [4 <= len(r.prompt) <= 8 and 2 <= r.max_tokens <= 5 for r in w]
        [True, True, True]
        >>> w == ragged_workload(3, (4, 8), (2, 5), vocab_size=64, seed=1)
        True
    """
    rng = random.Random(seed)
    low = min(100, vocab_size // 2)
    return [LoadRequest([rng.randrange(low, vocab_size) for _ in range(rng.randint(*prompt_len))],
                        rng.randint(*output_len)) for _ in range(n)]


async def run_load(requests: list[LoadRequest], send: Callable[[LoadRequest], Awaitable[Record]],
                   rate: float = math.inf, concurrency: Optional[int] = None, seed: int = 0) -> tuple[list[Record], float]:
    """Send every request (Poisson arrivals at ``rate``/s, at most ``concurrency`` in flight);
    returns the records in request order and the wall time from the first send to the last answer.

    Example:
        >>> async def send(r):
        ...     await asyncio.sleep(0.001)
        ...     return Record(len(r.prompt), r.max_tokens, 0.001, [], 0.001)
        >>> records, seconds = asyncio.run(run_load(ragged_workload(4, (1, 2), (3, 3), 64), send, concurrency=2))
        >>> [r.output_tokens for r in records]
        [3, 3, 3, 3]
    """
    rng = random.Random(seed)
    gate = asyncio.Semaphore(concurrency) if concurrency else None

    async def one(r: LoadRequest) -> Record:
        if gate is None:
            return await send(r)
        async with gate:
            return await send(r)

    start = time.perf_counter()
    tasks = []
    for r in requests:
        tasks.append(asyncio.create_task(one(r)))
        if math.isfinite(rate):
            await asyncio.sleep(rng.expovariate(rate))
    records = await asyncio.gather(*tasks)
    return list(records), time.perf_counter() - start


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now, for a server under load (the bench's or a peer's).

    Example:
        >>> 0 < free_port() < 65536
        True
    """
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _stream(client: httpx.AsyncClient, url: str, body: dict[str, Any], headers: Optional[dict[str, str]],
                  rec: Record, token_event: Callable[[bytes], bool]) -> None:
    """POST ``body`` to ``url`` and read its server-sent events into ``rec``: each event for which
    ``token_event(event)`` is true is timed, as it is read from the socket, as a token's arrival
    (TTFT, then ITL). A status other than 200 or an HTTP error goes to ``rec.error``."""
    t0 = last = time.perf_counter()
    buffer = b""
    try:
        async with client.stream("POST", url, json=body, headers=headers) as resp:
            if resp.status_code != 200:
                rec.error = f"HTTP {resp.status_code}: {(await resp.aread())[:200]!r}"
                return
            async for data in resp.aiter_raw():
                now = time.perf_counter()
                buffer += data
                *events, buffer = buffer.split(b"\n\n")
                for event in events:
                    if event == b"data: [DONE]" or not token_event(event):
                        continue
                    if rec.ttft is None:
                        rec.ttft = now - t0
                    else:
                        rec.itl.append(now - last)
                    last = now
    except httpx.HTTPError as e:
        rec.error = f"{type(e).__name__}: {e}"
    rec.e2e = time.perf_counter() - t0


def http_sender(client: httpx.AsyncClient, url: str, model: str,
                headers: Optional[dict[str, str]] = None) -> Callable[[LoadRequest], Awaitable[Record]]:
    """A ``send`` that streams one completion from an OpenAI-compatible server (greedy, ``ignore_eos``).

    Events are timed as they are read from the socket; only the closing usage chunk is parsed,
    so the client's own cost per token stays small.
    """
    async def send(r: LoadRequest) -> Record:
        body = {"model": model, "prompt": r.prompt, "max_tokens": r.max_tokens, "temperature": 0.0,
                "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
        rec = Record(len(r.prompt))

        def token_event(event: bytes) -> bool:
            if b'"choices":[]' in event:            # the usage chunk
                rec.output_tokens = json.loads(event[len(b"data: "):])["usage"]["completion_tokens"]
                return False
            return True

        await _stream(client, f"{url}/v1/completions", body, headers, rec, token_event)
        return rec

    return send


def text_sender(client: httpx.AsyncClient, url: str, endpoint: str, model: str, texts: dict[tuple[int, ...], str],
                extra_body: Optional[dict[str, Any]] = None) -> Callable[[LoadRequest], Awaitable[Record]]:
    """A ``send`` for a server that takes text prompts only: streams one greedy answer to the text
    of each prompt (``texts[tuple(prompt)]``) from ``endpoint`` (``/v1/completions``, or
    ``/v1/chat/completions`` with the text as one user message), with ``extra_body`` merged in.

    Prompt and output token counts are the server's, from the ``usage`` of its closing chunk; a
    stream without one counts its content chunks instead. Every chunk carrying text is timed as
    a token's arrival.
    """
    chat = endpoint.endswith("/chat/completions")

    async def send(r: LoadRequest) -> Record:
        text = texts[tuple(r.prompt)]
        body: dict[str, Any] = {"model": model, "max_tokens": r.max_tokens, "temperature": 0.0, "stream": True,
                                **({"messages": [{"role": "user", "content": text}]} if chat else {"prompt": text}),
                                **(extra_body or {})}
        rec = Record(len(r.prompt))
        seen: dict[str, Any] = {"chunks": 0, "usage": None}

        def token_event(event: bytes) -> bool:
            if not event.startswith(b"data: "):
                return False
            chunk = json.loads(event[len(b"data: "):])
            if "error" in chunk:
                rec.error = f"stream error: {str(chunk['error'])[:200]}"
                return False
            seen["usage"] = chunk.get("usage") or seen["usage"]
            choice = (chunk.get("choices") or [{}])[0]
            piece = (choice.get("delta") or {}).get("content") if chat else choice.get("text")
            seen["chunks"] += bool(piece)
            return bool(piece)

        await _stream(client, f"{url}{endpoint}", body, None, rec, token_event)
        if rec.error and rec.error.startswith("HTTP "):
            return rec
        if seen["usage"]:
            rec.prompt_tokens, rec.output_tokens = seen["usage"]["prompt_tokens"], seen["usage"]["completion_tokens"]
        else:
            rec.output_tokens, rec.counted_from_chunks = seen["chunks"], True
        return rec

    return send


def engine_sender(engine: Any) -> Callable[[LoadRequest], Awaitable[Record]]:
    """A ``send`` straight into an in-process ``Engine``: the same requests without HTTP."""
    from . import SamplingParams
    counter = iter(range(1 << 62))

    async def send(r: LoadRequest) -> Record:
        rec = Record(len(r.prompt))
        t0 = last = time.perf_counter()
        stream = engine.add_request(f"load-{next(counter)}", r.prompt,
                                    SamplingParams(max_tokens=r.max_tokens, temperature=0.0, ignore_eos=True))
        async for out in stream:
            now = time.perf_counter()
            if out.new_token_ids:
                if rec.ttft is None:
                    rec.ttft = now - t0
                else:
                    rec.itl.append(now - last)
                last = now
            rec.output_tokens = out.completion_tokens
        rec.e2e = time.perf_counter() - t0
        return rec

    return send


def _stats(values: list[float]) -> dict[str, Optional[float]]:
    if not values:
        return {"mean": None, "p50": None, "p90": None, "p99": None}
    s = sorted(values)

    def pct(q: float) -> float:             # linear interpolation between closest ranks
        k = (len(s) - 1) * q
        lo, hi = math.floor(k), math.ceil(k)
        return s[lo] + (s[hi] - s[lo]) * (k - lo)
    return {"mean": sum(s) / len(s), "p50": pct(0.5), "p90": pct(0.9), "p99": pct(0.99)}


def summarize(records: list[Record], seconds: float) -> dict[str, Any]:
    """Throughput and latency statistics of one run (latencies in milliseconds).

    Example:
        >>> s = summarize([Record(10, 4, 0.1, [0.01, 0.02, 0.03], 0.16)], seconds=0.2)
        >>> s["output_tokens_per_s"], s["ttft_ms"]["p50"], s["itl_ms"]["p50"]
        (20.0, 100.0, 20.0)
    """
    ok = [r for r in records if r.error is None]
    out = sum(r.output_tokens for r in ok)
    ms = lambda xs: {k: (v * 1000 if v is not None else None) for k, v in _stats(xs).items()}  # noqa: E731
    tpot = [(r.e2e - r.ttft) / (r.output_tokens - 1) for r in ok if r.ttft is not None and r.output_tokens > 1]
    return {
        "requests": len(records), "failed": len(records) - len(ok), "seconds": seconds,
        "errors": sorted({r.error for r in records if r.error})[:5],
        "request_throughput": len(ok) / seconds if seconds else 0.0,
        "prompt_tokens": sum(r.prompt_tokens for r in ok),
        "output_tokens": out, "output_tokens_per_s": out / seconds if seconds else 0.0,
        "total_tokens_per_s": (out + sum(r.prompt_tokens for r in ok)) / seconds if seconds else 0.0,
        "ttft_ms": ms([r.ttft for r in ok if r.ttft is not None]), "tpot_ms": ms(tpot),
        "itl_ms": ms([x for r in ok for x in r.itl]), "e2e_ms": ms([r.e2e for r in ok]),
    }


def records_json(records: list[Record]) -> list[dict[str, Any]]:
    return [asdict(r) for r in records]


def engine_batch(engine: Any, requests: list[LoadRequest], poll_s: float = 0.002) -> tuple[list[Record], float]:
    """All requests submitted at once to a started ``Engine`` with no consumer while it runs (as
    the offline ``LLM`` does): the engine's own throughput, the reference for the online runs.
    TTFT is the engine's; TPOT comes from the first and last token's arrival; no ITL.

    Example:
        >>> from opforge.models.testing import tiny_decoder
        >>> from opforge.serve import Engine
        >>> engine = Engine(tiny_decoder(), kv_blocks=32)
        >>> engine.start()
        >>> records, seconds = engine_batch(engine, ragged_workload(3, (2, 4), (3, 3), 64))
        >>> engine.shutdown()
        >>> [r.output_tokens for r in records]
        [3, 3, 3]
    """
    from . import SamplingParams
    base = f"batch-{time.monotonic_ns()}"
    start = time.perf_counter()
    streams = [engine.add_request(f"{base}-{i}", r.prompt,
                                  SamplingParams(max_tokens=r.max_tokens, temperature=0.0, ignore_eos=True))
               for i, r in enumerate(requests)]
    while engine.has_unfinished():
        time.sleep(poll_s)
    seconds = time.perf_counter() - start
    records = []
    for r, stream in zip(requests, streams):
        outs = list(stream)
        rec = Record(len(r.prompt), outs[-1].completion_tokens, outs[-1].time_to_first_token)
        if outs[-1].finish_reason == "abort":
            rec.error = "aborted"
        rec.e2e = (stream.last_token_at or start) - start
        records.append(rec)
    return records, seconds
