"""Where does a batch-1 decode step's time go, and which GEMV launch choices read weights fastest?

Parts (``--part``; default all but ``attn``):

1. ``step``: the Llama-1B-shaped model (random weights, bf16 and int4), one decode step run
   eagerly under ``torch.profiler``: GPU time per kernel name per step, the sum of kernels, and
   the CUDA-graph replay time of the same step (the difference is the gaps between kernels).
2. ``sweep``: the decode GEMVs in the setting they run in: a CUDA graph of L launches over L
   different weights (L copies of >= 160 MB in all, so nothing stays in the 50 MB L2), same x,
   M = 1. Per shape of the 1B and 8B models: cuBLAS bf16 ``F.linear``, opforge's dense GEMV
   (``ops/quant/dense_gemv.py``) in several configs, opforge int4 g128 as ``linear`` runs it and
   in several launch configs, opforge int8 per-channel, torch's int4 tinygemm. Every variant's
   first output is checked against float64 first. Time per launch = graph replay / L.
   ``--rows 8,16``: the same for batched decode (GEMV tiles with BLOCK_M rows, tl.dot tiles).
3. ``models``: the 1B model's graph-replayed decode step under each launch setting.
4. ``attn``: decode attention at batch 1 by forced split count, in the same graph setting.

    PYTHONPATH=src python3 benchmarks/tools/gpu_decode_breakdown.py              # ~2-3 min on an H100
    PYTHONPATH=src python3 benchmarks/tools/gpu_decode_breakdown.py --part sweep --rows 8,16   # batched decode
    PYTHONPATH=src python3 benchmarks/tools/gpu_decode_breakdown.py --part attn   # decode attention by split count
    PYTHONPATH=src python3 benchmarks/tools/gpu_decode_breakdown.py --cpu-smoke  # the script's logic

Writes ``$OUT/decode_breakdown.json``.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from typing import Any, Callable, Optional

if "--cpu-smoke" in sys.argv:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch

import opforge
from gpu_check_quant import oracle, tinygemm_pack
from opforge.ops.quant import problem as qproblem
from opforge.ops.quant import triton_kernels as qk
from opforge.ops.quant.dense_gemv import dense_gemv
from opforge.testing import rel_error

RESULTS: dict[str, Any] = {"step": {}, "sweep": [], "errors": []}
SHAPES_1B = [(3072, 2048, "1B qkv"), (2048, 2048, "1B o"), (16384, 2048, "1B gate_up"), (2048, 8192, "1B down"),
             (128256, 2048, "1B lm_head")]
SHAPES_8B = [(6144, 4096, "8B qkv"), (4096, 4096, "8B o"), (28672, 4096, "8B gate_up"), (4096, 14336, "8B down")]
#: (BLOCK_N, BLOCK_K, warps, programs per SM); None: ``dense_gemv.config_for``'s choice
DENSE_CONFIGS = [None, (8, 1024, 4, 4), (4, 2048, 4, 4), (8, 2048, 8, 4), (16, 1024, 8, 4), (4, 1024, 2, 4),
                 (8, 1024, 4, 1), (16, 512, 4, 4), (32, 256, 4, 2)]
#: ((BLOCK_M, BLOCK_N, BLOCK_K, dot, warps, stages), programs per SM, fixup)
INT4_CONFIGS = [((1, 16, 2048, False, 4, 1), 4, True), ((1, 16, 2048, False, 4, 1), 1, True),
                ((1, 8, 2048, False, 4, 1), 4, True), ((1, 32, 1024, False, 4, 1), 4, True),
                ((1, 32, 2048, False, 8, 1), 4, True), ((1, 64, 1024, False, 8, 1), 4, True),
                ((1, 8, 1024, False, 2, 1), 4, True), ((1, 16, 1024, False, 4, 1), 4, True),
                ((1, 16, 2048, False, 4, 1), 4, False), ((1, 128, 128, False, 4, 3), 4, True)]
INT8_CONFIGS = [((1, 16, 1024, False, 4, 1), 4, False), ((1, 16, 1024, False, 4, 1), 4, True),
                ((1, 8, 1024, False, 4, 1), 4, False), ((1, 32, 512, False, 4, 1), 4, False),
                ((1, 16, 512, False, 4, 1), 4, False), ((1, 32, 1024, False, 8, 1), 4, False),
                ((1, 16, 1024, False, 4, 1), 1, False)]

#: For ``--rows M`` > 1 (batched decode): ((BLOCK_M, BLOCK_N, BLOCK_K, dot, warps, stages), programs
#: per SM, fixup, join, swap). BLOCK_M 0 stands for the power of two >= M (the GEMV kernel,
#: M <= 16; small BLOCK_N keeps its 3-D tiles in registers: 72-168 registers, no spills for sm_90
#: per benchmarks/tools/quant_ptx.py), then tl.dot tiles, plain and in the JOIN (int4: codes unpacked
#: through tl.join) and SWAP (weight as the MMA's first operand) forms. The first sweep at f515a1a
#: (results/h100/2026-11-23-f515a1a/run1) had GEMV tiles for M 8/16 (3-5x slower) and a per-code-position
#: dot form (slower than SWAP); this list is its second sweep, plus the non-swapped JOIN tiles
#: that led at M = 64 on the largest shapes (to run next).
ROWS_CONFIGS = [((16, 64, 128, True, 4, 3), 4, False, False, True), ((16, 64, 128, True, 4, 3), 4, False, True, True),
                ((16, 128, 128, True, 4, 3), 4, False, True, True), ((16, 32, 128, True, 4, 3), 4, False, True, True),
                ((16, 64, 128, True, 8, 3), 4, False, True, True), ((16, 64, 128, True, 4, 4), 4, False, True, True),
                ((16, 128, 128, True, 4, 3), 4, False, True, False), ((16, 64, 128, True, 4, 3), 2, False, True, True),
                # for M 33..64 (the f515a1a lead): non-swapped JOIN tiles, wider and with 8 warps
                ((16, 128, 128, True, 8, 3), 4, False, True, False), ((16, 256, 128, True, 8, 3), 4, False, True, False),
                ((16, 128, 128, True, 4, 4), 4, False, True, False)]
DENSE_ROWS_CONFIGS = [(2, 1024, 4, 4), (4, 512, 4, 4), (4, 256, 4, 4)]


def rows_configs(m: int, bits: int) -> list:
    """ROWS_CONFIGS for M rows: BLOCK_M filled in, GEMV tiles only up to 16 rows, the dot tiles'
    BLOCK_M the power of two >= M (16 at least), JOIN only for int4."""
    block_m = 1 << (m - 1).bit_length()
    out = []
    for cfg, pps, fix, join, swap in ROWS_CONFIGS:
        if cfg[3] is False:
            if block_m > 16:
                continue
            cfg = (block_m,) + cfg[1:]
            fix = fix and bits == 4
        else:
            if join and bits != 4:
                continue
            cfg = (max(16, block_m),) + cfg[1:]
        out.append((cfg, pps, fix, join, swap))
    return out


def flagged(module: Any, name: str, value: Any, fn: Callable[[], Any]) -> Any:
    """fn() with ``module.name`` set to value (restored after)."""
    old = getattr(module, name)
    setattr(module, name, value)
    try:
        return fn()
    finally:
        setattr(module, name, old)


def graph_us(fns: list[Callable[[], Any]], replays: int = 20) -> float:
    """GPU time per launch of a CUDA graph that runs every fn once (after warm-up outside it)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for fn in fns[:2]:
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for fn in fns:
            fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(3):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / (replays * len(fns)))
    return sorted(times)[1]


