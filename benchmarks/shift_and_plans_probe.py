"""Two measurements of session 2, in one GPU run:

1. Host time per small call with and without launch plans (runtime/plans.py), beside torch eager
   and the floor (allocate the output, launch the compiled kernel with raw addresses).
2. Layer norm's shift: the mean of the row's first SAMPLE values (SAMPLE > 0) against the old
   full-row (or first-chunk) mean (SAMPLE = 0), per variant, as % of the measured copy bandwidth.

    PYTHONPATH=src python3 benchmarks/shift_and_plans_probe.py [--out DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
import torch.nn.functional as F
import triton
from triton.testing import do_bench

import opforge
from opforge.ops.norm import cases, triton_kernels as tk
from opforge.ops.norm.problem import prepare
from opforge.runtime import launch, plans
from opforge.runtime.device import measure_copy_bandwidth
from opforge.runtime.launch import cdiv
from opforge.testing import TOLERANCE, max_rel_error

SMALL = [(2, 32, 256), (8, 128, 768), (1, 1, 4096)]
LLM = [(32768, 1024), (16384, 4096), (8192, 8192), (4096, 16384), (2048, 32768), (1024, 65536), (262144, 128)]


def wall_us(fns: dict, calls: int = 1000, rounds: int = 7) -> dict:
    """Median over rounds of the wall time per call of a loop of calls (one sync per loop);
    implementations interleaved round by round so host noise hits all alike."""
    samples = {k: [] for k in fns}
    for fn in fns.values():
        for _ in range(50):
            fn()
    torch.cuda.synchronize()
    for _ in range(rounds):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            torch.cuda.synchronize()
            samples[name].append((time.perf_counter() - t0) / calls * 1e6)
    return {k: statistics.median(v) for k, v in samples.items()}


def overhead(results: dict) -> None:
    print("\n== host time per call (us, median of 7 interleaved loops of 1000) ==")
    for shape in SMALL:
        n = shape[-1]
        for dtype in (torch.bfloat16, torch.float32):
            x = torch.randn(shape, device="cuda", dtype=dtype)
            r = torch.randn_like(x)
            w = torch.randn(n, device="cuda", dtype=dtype)
            b = torch.randn(n, device="cuda", dtype=dtype)
            call = prepare("layer_norm", x, None, w, b, 1e-5)
            tk.launch_multirow(call) if n <= 1024 else tk.launch_row(call)
            p = call.problem
            if n <= 1024:
                bm, bn, warps = tk.multirow_config(n, x.element_size())
                config, consts, grid = (bm, bn, warps), (bm, bn, tk.SHIFT_SAMPLE), cdiv(p.rows, bm)
            else:
                bm, bn, warps = tk.row_config(n, x.element_size(), False)
                config, consts, grid = (bm, bn, warps), (bm, bn, tk.SHIFT_SAMPLE), p.rows
            key = (config, consts, p.op, p.key, 0, 0, n & 15, 0, n & 15)  # as triton_kernels._launch keys it
            go = tk._tile.raw_launcher(key)
            tail = (p.rows, n, p.rows, 0, n, p.rows, 0, n, 1e-5, False, False, True, True) + consts

            def floor():
                y = torch.empty_like(x)
                xp, yp = x.data_ptr(), y.data_ptr()
                go(grid, (xp, xp, yp, yp, w.data_ptr(), b.data_ptr()) + tail, 0)
                return y

            fns = {
                "eager layer_norm": lambda: F.layer_norm(x, (n,), w, b, 1e-5),
                "opforge layer_norm": lambda: opforge.layer_norm(x, w, b),
                "eager rms_norm": lambda: F.rms_norm(x, (n,), w, 1e-6),
                "opforge rms_norm": lambda: opforge.rms_norm(x, w),
                "eager add_rms_norm": lambda: (F.rms_norm(x + r, (n,), w, 1e-6)),
                "opforge add_rms_norm": lambda: opforge.add_rms_norm(x, r, w),
            }
            if go is not None:
                fns["floor (alloc + raw launch)"] = floor
            else:
                print("  floor not measured: no compiled kernel under the expected key")
            plans.set_enabled(True)
            with_plans = wall_us(fns)
            direct = launch.c_launch(tk._tile._compiled[key][2]) is not None if go is not None else None
            real_c_launch = launch.c_launch
            launch.c_launch = lambda run: None  # plans through Triton's Python wrapper
            plans.set_enabled(True)
            wrapped = wall_us({k: v for k, v in fns.items() if k.startswith("opforge")})
            launch.c_launch = real_c_launch
            plans.set_enabled(False)
            without = wall_us({k: v for k, v in fns.items() if k.startswith("opforge")})
            row = {"shape": list(shape), "dtype": str(dtype), "plans": with_plans, "plans_via_wrapper": wrapped,
                   "no_plans": without, "c_launch_active": direct}
            results["overhead"].append(row)
            line = "  ".join(f"{k} {v:5.1f}" for k, v in with_plans.items())
            line2 = "  ".join(f"{k} {v:5.1f}" for k, v in without.items())
            line3 = "  ".join(f"{k} {v:5.1f}" for k, v in wrapped.items())
            print(f"{str(shape):14s} {str(dtype)[6:]:9s} {line}  (C launch direct: {direct})\n"
                  f"{'':24s} plans via Triton's wrapper: {line3}\n{'':24s} without plans: {line2}", flush=True)


def launch_with(call, variant: str, sample: int, loop=None):
    p = call.problem
    if variant == "multirow":
        bm, bn, w = tk.multirow_config(p.n, p.dtype.itemsize)
        return tk._launch(tk._tile, call, ("ab", sample, bm, bn, w), (cdiv(p.rows, bm),), (bm, bn, sample), w)
    if variant == "row":
        bm, bn, w = tk.row_config(p.n, p.dtype.itemsize, p.is_rms)
        return tk._launch(tk._tile, call, ("ab", sample, bm, bn, w), (p.rows,), (1, bn, sample), w)
    chunk, w = loop or tk.looped_config(p.n)
    return tk._launch(tk._looped, call, ("ab", sample, chunk, w), (p.rows,), (chunk, sample), w)


def shift_ab(results: dict, bw: float, quick: bool) -> None:
    print("\n== layer norm shift: % of copy bandwidth (SAMPLE=0 is the old full-row mean) ==")
    for op in ("layer_norm", "add_layer_norm"):
        for dtype in (torch.bfloat16, torch.float16, torch.float32):
            for rows, n in LLM:
                if quick and dtype != torch.bfloat16 and n not in (1024, 32768, 65536, 128):
                    continue
                case = cases.make_case(op, (rows, n), dtype)
                xargs, kw = case.make(torch.device("cuda"))
                x, r = xargs[0], (xargs[1] if len(xargs) > 1 else None)
                w, b = kw.get("weight"), kw.get("bias")
                ref = case.oracle(xargs, kw)
                call = prepare(op, x, r, w, b, 1e-5)
                nbytes = x.numel() * x.element_size() * (4 if r is not None else 2) + \
                    sum(t.numel() * t.element_size() for t in (w, b) if t is not None)
                variant = "multirow" if n <= 1024 else "row" if n <= 32768 else "looped"
                arms = [(variant, 0, None), (variant, 16, None), (variant, 64, None)]
                if n >= 32768:
                    for loop in ((32768, 32), (16384, 16), (16384, 32), (8192, 16)):
                        arms.append(("looped", 64, loop))
                    arms.append(("looped", 0, None))
                eager_ms = do_bench(lambda: (F.layer_norm(x if r is None else x + r, (n,), w, b, 1e-5)),
                                    return_mode="median")
                line, rowres = [], {"op": op, "dtype": str(dtype), "rows": rows, "n": n, "arms": {}}
                for variant_, sample, loop in arms:
                    label = f"{variant_}{'' if loop is None else '%s' % (loop,)} s{sample}"
                    try:
                        out = launch_with(call, variant_, sample, loop)
                        err = max_rel_error(out, ref)
                        ms = do_bench(lambda: launch_with(call, variant_, sample, loop), return_mode="median")
                    except Exception as exc:  # out of resources etc.
                        print(f"  {label}: {str(exc)[:80]}")
                        continue
                    pct = 100 * nbytes / (ms * 1e-3) / 1e9 / bw
                    ok = err <= TOLERANCE[dtype]
                    rowres["arms"][label] = {"pct": pct, "err": err, "ok": ok}
                    line.append(f"{label} {pct:5.1f}%{'' if ok else ' BAD'}")
                rowres["eager_pct"] = 100 * nbytes / (eager_ms * 1e-3) / 1e9 / bw
                results["shift"].append(rowres)
                print(f"{op:15s} {str(dtype)[6:]:9s} {rows:6d}x{n:<6d} eager {rowres['eager_pct']:5.1f}%  "
                      + "  ".join(line), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    bw = measure_copy_bandwidth(torch.device("cuda"), nbytes=1 << 30)
    results = {"device": torch.cuda.get_device_name(), "copy_gbs": bw, "torch": torch.__version__,
               "triton": triton.__version__, "overhead": [], "shift": []}
    print(f"{results['device']}  torch {torch.__version__}  triton {triton.__version__}  copy {bw:.0f} GB/s")
    overhead(results)
    shift_ab(results, bw, args.quick)
    with open(os.path.join(args.out, "shift_and_plans.json"), "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
