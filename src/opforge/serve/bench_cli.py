"""``opforge bench-serve``: load-test the OpenAI-compatible server, and the engine without HTTP.

Given a checkpoint directory (or ``--random 1b``), it starts ``opforge serve`` on a free loopback
port, sends a ragged workload (fixed seed) at each ``--rate`` and ``--concurrency``, and reports
TTFT, TPOT, ITL and end-to-end latency (mean, p50, p90, p99) with request and token
throughput. ``--offline`` first runs the same requests at the same settings straight through an
in-process ``Engine``, plus the whole workload submitted at once with no consumer (the offline
``LLM``'s way: the engine's own throughput), and once more with ``max_num_seqs`` set to each
``--concurrency`` (as many requests in flight as that many closed-loop clients can have); each
online row is also given as a fraction of all three.
Given ``--url``, it loads a server that is already running. ``--peer transformers`` then serves
the same checkpoint with transformers' own server (``transformers serve --continuous-batching``,
see ``opforge.serve.peer_server``) and sends it the same requests at the same settings: rows of
mode ``transformers-serve``, each with ``opforge_online_over_peer_output_tokens_per_s``.
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import json
import math
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Optional, Sequence

import httpx
import torch

from .loadgen import (LoadRequest, engine_batch, engine_sender, free_port, http_sender, ragged_workload, records_json,
                      run_load, summarize, text_sender)

EPILOG = """\
examples:
  opforge bench-serve --random 1b --offline --num-requests 64 --concurrency 1,32 --json serve.json
  opforge bench-serve MODEL_DIR --prompt-len 512:512 --output-len 32:32 --rate 1 --num-requests 32
  opforge bench-serve --url http://127.0.0.1:8000 --model NAME --vocab-size 128256 --rate 4,16
  opforge bench-serve --random tiny --device cpu --num-requests 8 --prompt-len 4:16 --output-len 2:8 --offline
  opforge bench-serve --random 1b --num-requests 64 --concurrency 32 --peer transformers --json peer.json
