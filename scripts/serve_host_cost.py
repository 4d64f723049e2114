"""The server's host cost per generated token: CPU time of the HTTP thread (asyncio loop: SSE
chunks, metrics, stream hand-off) and of the engine's step thread, per token, under a streaming load.

``opforge serve``'s app runs in this process (uvicorn in a thread, the engine's step loop in its
own); a client process streams a ragged workload at a fixed concurrency over loopback (its CPU is
not counted). Each thread's CPU time comes from its POSIX CPU clock. ``--profile`` also runs
cProfile in both server threads and prints their tops (slower: use it for where, not how much).

    PYTHONPATH=src python scripts/serve_host_cost.py [--concurrency 32] [--num-requests 64] [--profile]

Defaults fit a CPU (the tiny random model, a byte-level tokenizer so text is detokenized);
``--device cuda --shape 1b`` runs the 1B shape on a GPU.
"""
from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import json
import pstats
import subprocess
import sys
import tempfile
import threading
import time

import torch


def _client(url: str, concurrency: int, num_requests: int, prompt_len: tuple[int, int],
            output_len: tuple[int, int], vocab: int) -> None:
    import httpx

    from opforge.serve.loadgen import http_sender, ragged_workload, run_load, summarize

    async def go() -> dict:
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
        async with httpx.AsyncClient(timeout=httpx.Timeout(600.0), limits=limits) as client:
            send = http_sender(client, url, "bench")
            await run_load(ragged_workload(concurrency, prompt_len, output_len, vocab, 1), send)   # warm-up
            print("WARM", flush=True)
            sys.stdin.readline()                                                      # the server is measuring
            work = ragged_workload(num_requests, prompt_len, output_len, vocab, 0)
            records, seconds = await run_load(work, send, concurrency=concurrency)
            return summarize(records, seconds)
    print(json.dumps(asyncio.run(go())), flush=True)


