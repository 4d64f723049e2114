"""``opforge bench --suite serve``: the serving engine, offline, on fixed workloads (not an op table).

Workloads (seeded; every request submitted at once):

- ``ragged-64``: 64 requests, prompts uniform in 64..1024 tokens, outputs uniform in 32..256;
- ``ragged-256``: the same distribution, 256 requests;
- ``shared-prefix``: 64 requests sharing a 1024-token prefix, each with a 64-token suffix of its
  own, 64 new tokens each; run with prefix caching and without (``shared-prefix-nocache``);
- ``batch1``: one request, a 128-token prompt, 256 new tokens (the engine's single-stream speed).

``--quick`` (and the ``tiny`` shape) divides lengths (and the engine's tokens per step) by 8 and
request counts by 4, for CPU smoke runs. Reported per workload: generated tokens/s (all requests' tokens over the wall time from
submission to the last token), time to first token p50/p99, peak GPU memory, prefix-cache hit
rate, preemptions. Greedy decoding; end-of-sequence ignored, so every request makes its tokens.

``opforge`` runs the engine as it is by default (overlapped decode steps: a greedy decode step's
successor launched before its tokens are read); ``opforge-serial`` with ``overlap=False``. Peers in the same run: ``static`` (``opforge.generate`` on batches of 32 in arrival order: a batch
ends with its longest request, the next waits for it; tokens/s counts the requested tokens only.
``generate`` runs the engine, so since it became the engine's client this peer measures static
batching by the same loop, no longer a static-cache loop of its own) and
``transformers`` (its continuous batching, ``generate_batch``'s manager with each request's own
``max_new_tokens``; when importable; an error is recorded, the run goes on; by default on CUDA
only, as its start-up takes ~50 s per run on a CPU).

Run: ``opforge bench --suite serve [--shapes 1b,8b] [--dtypes bf16,int4] [--ops ragged-64,...]
[--impls opforge,opforge-serial,static,transformers] [--quick] [--json serve.json]``.
"""
from __future__ import annotations

import gc
import json
import random
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import torch

from ..fmt import split_list
from .model_grid import _config, _first_line, sync

SHAPES = ("tiny", "1b", "8b")
PRECISIONS = ("bf16", "int8", "int4")
IMPLS = ("opforge", "opforge-serial", "static", "transformers")
STATIC_BATCH = 32


@dataclass(frozen=True)
class Workload:
    """Requests of one benchmark run: prompts (token ids) and new tokens per request."""

    name: str
    prompts: list[list[int]]
    outputs: list[int]
    prefix_caching: bool = True

    @property
    def longest(self) -> int:
        """Positions the engine needs for one request at most (prompt + its new tokens)."""
        return max(len(p) + n for p, n in zip(self.prompts, self.outputs))

    @property
    def static_longest(self) -> int:
        """Positions ``generate`` on batches of ``STATIC_BATCH`` needs: a batch's longest prompt
        plus its most new tokens (what ``generate`` checks against ``max_seq_len``)."""
        spans = []
        for i in range(0, len(self.prompts), STATIC_BATCH):
            batch = range(i, min(i + STATIC_BATCH, len(self.prompts)))
            spans.append(max(len(self.prompts[j]) for j in batch) + max(self.outputs[j] for j in batch))
        return max(spans)