"""


def _range(text: str) -> tuple[int, int]:
    lo, _, hi = text.partition(":")
    try:
        a, b = int(lo), int(hi or lo)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected LOW:HIGH token counts, got {text!r}") from None
    if not 1 <= a <= b:
        raise argparse.ArgumentTypeError(f"expected 1 <= LOW <= HIGH, got {text!r}")
    return a, b


def _list(kind: type) -> Any:
    def parse(text: str) -> list:
        try:
            return [kind(v) for v in text.split(",") if v]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None
    return parse


def _random_checkpoint(shape: str, dtype: Optional[str]) -> str:
    from ..models.testing import LLAMA_1B, LLAMA_8B, TINY_LLAMA, write_random_checkpoint
    config = {"tiny": TINY_LLAMA, "1b": LLAMA_1B, "8b": LLAMA_8B}[shape]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    return write_random_checkpoint(config, tempfile.mkdtemp(prefix=f"opforge-serve-{shape}-"), device=device,
                                   dtype=torch.float32 if shape == "tiny" else getattr(torch, dtype or "bfloat16"))


def _server_args(args: argparse.Namespace) -> list[str]:
    out = []
    for name in ("device", "dtype", "quantize", "max_num_seqs", "max_model_len", "kv_memory_fraction", "kv_blocks",
                 "max_num_batched_tokens", "max_prefill_tokens_while_decoding"):
        value = getattr(args, name)
        if value is not None:
            out += [f"--{name.replace('_', '-')}", str(value)]
    return out + (["--no-overlap"] if args.no_overlap else []) + (["--no-prefix-caching"] if args.no_prefix_caching else [])


def _start_server(model_dir: str, args: argparse.Namespace) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [sys.executable, "-m", "opforge", "serve", model_dir, "--port", str(port), "--served-model-name", "bench",
           *_server_args(args)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("opforge serve: http://"):
            print(line.rstrip(), flush=True)
            threading.Thread(target=proc.stdout.read, daemon=True).start()
            return proc, f"http://127.0.0.1:{port}"
    proc.wait()
    raise RuntimeError("opforge serve did not start:\n" + "".join(lines[-30:]))


def _settings(args: argparse.Namespace) -> list[tuple[float, Optional[int]]]:
    rates = args.rate or [math.inf]
    concurrencies = args.concurrency or [None]
    return [(r, c) for r in rates for c in concurrencies]


def _label(rate: float, concurrency: Optional[int]) -> str:
    return f"rate={'inf' if math.isinf(rate) else rate} concurrency={concurrency or 'unbounded'}"


async def _offline(model_dir: str, args: argparse.Namespace, warm: list[LoadRequest],
                   work: list[LoadRequest]) -> list[dict[str, Any]]:
    """The in-process engine's rows: the whole workload at once (``offline-batch``), each setting
    with an asyncio consumer (``offline``), and the whole workload at once with ``max_num_seqs``
    set to each ``--concurrency`` (``offline-batch`` with that concurrency: what the engine gives
    with that many requests in flight, none of them waiting on a client)."""
    from .cli import load_for_serving
    dtype = getattr(torch, args.dtype) if args.dtype else None
    model, tokenizer = load_for_serving(model_dir, device=args.device, dtype=dtype, quantize=args.quantize,
                                        max_model_len=args.max_model_len)
    max_num_seqs = args.max_num_seqs or 256
    rows: list[dict[str, Any]] = []

    async def batch_and_settings(engine: Any) -> None:
        records, seconds = engine_batch(engine, work)
        rows.append({"mode": "offline-batch", "rate": math.inf, "concurrency": None, "max_num_seqs": max_num_seqs,
                     **summarize(records, seconds)})
        _print_row(rows[-1])
        send = engine_sender(engine)
        for rate, concurrency in _settings(args):
            records, seconds = await run_load(work, send, rate, concurrency, seed=args.seed)
            rows.append({"mode": "offline", "rate": rate, "concurrency": concurrency, **summarize(records, seconds)})
            _print_row(rows[-1])

    await _with_engine(model, tokenizer, args, max_num_seqs, warm, batch_and_settings)
    for concurrency in sorted({c for c in args.concurrency or [] if c < max_num_seqs}):
        async def capped(engine: Any, concurrency: int = concurrency) -> None:
            records, seconds = engine_batch(engine, work)
            rows.append({"mode": "offline-batch", "rate": math.inf, "concurrency": concurrency,
                         "max_num_seqs": concurrency, **summarize(records, seconds)})
            _print_row(rows[-1])
        await _with_engine(model, tokenizer, args, concurrency, warm, capped)
    del model, tokenizer        # the server loads its own copy next
    _release_memory()
    return rows


async def _with_engine(model: Any, tokenizer: Any, args: argparse.Namespace, max_num_seqs: int,
                       warm: list[LoadRequest], run: Any) -> None:
    """Start an engine on ``model`` with the bench's settings and ``max_num_seqs``, warm it, await
    ``run(engine)``, and give its KV cache and graphs back before returning."""
    from . import Engine
    from .cli import prefill_bound
    engine = Engine(model, max_num_seqs=max_num_seqs, kv_memory_fraction=args.kv_memory_fraction or 0.9,
                    kv_blocks=args.kv_blocks, tokenizer=tokenizer, max_num_batched_tokens=args.max_num_batched_tokens,
                    max_prefill_tokens_while_decoding=prefill_bound(args.max_prefill_tokens_while_decoding),
                    overlap=not args.no_overlap, enable_prefix_caching=not args.no_prefix_caching)
    engine.warm_up()
    engine.start()
    try:
        await run_load(warm, engine_sender(engine))
        await run(engine)
    finally:
        engine.shutdown()
        del engine
        _release_memory()


def _release_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


async def _online(url: str, model: str, args: argparse.Namespace, warm: list[LoadRequest],
                  work: list[LoadRequest]) -> list[dict[str, Any]]:
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else None
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0), limits=limits) as client:
        send = http_sender(client, url, model, headers)
        await run_load(warm, send)
        return await _rows_at_settings("online", send, args, work)


async def _rows_at_settings(mode: str, send: Any, args: argparse.Namespace, work: list[LoadRequest],
                            annotate: Any = None) -> list[dict[str, Any]]:
    """One printed row per ``--rate`` x ``--concurrency`` setting: the workload sent through
    ``send``; ``annotate(row, records)`` adds to a row what its records say."""
    rows = []
    for rate, concurrency in _settings(args):
        records, seconds = await run_load(work, send, rate, concurrency, seed=args.seed)
        row = {"mode": mode, "rate": rate, "concurrency": concurrency, **summarize(records, seconds)}
        if annotate is not None:
            annotate(row, records)
        if args.records:
            row["records"] = records_json(records)
        rows.append(row)
        _print_row(row)
    return rows


def _peer_rows(model_dir: str, args: argparse.Namespace, warm: list[LoadRequest], work: list[LoadRequest],
               vocab: int, online: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Serve ``model_dir`` with ``transformers serve`` and send it the workload at every setting."""
    import transformers
    from transformers import AutoTokenizer

    from .peer_server import prompt_texts, start_transformers_server, write_id_tokenizer
    if args.random:
        write_id_tokenizer(model_dir, vocab)
    prompts = sorted({tuple(r.prompt) for r in warm + work})
    texts = dict(zip(prompts, prompt_texts(AutoTokenizer.from_pretrained(model_dir), prompts)))
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = args.dtype or {"tiny": "float32", None: "auto"}.get(args.random, "bfloat16")
    _release_memory()                          # what drawing a random checkpoint left cached
    peer = start_transformers_server(model_dir, device, dtype, shlex.split(args.peer_args or ""), args.peer_timeout)
    print(f"transformers serve {transformers.__version__}: {peer.url}{peer.endpoint} (continuous batching, "
          f"{device}, {dtype}), up in {peer.load_seconds:.1f} s", flush=True)
    try:
        rows = asyncio.run(_peer_load(peer, texts, args, warm, work))
    except BaseException:
        peer.stop()
        print(f"transformers serve log ({peer.log_path}):\n{peer.log_tail()}", file=sys.stderr, flush=True)
        raise
    peer.stop()
    os.unlink(peer.log_path)
    by_setting = {(r["rate"], r["concurrency"]): r for r in online}
    for row in rows:
        row["peer"]["load_seconds"] = peer.load_seconds
        row["peer"]["transformers_version"] = transformers.__version__
        mine = by_setting.get((row["rate"], row["concurrency"]))
        if mine and row["output_tokens_per_s"]:
            ratio = mine["output_tokens_per_s"] / row["output_tokens_per_s"]
            row["opforge_online_over_peer_output_tokens_per_s"] = ratio
            print(f"opforge/transformers-serve {_label(row['rate'], row['concurrency'])}: {ratio:.2f}x the "
                  f"output tokens/s", flush=True)
    return rows