def check_then_time(row: dict, label: str, name: str, fns: list, first_out: Callable[[], torch.Tensor],
                    want: torch.Tensor, device: str) -> None:
    """``first_out()`` against float64 ``want`` into ``row["rel_err"]``, then (if within 2e-2) the
    graph time per launch of ``fns`` into ``row["us"]``; a failure is a result in RESULTS["errors"]."""
    try:
        err = rel_error(first_out(), want)
        row["rel_err"][name] = err
        if not err < 2e-2:
            RESULTS["errors"].append(f"{label} {name}: rel err {err:.3g}")
            return
        row["us"][name] = graph_us(fns) if device == "cuda" else 0.0
    except Exception as exc:   # a config that fails to compile is a result, not the end of the run
        RESULTS["errors"].append(f"{label} {name}: {type(exc).__name__}: {str(exc)[:200]}")


def copies_for(nbytes: int, smoke: bool) -> int:
    return 2 if smoke else max(2, math.ceil(160e6 / nbytes))


def sweep_shape(n: int, k: int, label: str, device: str, smoke: bool, deadline: float, m: int = 1) -> None:
    gen = torch.Generator(device=device).manual_seed(n * 7 + k)
    x = torch.randn(m, k, device=device, dtype=torch.bfloat16, generator=gen)
    row: dict[str, Any] = {"shape": label, "n": n, "k": k, "m": m, "us": {}, "rel_err": {}}
    dense_l = copies_for(n * k * 2, smoke)
    dense = [torch.randn(n, k, device=device, dtype=torch.bfloat16, generator=gen) * 0.02 for _ in range(dense_l)]
    ref = x.double() @ dense[0].double().T

    def timed(name: str, fns: list, first_out: Callable[[], torch.Tensor], want: torch.Tensor) -> None:
        if time.time() <= deadline:
            check_then_time(row, label, name, fns, first_out, want, device)

    timed("cublas bf16", [lambda w=w: torch.nn.functional.linear(x, w) for w in dense],
          lambda: torch.nn.functional.linear(x, dense[0]), ref)
    for cfg in (DENSE_CONFIGS if m == 1 else DENSE_ROWS_CONFIGS if m <= 16 else []):
        timed(f"dense gemv {cfg or 'rule'}", [lambda w=w, c=cfg: dense_gemv(x, w, config=c) for w in dense],
              lambda c=cfg: dense_gemv(x, dense[0], config=c), ref)
    del dense
    for bits, configs in ((4, INT4_CONFIGS if m == 1 else rows_configs(m, 4)),
                          (8, INT8_CONFIGS if m == 1 else rows_configs(m, 8))):
        group, sym = (128, False) if bits == 4 else (-1, True)
        n_copies = copies_for(n * k * bits // 8, smoke)
        qs = [opforge.quantize_weight(torch.randn(n, k, device=device, dtype=torch.bfloat16, generator=gen) * 0.02,
                                      bits=bits, group_size=group, symmetric=sym) for _ in range(n_copies)]
        want = oracle(x, qs[0])
        calls = [qproblem.prepare(x, q, None) for q in qs]
        fns = [lambda q=q: opforge.linear(x, q) for q in qs]
        if device == "cuda":
            # untimed: the first timing over a fresh weight set read 5-9% slow on the largest shape
            # (fed7445, a timing probe: 1B lm_head int8 98.1 us, then 93.0 and 93.0)
            graph_us(fns)
        timed(f"int{bits} linear", fns, lambda: opforge.linear(x, qs[0]), want)
        if m > 16:   # the prefill variant's other path: dequantize once, then cuBLAS
            timed(f"int{bits} dequant+cublas", [lambda c=c: qk.launch_dequant_gemm(c) for c in calls],
                  lambda: qk.launch_dequant_gemm(calls[0]), want)
        for cfg, pps, fix, *form in configs:
            join, swap = form or (False, False)
            kind = "" if m == 1 else (f" dot{cfg[0]}" if cfg[3] else f" gemv{cfg[0]}")
            kind += (" join" if join else "") + (" swap" if swap else "")
            name = f"int{bits}{kind} {cfg[1:3]} w{cfg[4]} s{cfg[5]} pps{pps}{' fixup' if fix else ' combine'}"
            kw = {"programs_per_sm": pps, "fixup": fix, "join": join, "swap": swap}
            timed(name, [lambda c=c, cfg=cfg, kw=kw: qk.launch_config(c, cfg, **kw) for c in calls],
                  lambda cfg=cfg, kw=kw: qk.launch_config(calls[0], cfg, **kw), want)
        if device == "cuda" and bits == 4:
            try:
                packs = [tinygemm_pack(q)[0] for q in qs]
                timed("tinygemm int4", [lambda p=p: p(x) for p in packs], lambda: packs[0](x), want)
            except Exception as exc:
                RESULTS["errors"].append(f"{label} tinygemm: {exc}"[:300])
        del qs, calls, fns
    base = row["us"].get("cublas bf16")
    line = "  ".join(f"{name} {us:.1f}" for name, us in sorted(row["us"].items(), key=lambda kv: kv[1])[:8])
    print(f"{label} ({n}x{k}) M={m} bf16 {base}: {line}", flush=True)
    RESULTS["sweep"].append(row)
    if device == "cuda":
        torch.cuda.empty_cache()


#: decode attention, batch 1: (label, Hq, Hkv, D, cache capacity S_max, tokens in the cache)
ATTN_CASES = [("1B ctx512 cap1024", 32, 8, 64, 1024, 512), ("1B ctx512 cap4096", 32, 8, 64, 4096, 512),
              ("1B ctx4096", 32, 8, 64, 4096, 4096), ("8B ctx512 cap4096", 32, 8, 128, 4096, 512),
              ("8B ctx4096", 32, 8, 128, 4096, 4096)]
#: (forced split count or None for the heuristic, slices by the tokens in the cache). at f515a1a
#: swept split counts by capacity and by length (results/h100/2026-11-23-f515a1a/run1), then partials
#: merged by the last split in the split kernel instead of a merge kernel (run 3: 1.6-1.8x slower;
#: the merge kernel stayed).
ATTN_SPLITS = [None, 8, 16, 32]


def attention_splits(device: str, smoke: bool, deadline: float) -> None:
    """Decode attention at batch 1 as a decode step runs it (a CUDA graph over one cache per layer,
    L2-cold), by forced split count (None: the heuristic, slices that divide the tokens in the
    cache). Each split count checked against float64 first."""
    from opforge.ops.attention import reference
    from opforge.ops.attention import triton_kernels as ak
    from opforge.ops.attention.problem import prepare_decode
    out = RESULTS.setdefault("attention", [])
    cases = [("smoke", 4, 2, 16, 64, 40)] if smoke else ATTN_CASES
    for label, hq, hkv, d, cap, length in cases:
        gen = torch.Generator(device=device).manual_seed(cap + d)
        layers = copies_for(2 * hkv * cap * d * 2, smoke)
        caches = [(torch.randn(1, hkv, cap, d, device=device, dtype=torch.bfloat16, generator=gen),
                   torch.randn(1, hkv, cap, d, device=device, dtype=torch.bfloat16, generator=gen))
                  for _ in range(layers)]
        q = torch.randn(1, hq, 1, d, device=device, dtype=torch.bfloat16, generator=gen)
        lens = torch.tensor([length], device=device, dtype=torch.int32)
        calls = [prepare_decode(q, k, v, lens, None) for k, v in caches]
        want = reference.decode_attention(q.double(), caches[0][0].double(), caches[0][1].double(), lens)
        row: dict[str, Any] = {"case": label, "us": {}, "rel_err": {}}
        for splits in ATTN_SPLITS:
            if time.time() > deadline:
                break
            name = f"splits={splits or 'default'}"
            kw = {"splits": splits}
            check_then_time(row, f"attention {label}", name,
                            [lambda c=c, kw=kw: ak.launch_decode(c, **kw) for c in calls],
                            lambda kw=kw: ak.launch_decode(calls[0], **kw), want, device)
        print(f"attention {label}: " + "  ".join(f"{k} {v:.1f}" for k, v in row["us"].items()), flush=True)
        out.append(row)
        del caches, calls


def step_breakdown(device: str, smoke: bool, shape: str = "1b", quants: tuple = (None, "int4")) -> None:
    from torch.profiler import ProfilerActivity, profile

    from opforge.models import load
    from opforge.models.testing import LLAMA_1B, LLAMA_8B, TINY_LLAMA, write_random_checkpoint
    config = dict(TINY_LLAMA, vocab_size=256) if smoke else LLAMA_8B if shape == "8b" else LLAMA_1B
    path = write_random_checkpoint(config, tempfile.mkdtemp(prefix="opforge-breakdown-"), device, torch.bfloat16)
    for quant in quants:
        kw = dict(group_size=32) if smoke and quant else {}
        model = load(path, device=device, dtype=torch.bfloat16, quantize=quant, max_seq_len=1024, max_batch=1, **kw)
        ids = torch.randint(0, config["vocab_size"], (1, 512), device=device)
        model.prefill(ids, torch.tensor([512]))
        tok = ids[:, -1].clone()
        seqlens = model.cache_seqlens[:1]
        step = lambda: model.decode_step(tok, seqlens)     # noqa: E731  (seqlens not advanced: same step)
        for _ in range(3):
            step()
        entry: dict[str, Any] = {}
        if device == "cuda":
            torch.cuda.synchronize()
            entry["graph_step_us"] = graph_us([step], replays=50)
            steps = 5
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(steps):
                    step()
                torch.cuda.synchronize()
            kernels = {}
            for evt in prof.key_averages():
                dev_us = getattr(evt, "device_time_total", None) or getattr(evt, "cuda_time_total", 0)
                if dev_us and evt.count:
                    kernels[evt.key[:90]] = (dev_us / steps, evt.count / steps)
            entry["kernels_us_per_step"] = {k: round(v[0], 1) for k, v in
                                            sorted(kernels.items(), key=lambda kv: -kv[1][0])}
            entry["launches_per_step"] = {k: v[1] for k, v in kernels.items()}
            entry["kernel_sum_us"] = sum(v[0] for v in kernels.values())
            print(f"step {quant or 'bf16'}: graph {entry['graph_step_us']:.0f} us, kernels "
                  f"{entry['kernel_sum_us']:.0f} us, {sum(v[1] for v in kernels.values()):.0f} launches", flush=True)
            for name, us in list(entry["kernels_us_per_step"].items())[:14]:
                print(f"   {us:8.1f} us x{entry['launches_per_step'][name]:.0f}  {name}", flush=True)
        else:
            step()
        RESULTS["step"][f"{shape} {quant or 'bf16'}"] = entry
        del model
        if device == "cuda":
            torch.cuda.empty_cache()


def model_variants(device: str, smoke: bool) -> None:
    """The 1B model's decode step (graph replay, a 4096-token cache holding 512) at batch 1 and 8
    under each launch setting: the defaults, then the f515a1a changes off (decode attention's
    slices by length; the swapped dot tiles and the int4 JOIN unpack, batch 8 only)."""
    from opforge.models import load
    from opforge.models.testing import LLAMA_1B, TINY_LLAMA, write_random_checkpoint
    from opforge.ops.attention import triton_kernels as ak
    config = dict(TINY_LLAMA, vocab_size=256) if smoke else LLAMA_1B
    path = write_random_checkpoint(config, tempfile.mkdtemp(prefix="opforge-variants-"), device, torch.bfloat16)
    out = RESULTS.setdefault("models", {})
    for batch in (1, 8):
        for quant, head in ((None, False), ("int4", True), ("int8", True)):
            kw = dict(group_size=32) if smoke else {}
            model = load(path, device=device, dtype=torch.bfloat16, quantize=quant, quantize_head=head,
                         max_seq_len=4096, max_batch=batch, **kw)
            ids = torch.randint(0, config["vocab_size"], (batch, 512), device=device)
            model.prefill(ids, torch.tensor([512] * batch))
            tok, seqlens = ids[:, -1].clone(), model.cache_seqlens[:batch]
            ref = model.decode_step(tok, seqlens)
            variants = [("default", ())]
            for name, flags in variants:
                label = f"b{batch} {quant or 'bf16'}{' head' if head else ''} {name}"

                def run() -> None:
                    logits = model.decode_step(tok, seqlens)
                    err = rel_error(logits, ref)
                    us = graph_us([lambda: model.decode_step(tok, seqlens)], replays=30) if device == "cuda" else 0.0
                    out[label] = {"step_us": us, "tokens_per_s": batch * 1e6 / us if us else 0.0,
                                  "logits_rel_vs_default": err, "weight_bytes": model.weight_bytes()}
                    print(f"model {label}: step {us:.0f} us = {batch * 1e6 / max(us, 1e-9):.0f} tokens/s, logits vs "
                          f"the default {err:.2e}, weights {model.weight_bytes() / 1e9:.2f} GB", flush=True)
                fn = run
                for module, attr, value in flags:
                    fn = (lambda f, m, a, v: lambda: flagged(m, a, v, f))(fn, module, attr, value)
                try:
                    fn()
                except Exception as exc:
                    RESULTS["errors"].append(f"model {label}: {type(exc).__name__}: {str(exc)[:300]}")
            del model
            if device == "cuda":
                torch.cuda.empty_cache()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cpu-smoke", action="store_true")
    parser.add_argument("--part", choices=("step", "sweep", "models", "attn", "all"), default="all")
    parser.add_argument("--budget", type=float, default=200.0, help="seconds for the sweep part")
    parser.add_argument("--shape", choices=("1b", "8b"), default="1b", help="model shape of the step part")
    parser.add_argument("--quants", default="bf16,int4", help="precisions of the step part, e.g. bf16,int8")
    parser.add_argument("--rows", default="1", help="comma-separated M (rows of x) for the sweep, e.g. 1,8,16")
    parser.add_argument("--out", default=os.environ.get("OUT", "./gpu-out"))
    args = parser.parse_args()
    smoke = args.cpu_smoke or not torch.cuda.is_available()
    device = "cpu" if smoke else "cuda"
    RESULTS["device"] = "cpu smoke" if smoke else torch.cuda.get_device_name()
    if args.part in ("step", "all"):
        quants = tuple(None if q == "bf16" else q for q in args.quants.split(","))
        step_breakdown(device, smoke, args.shape, quants)
    if args.part in ("models", "all"):
        model_variants(device, smoke)
    if args.part == "attn":
        attention_splits(device, smoke, time.time() + args.budget)
    if args.part in ("sweep", "all"):
        deadline = time.time() + args.budget
        shapes = [(64, 256, "smoke")] if smoke else SHAPES_1B + SHAPES_8B
        if smoke:
            DENSE_CONFIGS[:] = [(16, 64, 1, 1), (8, 128, 1, 2)]
            del INT4_CONFIGS[1:], INT8_CONFIGS[1:]
            INT4_CONFIGS[0] = INT8_CONFIGS[0] = ((1, 16, 256, False, 4, 1), 4, True)
            ROWS_CONFIGS[:] = [((0, 8, 256, False, 4, 1), 4, True, False, False),
                               ((16, 64, 128, True, 4, 3), 4, False, False, False),
                               ((16, 64, 128, True, 4, 3), 4, False, True, True)]
            DENSE_ROWS_CONFIGS[:] = [(4, 64, 1, 2)]
        for m in (int(v) for v in args.rows.split(",")):
            for n, k, label in shapes:
                sweep_shape(n, k, label, device, smoke, deadline, m)
    return write_results(RESULTS, args.out, "decode_breakdown.json", smoke)


def write_json(obj: Any, name: str, out_dir: Optional[str] = None) -> None:
    """``obj`` as JSON in ``out_dir/name`` (default: $OUT, else ./gpu-out), the folder made if missing."""
    out_dir = out_dir or os.environ.get("OUT", "./gpu-out")
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, name), "w") as f:
        json.dump(obj, f, indent=1)


def write_results(results: dict, out_dir: str, name: str, smoke: bool) -> int:
    """Write ``results`` as JSON to ``out_dir/name``, print its errors; the exit code (a CPU smoke
    run fails on any error, a GPU run reports them as results)."""
    write_json(results, name, out_dir)
    print("errors:", results["errors"] or "none")
    return 1 if results["errors"] and smoke else 0


if __name__ == "__main__":
    sys.exit(main())