def workloads(vocab: int, scale: int = 1, names: Optional[Sequence[str]] = None) -> list[Workload]:
    """The suite's workloads, lengths divided by ``scale`` and counts by ``scale // 2`` (at least 1).

    Example:
        >>> [(w.name, len(w.prompts)) for w in workloads(100, scale=8)]
        [('batch1', 1), ('ragged-64', 16), ('ragged-256', 64), ('shared-prefix', 16), ('shared-prefix-nocache', 16)]
    """
    count = max(1, scale // 2)

    def tokens(rng: random.Random, n: int) -> list[int]:
        return [rng.randrange(3, vocab) for _ in range(n)]

    def ragged(name: str, n: int, seed: int) -> Workload:
        rng = random.Random(seed)
        prompts = [tokens(rng, rng.randint(64 // scale, 1024 // scale)) for _ in range(n // count)]
        return Workload(name, prompts, [rng.randint(32 // scale, 256 // scale) for _ in prompts])

    rng = random.Random(2)
    prefix = tokens(rng, 1024 // scale)
    shared = [prefix + tokens(rng, 64 // scale) for _ in range(64 // count)]
    out = [Workload("batch1", [tokens(random.Random(3), 128 // scale)], [256 // scale]),
           ragged("ragged-64", 64, 0), ragged("ragged-256", 256, 1),
           Workload("shared-prefix", shared, [64 // scale] * len(shared)),
           Workload("shared-prefix-nocache", shared, [64 // scale] * len(shared), prefix_caching=False)]
    return [w for w in out if names is None or w.name in names]


def _percentile(values: list[float], q: float) -> Optional[float]:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def _peak_gb(device: torch.device) -> Optional[float]:
    return torch.cuda.max_memory_allocated(device) / 1e9 if device.type == "cuda" else None


def _reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def run_engine(model: Any, w: Workload, device: torch.device, max_num_seqs: int, vocab: int,
               max_num_batched_tokens: Optional[int] = None, overlap: bool = True) -> dict[str, Any]:
    """One workload through a new ``Engine``, warmed up first (kernels compiled, graphs captured)."""
    from opforge.serve import Engine, SamplingParams
    engine = Engine(model, max_num_seqs=max_num_seqs, enable_prefix_caching=w.prefix_caching,
                    max_num_batched_tokens=max_num_batched_tokens, overlap=overlap)
    engine.warm_up()        # kernels compiled, library kernels loaded, every graph size captured
    before = engine.stats()
    preempted = engine.scheduler.preemptions
    sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    t0 = time.perf_counter()
    streams = [engine.add_request(f"{w.name}-{i}", p, SamplingParams(max_tokens=n, ignore_eos=True))
               for i, (p, n) in enumerate(zip(w.prompts, w.outputs))]
    while engine.has_unfinished():
        engine.step()
    sync(device)
    wall = time.perf_counter() - t0
    outs = [list(s) for s in streams]
    generated = sum(o[-1].completion_tokens for o in outs)
    ttft = [o[-1].time_to_first_token for o in outs if o[-1].time_to_first_token is not None]
    after = engine.stats()
    queries = after.prefix_cache_queries - before.prefix_cache_queries
    return {"tokens_per_s": generated / wall, "generated": generated, "wall_s": wall,
            "ttft_p50_ms": 1e3 * _percentile(ttft, 0.5), "ttft_p99_ms": 1e3 * _percentile(ttft, 0.99),
            "peak_gb": _peak_gb(device), "steps": after.steps - before.steps,
            "preemptions": engine.scheduler.preemptions - preempted,
            "prefix_hit_rate": (after.prefix_cache_hits - before.prefix_cache_hits) / queries if queries else 0.0,
            "kv_blocks": after.blocks_total, "overlapped_steps": engine.overlapped_steps}


def run_static(model: Any, w: Workload, device: torch.device) -> dict[str, Any]:
    """``opforge.generate`` in batches of ``STATIC_BATCH`` in arrival order (one warm-up batch first)."""
    from opforge.serve import generate
    batches = [range(i, min(i + STATIC_BATCH, len(w.prompts))) for i in range(0, len(w.prompts), STATIC_BATCH)]
    generate(model, [w.prompts[i] for i in batches[0]], 2)
    _reset_peak(device)
    sync(device)
    t0 = time.perf_counter()
    for batch in batches:
        generate(model, [w.prompts[i] for i in batch], max(w.outputs[i] for i in batch))
    sync(device)
    wall = time.perf_counter() - t0
    return {"tokens_per_s": sum(w.outputs) / wall, "generated": sum(w.outputs), "wall_s": wall,
            "peak_gb": _peak_gb(device)}


def run_transformers(hf: Any, w: Workload, device: torch.device) -> dict[str, Any]:
    """transformers' continuous batching manager, each request with its own ``max_new_tokens``."""
    from transformers import GenerationConfig
    config = GenerationConfig(max_new_tokens=max(w.outputs), do_sample=False, eos_token_id=None, pad_token_id=0)
    with hf.continuous_batching_context_manager(generation_config=config, block=True, timeout=30) as manager:
        _reset_peak(device)
        t0 = time.perf_counter()
        ids = [manager.add_request(p, request_id=f"r{i}", max_new_tokens=n)
               for i, (p, n) in enumerate(zip(w.prompts, w.outputs))]
        done: dict[str, Any] = {}
        while len(done) < len(ids):
            result = manager.get_result(timeout=5)
            if result is None:
                if not manager.is_running():
                    raise RuntimeError("transformers' generation thread stopped")
                continue
            if result.is_finished():
                done[result.request_id] = result
        wall = time.perf_counter() - t0
    generated = sum(len(r.generated_tokens) for r in done.values())
    return {"tokens_per_s": generated / wall, "generated": generated, "wall_s": wall, "peak_gb": _peak_gb(device)}


def run_serve_suite(shapes: Optional[list[str]] = None, device: Optional[str] = None,
                    precisions: Optional[list[str]] = None, names: Optional[list[str]] = None,
                    impls: Optional[list[str]] = None, quick: bool = False, json_path: Optional[str] = None,
                    out: Any = None) -> dict[str, Any]:
    """Run the serve benchmark; prints rows as they come, returns (and optionally writes) them.

    Example:
        >>> import io
        >>> r = run_serve_suite(["tiny"], "cpu", ["bf16"], ["batch1"], ["opforge", "static"], True, out=io.StringIO())
        >>> [(row["workload"], row["impl"]) for row in r["rows"]]
        [('batch1', 'opforge'), ('batch1', 'static')]
    """
    from opforge.models import load
    from opforge.models.testing import write_random_checkpoint
    out = out or sys.stdout
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    shapes = shapes or (["1b"] if dev.type == "cuda" else ["tiny"])
    precisions = precisions or ["bf16"]
    impls = impls or (list(IMPLS) if dev.type == "cuda" else ["opforge", "opforge-serial", "static"])
    # (transformers' start-up takes ~50 s per run on a CPU)
    unknown = [s for s in shapes if s not in SHAPES] + [p for p in precisions if p not in PRECISIONS] + \
        [i for i in impls if i not in IMPLS]
    if unknown:
        raise ValueError(f"serve suite: unknown {', '.join(unknown)}; shapes {', '.join(SHAPES)}, precisions "
                         f"{', '.join(PRECISIONS)}, impls {', '.join(IMPLS)}")
    result: dict[str, Any] = {"device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
                              "quick": quick, "rows": []}

    def record(shape: str, precision: str, w: Workload, impl: str, fn: Any) -> None:
        row = {"shape": shape, "precision": precision, "dtype": str(dtype).removeprefix("torch."),
               "workload": w.name, "impl": impl, "requests": len(w.prompts)}
        try:
            row.update(fn())
        except Exception as exc:                         # a failing point is recorded, the run goes on
            row["error"] = _first_line(exc)
        result["rows"].append(row)
        print(_line(row), file=out, flush=True)

    for shape in shapes:
        config = _config(shape)
        scale = 8 if quick or shape == "tiny" else 1
        ws = workloads(config["vocab_size"], scale, names)
        if not ws:
            raise ValueError(f"serve suite: no workload among {names}")
        longest = max(max(w.longest, w.static_longest if "static" in impls else 0) for w in ws)
        dtype = torch.float32 if dev.type == "cpu" else torch.bfloat16       # CPU: bf16 matmuls are slow
        directory = tempfile.mkdtemp(prefix=f"opforge-serve-{shape}-")
        try:
            write_random_checkpoint(config, directory, dev if dev.type == "cuda" else "cpu")
            for precision in precisions:
                quantize = None if precision == "bf16" else precision
                model = load(directory, device=dev, dtype=dtype, quantize=quantize, max_seq_len=longest + 8)
                max_num_seqs = max(len(w.prompts) for w in ws)
                for impl in ("opforge", "opforge-serial"):
                    if impl in impls:
                        for w in ws:
                            record(shape, precision, w, impl,
                                   lambda: run_engine(model, w, dev, max_num_seqs, config["vocab_size"],
                                                      None if scale == 1 else 2048 // scale,
                                                      overlap=impl == "opforge"))
                            _reset_peak(dev)
                if "static" in impls:
                    for w in ws:
                        if w.prefix_caching:
                            record(shape, precision, w, "static", lambda: run_static(model, w, dev))
                del model
                _reset_peak(dev)
                if "transformers" in impls and precision == "bf16":
                    _transformers_rows(directory, dev, dtype, ws, lambda w, fn: record(shape, precision, w,
                                                                                        "transformers", fn))
        finally:
            shutil.rmtree(directory, ignore_errors=True)
    result["summary"] = summary(result["rows"])
    for line in result["summary"]:
        print(line, file=out)
    if json_path:
        with open(json_path, "w") as f:
            json.dump(result, f, indent=1, default=str)
        print(f"wrote {json_path}", file=out)
    return result


def summary(rows: list[dict[str, Any]]) -> list[str]:
    """The comparisons the targets are stated in: each engine run against the static batches of
    the same workload, and shared-prefix time to first token against the run without caching.

    Example:
        >>> rows = [{"shape": "1b", "precision": "bf16", "workload": "ragged-64", "impl": i, "tokens_per_s": t}
        ...         for i, t in (("opforge", 18000.0), ("static", 9000.0))]
        >>> summary(rows)
        ['1b bf16 ragged-64: opforge 18000 tokens/s = 2.00x static']
    """
    ok = {(r["shape"], r["precision"], r["workload"], r["impl"]): r for r in rows if "error" not in r}
    lines = []
    for (shape, precision, workload, impl), r in ok.items():
        if not impl.startswith("opforge"):
            continue
        static = ok.get((shape, precision, workload, "static"))
        if static:
            lines.append(f"{shape} {precision} {workload}: {impl} {r['tokens_per_s']:.0f} tokens/s = "
                         f"{r['tokens_per_s'] / static['tokens_per_s']:.2f}x static")
        if workload == "shared-prefix":
            nocache = ok.get((shape, precision, "shared-prefix-nocache", impl))
            if nocache and nocache.get("ttft_p50_ms"):
                lines.append(f"{shape} {precision} shared-prefix: {impl} time to first token p50 "
                             f"{r['ttft_p50_ms']:.1f} ms = {r['ttft_p50_ms'] / nocache['ttft_p50_ms']:.2f}x "
                             "the run without prefix caching")
    return lines


def _transformers_rows(directory: str, dev: torch.device, dtype: torch.dtype, ws: list[Workload], record: Any) -> None:
    try:
        from transformers import AutoModelForCausalLM
        hf = AutoModelForCausalLM.from_pretrained(directory, dtype=dtype).to(dev).eval()
    except Exception as exc:
        for w in ws:
            record(w, lambda exc=exc: (_ for _ in ()).throw(exc))
        return
    for w in ws:
        if w.prefix_caching:
            record(w, lambda: run_transformers(hf, w, dev))
    del hf
    _reset_peak(dev)


def _fmt(v: Any, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def _line(row: dict[str, Any]) -> str:
    head = f"{row['shape']:5s} {row['precision']:5s} {row['workload']:22s} {row['impl']:15s}"
    if "error" in row:
        return f"{head} error: {row['error']}"
    return (f"{head} {row['tokens_per_s']:10.1f} tok/s  ttft p50 {_fmt(row.get('ttft_p50_ms'), '8.1f')} ms "
            f"p99 {_fmt(row.get('ttft_p99_ms'), '8.1f')} ms  peak {_fmt(row.get('peak_gb'), '.2f')} GB  "
            f"prefix hits {_fmt(row.get('prefix_hit_rate'), '.2f')}  preempted {row.get('preemptions', '-')}")


def main(args: Any) -> int:
    """Entry from ``opforge bench --suite serve`` (--shapes, --dtypes as precisions, --ops as
    workloads, --impls, --device, --quick, --json)."""
    try:
        result = run_serve_suite(split_list(args.shapes), args.device, split_list(args.dtypes),
                                 split_list(args.ops), split_list(args.impls), args.quick, args.json)
    except ValueError as exc:
        print(f"opforge bench: error: {exc}", file=sys.stderr)
        return 2
    return 1 if any(r.get("error") and r["impl"].startswith("opforge") for r in result["rows"]) else 0