async def _peer_load(peer: Any, texts: dict[tuple[int, ...], str], args: argparse.Namespace,
                     warm: list[LoadRequest], work: list[LoadRequest]) -> list[dict[str, Any]]:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    # transformers' continuous batching takes eos_token_id -1 as "no end of sequence": ignore_eos
    extra = {"generation_config": json.dumps({"eos_token_id": -1, "do_sample": False})}
    async with httpx.AsyncClient(timeout=httpx.Timeout(1800.0), limits=limits) as client:
        send = text_sender(client, peer.url, peer.endpoint, peer.model, texts, extra)
        start = time.perf_counter()
        warm_records, _ = await run_load(warm, send)        # the first request starts its batching manager
        warmup_seconds = time.perf_counter() - start
        print(f"transformers serve warm-up: {len(warm)} requests in {warmup_seconds:.1f} s", flush=True)

        def annotate(row: dict[str, Any], records: list[Any]) -> None:
            row["peer"] = {"endpoint": peer.endpoint, "warmup_seconds": warmup_seconds,
                           "warmup_failed": sum(r.error is not None for r in warm_records),
                           "ignore_eos": "generation_config eos_token_id=-1",
                           "requested_output_tokens": sum(r.max_tokens for r in work),
                           "output_tokens_from": "chunks" if any(r.counted_from_chunks for r in records) else "usage"}

        return await _rows_at_settings("transformers-serve", send, args, work, annotate)


