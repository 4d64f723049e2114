"""Why is ``opforge.linear`` slow end to end at the smaller shapes? (session 4's open question)

Session 4 measured 4096x4096 int4 M=1 at 123-145 us through ``opforge.linear`` under do_bench
(L2 flushed) where the same kernel took 13 us in a kernel-only sweep and 15.6 us end to end in
session 3, while the large shapes matched. For a few small cases this script times the same
call five ways and profiles it, so one GPU run can tell host time, a stall and kernel time apart:

1. ``do_bench`` with its L2 flush (how gpu_check_quant times), median;
2. ``do_bench`` of the variant's launch function on a prepared call (no validation, selection);
3. CUDA-graph replay of ``opforge.linear`` (GPU time only: no host, no allocation);
4. wall time per call in a loop of 200 (host-bound when the GPU work is short);
5. ``torch.profiler`` over 50 calls: each CUDA kernel's mean time, and every CUDA runtime call
   other than kernel launches (a synchronize, a malloc or a memcpy there is a stall).

Each output is checked against float64 first (NaN-poisoned). Run on the GPU machine:

    PYTHONPATH=src python3 benchmarks/gpu_profile_quant.py            # ~30 s on an H100
    PYTHONPATH=src python3 benchmarks/gpu_profile_quant.py --cpu-smoke  # the script's logic only

Writes ``$OUT/quant_profile.json``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any, Callable

if "--cpu-smoke" in sys.argv:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch

import opforge
from gpu_check_quant import oracle, pick_device
from gpu_decode_breakdown import graph_us
from opforge.runtime import alloc
from opforge.testing import TOLERANCE, rel_error

#: (N, K, M, bits, group_size, symmetric): the cases session 4 found slow, and one that was not
CASES = [(4096, 4096, 1, 4, 128, False), (4096, 4096, 16, 8, -1, True), (4096, 4096, 4, 4, 128, False),
         (14336, 4096, 1, 4, 128, False)]
SMOKE_CASES = [(64, 256, 1, 4, 128, False), (64, 256, 16, 8, -1, True)]


def _launch_of(x: torch.Tensor, qw: opforge.QuantizedWeight) -> Callable[[], Any]:
    """The selected variant's launch function bound to a prepared call (what opforge.linear runs
    after validation and selection)."""
    from opforge.ops.quant import problem
    from opforge.runtime import registry
    call = problem.prepare(x, qw, None)
    variant = registry.select("linear", call.problem, call.problem.device_type).variant
    return lambda: variant.launch(call)


def _graph_us(fn: Callable[[], Any], replays: int = 100) -> float:
    return graph_us([fn], replays)


def _wall_us(fn: Callable[[], Any], device: str, calls: int = 200) -> float:
    fn()
    if device == "cuda":
        torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - t) * 1e6 / calls


def _profile(fn: Callable[[], Any], calls: int = 50) -> dict[str, Any]:
    """Mean CUDA time per kernel, and counts of the CUDA runtime/driver calls that are not launches."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    kernels, runtime = {}, {}
    for e in prof.key_averages():
        name = e.key
        device_us = getattr(e, "device_time_total", None)
        device_us = getattr(e, "cuda_time_total", 0) if device_us is None else device_us
        on_device = str(getattr(e, "device_type", "")).endswith("CUDA") or (device_us > 0 and e.cpu_time_total == 0)
        if on_device and e.count:
            kernels[name[:80]] = {"count": e.count, "mean_us": device_us / e.count}
        elif name.startswith(("cuda", "cu")) and "LaunchKernel" not in name and "launchKernel" not in name:
            runtime[name] = {"count": e.count, "cpu_us_total": e.cpu_time_total}
    return {"kernels": kernels, "runtime_calls": runtime}


def run_case(case: tuple, device: str, results: list) -> None:
    n, k, m, bits, group, symmetric = case
    label = f"{n}x{k} M={m} int{bits} g{group}{' sym' if symmetric else ''}"
    w = torch.randn(n, k, device=device)
    qw = opforge.quantize_weight(w, bits, group, symmetric=symmetric)
    x = torch.randn(m, k, device=device, dtype=torch.bfloat16)
    row: dict[str, Any] = {"case": label}
    with alloc.poisoned_outputs():
        y = opforge.linear(x, qw)
    err = rel_error(y, oracle(x, qw))
    row["rel_err"], row["ok"] = err, err < TOLERANCE[torch.bfloat16]
    public = lambda: opforge.linear(x, qw)  # noqa: E731
    direct = _launch_of(x, qw)
    if device == "cuda":
        from triton.testing import do_bench
        row["do_bench_public_us"] = do_bench(public, warmup=25, rep=100, return_mode="median") * 1e3
        row["do_bench_direct_us"] = do_bench(direct, warmup=25, rep=100, return_mode="median") * 1e3
        row["graph_us"] = _graph_us(public)
        row["profile"] = _profile(public)
    row["wall_public_us"] = _wall_us(public, device, 200 if device == "cuda" else 3)
    row["wall_direct_us"] = _wall_us(direct, device, 200 if device == "cuda" else 3)
    results.append(row)
    timings = "  ".join(f"{key[:-3]} {row[key]:.1f}" for key in row if key.endswith("_us"))
    print(f"{'PASS' if row['ok'] else 'FAIL'}  {label:32s} err {err:.1e}  {timings}", flush=True)
    for name, r in row.get("profile", {}).get("runtime_calls", {}).items():
        print(f"      runtime {name:40s} x{r['count']}  {r['cpu_us_total']:.0f} us total", flush=True)
    for name, r in row.get("profile", {}).get("kernels", {}).items():
        print(f"      kernel  {name:60s} x{r['count']}  {r['mean_us']:.1f} us", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny shapes on the CPU through the interpreter")
    ap.add_argument("--out", default=os.environ.get("OUT", "./gpu-out"))
    args = ap.parse_args()
    device = pick_device(args.cpu_smoke)
    if device is None:
        return 2
    torch.manual_seed(0)
    results: list = []
    with opforge.backend("triton"):  # the Triton kernels (on CPU through the interpreter)
        for case in SMOKE_CASES if args.cpu_smoke else CASES:
            run_case(case, device, results)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "quant_profile.json")
    with open(path, "w") as f:
        json.dump({"device": str(opforge.device_info()), "torch": torch.__version__, "results": results}, f,
                  indent=1, default=str)
    print(f"wrote {path}")
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
