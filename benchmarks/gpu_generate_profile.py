"""Where do the microseconds between a graph-replayed decode step and ``generate`` go?

Session 6 measured the 1B model's graph-replayed step at 1204 us and ``generate``'s decode at
1244 us per token. This script times, for the Llama-1B shape at batch 1 (context 512, bf16 and
int4 with the head quantized), each layer of the difference:

1. ``step``: the plain decode step's graph, replayed back to back (seqlens not advanced).
2. ``greedy``: the greedy graph ``generate`` uses (step + argmax + lengths + next tokens),
   replayed back to back; its extra kernels timed alone (argmax over the vocabulary).
3. ``generate``: ``model.generate`` of 64 new tokens, decode seconds per token (median of 3).
4. a ``torch.profiler`` trace of one ``generate`` call: the GPU's kernel timeline, its idle gaps
   (count, sum, the largest with the kernels on either side) and the kernels outside the step.

    PYTHONPATH=src python3 benchmarks/gpu_generate_profile.py [--cpu-smoke]

Writes ``$OUT/generate_profile.json``.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from typing import Any

import torch

from gpu_decode_breakdown import write_results

RESULTS: dict[str, Any] = {"errors": []}


def events_us(fn, device: str, repeats: int = 30) -> float:
    """Median GPU time of fn() by events, back to back in groups of ``repeats``."""
    if device != "cuda":
        fn()
        return 0.0
    times = []
    for _ in range(3):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repeats):
            fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / repeats)
    return sorted(times)[1]


def captured(fn, device: str):
    """fn captured into a CUDA graph (after two warm-up runs on a side stream); returns replay."""
    if device != "cuda":
        return fn
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def timeline(prof) -> dict[str, Any]:
    """Kernel intervals of a profile: busy time, idle gaps and the largest gaps' neighbours."""
    kernels = []
    for evt in prof.events():
        if str(getattr(evt, "device_type", "")).endswith("CUDA") and evt.time_range.end > evt.time_range.start:
            kernels.append((evt.time_range.start, evt.time_range.end, evt.name[:60]))
    kernels.sort()
    if not kernels:
        return {"kernels": 0}
    gaps = []
    for (s0, e0, n0), (s1, e1, n1) in zip(kernels, kernels[1:]):
        if s1 > e0:
            gaps.append((s1 - e0, n0, n1))
    busy = sum(e - s for s, e, _ in kernels)
    span = kernels[-1][1] - kernels[0][0]
    big = sorted(gaps, reverse=True)[:12]
    hist = {f">{t}us": sum(1 for g in gaps if g[0] > t) for t in (1, 2, 5, 10, 20, 50)}
    return {"kernels": len(kernels), "span_us": span, "busy_us": busy, "idle_us": span - busy,
            "gap_hist": hist, "largest_gaps": [{"us": round(g, 1), "after": a, "before": b} for g, a, b in big]}


def profile_model(quant: str | None, device: str, smoke: bool) -> None:
    from opforge.models import load
    from opforge.models.generate import graph_step
    from opforge.models.testing import LLAMA_1B, TINY_LLAMA, write_random_checkpoint
    config = dict(TINY_LLAMA, vocab_size=256) if smoke else LLAMA_1B
    path = write_random_checkpoint(config, tempfile.mkdtemp(prefix="opforge-genprof-"), device, torch.bfloat16)
    kw = dict(group_size=32) if smoke else {}
    context, new = (24, 8) if smoke else (512, 64)
    model = load(path, device=device, dtype=torch.bfloat16, quantize=quant, quantize_head=quant is not None,
                 max_seq_len=context + new + 8, max_batch=1, **kw)
    label = quant or "bf16"
    entry: dict[str, Any] = {}
    prompt = torch.randint(0, config["vocab_size"], (1, context))
    model.generate(prompt, 4)                                   # compile, capture the greedy graph
    runs = []
    for _ in range(3):
        model.generate(prompt, new)
        runs.append(model.last_stats.decode_s / max(model.last_stats.new_tokens, 1))
    entry["generate_us_per_token"] = sorted(runs)[1] * 1e6
    model.prefill(prompt, torch.tensor([context]))
    tok = torch.zeros(1, dtype=torch.long, device=device)
    seqlens = model.cache_seqlens[:1]
    entry["step_graph_us"] = events_us(captured(lambda: model.decode_step(tok, seqlens), device), device)
    logits = model.decode_step(tok, seqlens)
    entry["argmax_graph_us"] = events_us(captured(lambda: logits.argmax(-1), device), device, 100)
    from opforge.models.generate import argmax_rows
    low = logits.to(model.dtype)
    entry["argmax_rows_graph_us"] = events_us(captured(lambda: argmax_rows(low), device), device, 100)
    entry["float_cast_graph_us"] = events_us(captured(lambda: logits.to(torch.bfloat16).float(), device), device, 100)
    if device == "cuda":
        step = graph_step(model, 1, greedy=True)
        seqlens.fill_(context)
        entry["greedy_graph_us"] = events_us(step.advance, device, repeats=16)   # 48 tokens, inside the cache
        seqlens.fill_(context)
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            model.generate(prompt, new)
            torch.cuda.synchronize()
        entry["generate_timeline"] = timeline(prof)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(4):
                step.advance()
            torch.cuda.synchronize()
        entry["greedy_timeline"] = timeline(prof)
        names: dict[str, list] = {}
        for evt in prof.key_averages():
            dev_us = getattr(evt, "device_time_total", None) or getattr(evt, "cuda_time_total", 0)
            if dev_us and evt.count:
                names[evt.key[:70]] = [round(dev_us / 4, 1), evt.count / 4]
        entry["greedy_kernels_per_step"] = dict(sorted(names.items(), key=lambda kv: -kv[1][0]))
    RESULTS[label] = entry
    print(f"{label}: generate {entry['generate_us_per_token']:.0f} us/token, step graph {entry['step_graph_us']:.0f}, "
          f"greedy graph {entry.get('greedy_graph_us', 0):.0f}, argmax {entry['argmax_graph_us']:.1f} "
          f"(two-stage, model dtype {entry['argmax_rows_graph_us']:.1f}), "
          f"cast {entry['float_cast_graph_us']:.1f}", flush=True)
    for key in ("generate_timeline", "greedy_timeline"):
        t = entry.get(key)
        if t:
            print(f"   {key}: {t['kernels']} kernels, span {t['span_us']:.0f} us, idle {t['idle_us']:.0f} us, "
                  f"gaps {t['gap_hist']}", flush=True)
            for g in t["largest_gaps"][:6]:
                print(f"      {g['us']:8.1f} us after {g['after']} before {g['before']}", flush=True)
    del model


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cpu-smoke", action="store_true")
    parser.add_argument("--out", default=os.environ.get("OUT", "./gpu-out"))
    args = parser.parse_args()
    smoke = args.cpu_smoke or not torch.cuda.is_available()
    device = "cpu" if smoke else "cuda"
    t0 = time.time()
    for quant in (None, "int4"):
        try:
            profile_model(quant, device, smoke)
        except Exception as exc:   # a failure is a result
            RESULTS["errors"].append(f"{quant or 'bf16'}: {type(exc).__name__}: {str(exc)[:300]}")
            print(RESULTS["errors"][-1], flush=True)
        if device == "cuda":
            torch.cuda.empty_cache()
    RESULTS["seconds"] = time.time() - t0
    return write_results(RESULTS, args.out, "generate_profile.json", smoke)


if __name__ == "__main__":
    sys.exit(main())