def _print_row(row: dict[str, Any]) -> None:
    def f(stats: dict[str, Any], key: str) -> str:
        v = stats[key]
        return "-" if v is None else f"{v:.1f}"
    print(f"{row['mode']:8s} {_label(row['rate'], row['concurrency']):32s} {row['requests'] - row['failed']:4d} ok "
          f"{row['failed']:3d} failed  {row['request_throughput']:7.2f} req/s  {row['output_tokens_per_s']:9.1f} out tok/s  "
          f"TTFT p50/p99 {f(row['ttft_ms'], 'p50')}/{f(row['ttft_ms'], 'p99')} ms  "
          f"ITL p50/p99 {f(row['itl_ms'], 'p50')}/{f(row['itl_ms'], 'p99')} ms  "
          f"TPOT p50 {f(row['tpot_ms'], 'p50')} ms  E2E p50 {f(row['e2e_ms'], 'p50')} ms", flush=True)
    for e in row["errors"]:
        print(f"         error: {e}", flush=True)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="opforge bench-serve", description=__doc__.splitlines()[0], epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument("model_dir", nargs="?", help="a checkpoint directory to serve")
    target.add_argument("--random", choices=["tiny", "1b", "8b"], help="serve a random checkpoint of this shape")
    target.add_argument("--url", help="load a server that is already running")
    p.add_argument("--model", default="bench", help="with --url: the served model name")
    p.add_argument("--api-key", default=os.environ.get("OPFORGE_API_KEY"))
    p.add_argument("--vocab-size", type=int, help="with --url: the vocabulary to draw prompt ids from")
    p.add_argument("--num-requests", type=int, default=64)
    p.add_argument("--prompt-len", type=_range, default=(64, 1024), metavar="LOW:HIGH", help="default 64:1024")
    p.add_argument("--output-len", type=_range, default=(32, 256), metavar="LOW:HIGH", help="default 32:256")
    p.add_argument("--rate", type=_list(float), help="requests/s, Poisson arrivals, comma-separated (default inf)")
    p.add_argument("--concurrency", type=_list(int), help="requests in flight at most, comma-separated")
    p.add_argument("--warmup", type=int, help="requests sent at once before measuring (default: the largest "
                                              "concurrency, or all: batch sizes shrink through every CUDA graph size)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--offline", action="store_true", help="also run the same requests through the engine in-process")
    p.add_argument("--records", action="store_true", help="keep every request's timings in the JSON")
    p.add_argument("--json", metavar="PATH", help="write the settings, the environment and every row as JSON")
    for name, kind in (("device", str), ("dtype", str), ("quantize", str), ("max-num-seqs", int),
                       ("max-model-len", int), ("kv-memory-fraction", float), ("kv-blocks", int),
                       ("max-num-batched-tokens", int), ("max-prefill-tokens-while-decoding", int)):
        p.add_argument(f"--{name}", type=kind, help="passed to opforge serve (and to the offline engine)")
    for name in ("no-overlap", "no-prefix-caching"):
        p.add_argument(f"--{name}", action="store_true", help="passed to opforge serve (and to the offline engine)")
    p.add_argument("--peer", choices=["transformers"], help="then the same requests to `transformers serve "
                                                             "--continuous-batching` on the same checkpoint")
    p.add_argument("--peer-args", metavar="ARGS", help="more options for transformers serve, given with '=', e.g. "
                                                        "--peer-args='--cb-use-cuda-graph'")
    p.add_argument("--peer-timeout", type=float, default=900.0, help="seconds for the peer to load (default 900)")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run ``opforge bench-serve``; returns 0, or 1 when any request failed.

    Example:
        >>> from opforge.serve.bench_cli import build_parser
        >>> build_parser().parse_args(["--random", "tiny", "--rate", "2,inf"]).rate
        [2.0, inf]
    """
    p = build_parser()
    args = p.parse_args(argv)
    if args.num_requests < 1:
        p.error(f"--num-requests must be >= 1, got {args.num_requests}")
    if args.warmup is not None and args.warmup < 0:
        p.error(f"--warmup must be >= 0, got {args.warmup}")
    if any(c < 1 for c in args.concurrency or []) or any(r <= 0 for r in args.rate or []):
        p.error("--concurrency and --rate take positive numbers")
    if args.url and args.offline:
        p.error("--offline needs a model (MODEL_DIR or --random), not --url")
    if args.url and args.peer:
        p.error("--peer needs a model (MODEL_DIR or --random), not --url")
    model_dir = _random_checkpoint(args.random, args.dtype) if args.random else args.model_dir
    if args.url:
        vocab = args.vocab_size or 1000
    else:
        with open(os.path.join(model_dir, "config.json")) as f:
            vocab = json.load(f)["vocab_size"]
    work = ragged_workload(args.num_requests, args.prompt_len, args.output_len, vocab, args.seed)
    if args.warmup is None:
        args.warmup = min(args.num_requests, max(args.concurrency or [args.num_requests]))
    warm = ragged_workload(args.warmup, args.prompt_len, args.output_len, vocab, args.seed + 1)
    rows: list[dict[str, Any]] = []
    if args.offline:
        rows += asyncio.run(_offline(model_dir, args, warm, work))
        _release_memory()                      # the model, before the server loads its own
    proc = None
    try:
        if args.url:
            url, model = args.url.rstrip("/"), args.model
        else:
            proc, url = _start_server(model_dir, args)
            model = "bench"
        online = asyncio.run(_online(url, model, args, warm, work))
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(120)
    offline = {(r["rate"], r["concurrency"]): r for r in rows if r["mode"] == "offline"}
    batches = {r["concurrency"]: r for r in rows if r["mode"] == "offline-batch"}
    batch = batches.get(None)
    for row in online:
        twin = offline.get((row["rate"], row["concurrency"]))
        capped = batches.get(row["concurrency"]) if row["concurrency"] is not None else None
        if capped is None and row["concurrency"] is not None and batch and batch["max_num_seqs"] <= row["concurrency"]:
            capped = batch                     # the engine's own cap already holds as few in flight
        for key, ref in (("fraction_of_offline_output_tokens_per_s", twin),
                         ("fraction_of_offline_batch_output_tokens_per_s", batch),
                         ("fraction_of_offline_batch_same_in_flight_output_tokens_per_s", capped)):
            if ref and ref["output_tokens_per_s"]:
                row[key] = row["output_tokens_per_s"] / ref["output_tokens_per_s"]
        if batch:
            same = row.get("fraction_of_offline_batch_same_in_flight_output_tokens_per_s")
            print(f"online/offline {_label(row['rate'], row['concurrency'])}: "
                  f"{row.get('fraction_of_offline_output_tokens_per_s', math.nan):.1%} of the engine's output "
                  f"tokens/s at the same setting, {row.get('fraction_of_offline_batch_output_tokens_per_s', math.nan):.1%}"
                  " of the offline batch's"
                  + ("" if same is None else f", {same:.1%} of the offline batch's with max_num_seqs="
                                             f"{min(row['concurrency'], batch['max_num_seqs'])}"))
    rows += online
    peer_error = None
    if args.peer:
        from .peer_server import PeerServerError
        try:
            rows += _peer_rows(model_dir, args, warm, work, vocab, online)
        except (PeerServerError, ImportError, OSError) as e:
            peer_error = f"{type(e).__name__}: {e}"
            print(f"transformers serve: no rows: {peer_error}", file=sys.stderr, flush=True)
    if args.json:
        from ..bench.envinfo import collect
        device = torch.device(args.device) if args.device else torch.device("cuda" if torch.cuda.is_available() else "cpu")
        settings = vars(args)
        with open(args.json, "w") as f:
            json.dump({"settings": settings, "environment": collect(device), "model_dir": model_dir, "rows": rows,
                       **({"peer_error": peer_error} if peer_error else {})}, f, indent=1, default=str)
    return 1 if peer_error or any(r["failed"] for r in rows) else 0