def _cpu(thread: threading.Thread) -> float:
    return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", choices=["tiny", "1b"], default="tiny")
    p.add_argument("--device", default="cpu")
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--num-requests", type=int, default=64)
    p.add_argument("--prompt-len", default="16:64")
    p.add_argument("--output-len", default="64:192")
    p.add_argument("--paced-step-ms", type=float, help="no model: a stand-in engine that gives every running "
                   "request one token per step of this many ms (sleeping, as while a GPU computes)")
    p.add_argument("--profile", action="store_true", help="cProfile both server threads (slower)")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--sort", default="tottime", help="pstats order of the profiles (tottime, cumulative, ...)")
    p.add_argument("--client", help=argparse.SUPPRESS)
    p.add_argument("--vocab", type=int, default=64, help=argparse.SUPPRESS)
    args = p.parse_args()
    prompt_len = tuple(int(v) for v in args.prompt_len.split(":"))
    output_len = tuple(int(v) for v in args.output_len.split(":"))
    if args.client:
        _client(args.client, args.concurrency, args.num_requests, prompt_len, output_len, args.vocab)
        return

    import uvicorn

    from opforge.models.testing import LLAMA_1B, TINY_LLAMA, write_random_checkpoint
    from opforge.serve.api import ServerConfig, create_app
    from opforge.serve.cli import build_engine
    from opforge.serve.tokenizer import byte_tokenizer

    config = {"tiny": TINY_LLAMA, "1b": LLAMA_1B}[args.shape]
    if args.paced_step_ms is not None:
        engine = PacedEngine(args.paced_step_ms / 1000)
    else:
        dtype = torch.float32 if args.device == "cpu" else torch.bfloat16
        directory = write_random_checkpoint(config, tempfile.mkdtemp(prefix="opforge-host-cost-"),
                                            device=args.device, dtype=dtype)
        engine = build_engine(directory, device=args.device, dtype=dtype, max_num_seqs=max(args.concurrency, 1),
                              max_model_len=256 if args.shape == "tiny" else 2048,
                              kv_blocks=4096 if args.shape == "tiny" else None)
        engine.tokenizer = byte_tokenizer()     # detokenize as a real model would (ids < 256 are bytes)
    app = create_app(engine, ServerConfig(model_name="bench"), manage_engine=False)
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))

    profiles: dict[str, cProfile.Profile] = {}

    def run_server() -> None:
        if args.profile:
            profiles["http"] = prof = cProfile.Profile()
            prof.enable()
        server.run()
        if args.profile:
            prof.disable()

    engine.start()
    if args.profile:                           # the engine's thread is started: profile it from inside
        def hook() -> None:
            profiles["engine"] = prof = cProfile.Profile()
            prof.enable()
        _run_in_engine_thread(engine, hook)
    http = threading.Thread(target=run_server, daemon=True)
    http.start()
    while not server.started:
        time.sleep(0.02)
    client = subprocess.Popen([sys.executable, __file__, "--client", f"http://127.0.0.1:{port}",
                               "--concurrency", str(args.concurrency), "--num-requests", str(args.num_requests),
                               "--prompt-len", args.prompt_len, "--output-len", args.output_len,
                               "--vocab", str(config["vocab_size"])],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert client.stdout.readline().strip() == "WARM"
    for prof in profiles.values():
        prof.clear()                           # count the measured requests only
    engine_thread = engine._thread             # noqa: SLF001
    c_http, c_engine, steps0, t0 = _cpu(http), _cpu(engine_thread), engine.stats().steps, time.perf_counter()
    client.stdin.write("go\n")
    client.stdin.flush()
    summary = json.loads(client.stdout.readline())
    wall = time.perf_counter() - t0
    d_http, d_engine, steps = _cpu(http) - c_http, _cpu(engine_thread) - c_engine, engine.stats().steps - steps0
    tokens = summary["output_tokens"]
    client.wait()
    result = {"tokens": tokens, "wall_s": round(wall, 3), "tokens_per_s": round(tokens / wall, 1), "steps": steps,
              "ms_per_step": round(1e3 * wall / steps, 3),
              "http_cpu_us_per_token": round(1e6 * d_http / tokens, 1),
              "engine_cpu_us_per_token": round(1e6 * d_engine / tokens, 1),
              "itl_ms": summary["itl_ms"], "failed": summary["failed"]}
    print(json.dumps(result))
    server.should_exit = True
    http.join(30)
    engine.shutdown()
    for name, prof in profiles.items():
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats(args.sort).print_stats(args.top)
        print(f"==== {name} thread, by {args.sort}\n{buf.getvalue()}")


class PacedEngine:
    """A stand-in for ``Engine`` without a model: each step sleeps ``step_s`` (the GIL released, as
    while waiting for a GPU) and then gives every running request one token (one character of
    text), so only the server's own per-token work is measured."""

    max_model_len = 1 << 20
    tokenizer = None
    error = None
    device = torch.device("cpu")

    def __init__(self, step_s: float):
        self.step_s = step_s
        self._lock = threading.Condition()
        self._requests: dict = {}
        self._steps = 0
        self._stopping = False
        self._thread: threading.Thread | None = None

    def add_request(self, request_id, prompt, params):
        from opforge.serve.stream import RequestStream
        stream = RequestStream(request_id, prompt)
        with self._lock:
            self._requests[request_id] = [stream, len(prompt), params.max_tokens, 0, time.perf_counter(), None]
            self._lock.notify()
        return stream

    def abort(self, request_id):
        from opforge.serve.stream import RequestOutput
        with self._lock:
            stream, n_prompt, _, done, _, ttft = self._requests.pop(request_id)
        stream.put(RequestOutput(request_id, [], "", True, "abort", n_prompt, done, ttft))

    def stats(self):
        from opforge.serve.stream import EngineStats
        with self._lock:
            n = len(self._requests)
        return EngineStats(n, 0, 1, 0, 1, 0, 0, 0, self.step_s, self._steps)

    def step(self):
        from opforge.serve.stream import RequestOutput
        time.sleep(self.step_s)
        with self._lock:
            for rid, r in list(self._requests.items()):
                stream, n_prompt, max_tokens, done, arrival, ttft = r
                r[3] = done = done + 1
                if ttft is None:
                    r[5] = ttft = time.perf_counter() - arrival
                finished = done >= max_tokens
                if finished:
                    del self._requests[rid]
                stream.put(RequestOutput(rid, [65 + done % 26], chr(97 + done % 26), finished,
                                         "length" if finished else None, n_prompt, done, ttft))
            self._steps += 1

    def start(self):
        def loop():
            while True:
                with self._lock:
                    while not self._stopping and not self._requests:
                        self._lock.wait()
                    if self._stopping:
                        return
                self.step()
        self._thread = threading.Thread(target=loop, daemon=True)
        self._thread.start()

    def shutdown(self):
        with self._lock:
            self._stopping = True
            self._lock.notify_all()
        self._thread.join()


def _run_in_engine_thread(engine, fn) -> None:
    """Run ``fn`` once in the engine's step thread (at its next step)."""
    step = engine.step

    def once(*a, **k):
        engine.step = step
        fn()
        return step(*a, **k)
    engine.step = once


if __name__ == "__main__":
    main()
