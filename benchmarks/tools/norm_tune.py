"""Check, then time, every Triton norm variant and config at the `llm` shapes on a GPU.

Run on the GPU machine:  PYTHONPATH=src python3 benchmarks/tools/norm_tune.py [--quick] [--out DIR]
Prints, per (op, dtype, shape): % of measured copy bandwidth for each variant/config, for the
default selection and for torch eager; and wall time per call at small shapes. Writes JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.nn.functional as F
import triton
from triton.testing import do_bench

import opforge
from opforge.ops.norm import cases, triton_kernels as tk
from opforge.ops.norm.problem import prepare
from opforge.runtime.device import measure_copy_bandwidth
from opforge.testing import TOLERANCE, max_rel_error

LLM = [(32768, 1024), (16384, 4096), (8192, 8192), (4096, 16384), (2048, 32768), (1024, 65536), (262144, 128)]


def eager(op):
    def layer(x, r, w, b):
        return F.layer_norm(x, (x.shape[-1],), w, b, 1e-5)

    def rms(x, r, w, b):
        return F.rms_norm(x, (x.shape[-1],), w, 1e-6)

    def add_layer(x, r, w, b):
        s = x + r
        return F.layer_norm(s, (x.shape[-1],), w, b, 1e-5), s

    def add_rms(x, r, w, b):
        s = x + r
        return F.rms_norm(s, (x.shape[-1],), w, 1e-6), s
    return {"layer_norm": layer, "rms_norm": rms, "add_layer_norm": add_layer, "add_rms_norm": add_rms}[op]


def configs(n, itemsize):
    """Alternative launches: (label, kind, params)."""
    out = []
    if n <= 1024:
        bn = triton.next_power_of_2(n)
        for tile in (1024, 2048, 4096):
            out.append((f"multirow m{max(1, tile // bn)} w4", "tile", (max(1, tile // bn), bn, 4, 2)))
    if 1024 <= n <= 32768:
        bn = triton.next_power_of_2(n)
        for w in (4, 8, 16, 32):
            if 1 <= bn // (w * 32) <= 64:
                out.append((f"row w{w}", "tile", (1, bn, w, 2)))
    if n >= 16384:
        for chunk, w, st in ((8192, 16, 2), (16384, 16, 2), (16384, 32, 2), (32768, 16, 2), (32768, 32, 2),
                             (32768, 32, 3)):
            if chunk <= n:
                out.append((f"looped c{chunk} w{w} s{st}", "loop", (chunk, w, st)))
    return out


def launch_config(call, kind, params):
    if kind == "tile":
        bm, bn, w, st = params
        return tk._launch(tk._tile, call, ("tune",) + params, (triton.cdiv(call.problem.rows, bm),), (bm, bn, tk.SHIFT_SAMPLE), w)
    chunk, w, st = params
    return tk._launch(tk._looped, call, ("tune",) + params, (call.problem.rows,), (chunk, tk.SHIFT_SAMPLE), w)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--ops", default="layer_norm,rms_norm,add_layer_norm,add_rms_norm")
    ap.add_argument("--dtypes", default="bfloat16,float16,float32")
    ap.add_argument("--ns", default="", help="only these N (comma-separated)")
    ap.add_argument("--skip-wall", action="store_true")
    args = ap.parse_args()
    dev = torch.device("cuda")
    bw = measure_copy_bandwidth(dev, nbytes=1 << 30)
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}  triton {triton.__version__}  copy {bw:.0f} GB/s")
    results = {"device": torch.cuda.get_device_name(), "copy_gbs": bw, "torch": torch.__version__,
               "triton": triton.__version__, "rows": []}
    for op in args.ops.split(","):
        for dname in args.dtypes.split(","):
            dtype = getattr(torch, dname)
            shapes = LLM if dname == "bfloat16" or not args.quick else [LLM[0], LLM[3], LLM[5], LLM[6]]
            for rows, n in shapes:
                if args.ns and str(n) not in args.ns.split(","):
                    continue
                case = cases.make_case(op, (rows, n), dtype)
                (xargs, kw) = case.make(dev)
                x = xargs[0]
                r = xargs[1] if len(xargs) > 1 else None
                w, b = kw.get("weight"), kw.get("bias")
                nbytes = x.numel() * x.element_size() * (4 if r is not None else 2) + w.numel() * w.element_size() * (2 if b is not None else 1)
                with opforge.trace() as t:
                    out = case.call(*xargs, **kw)
                ref = case.oracle(xargs, kw)
                err = max_rel_error(out, ref)
                ok = err <= TOLERANCE[dtype]
                default_ms = do_bench(lambda: case.call(*xargs, **kw), return_mode="median")
                eager_ms = do_bench(lambda: eager(op)(x, r, w, b), return_mode="median")
                call = prepare(op, x, r, w, b, 1e-5)
                alts = {}
                for label, kind, params in configs(n, x.element_size()):
                    try:
                        o = launch_config(call, kind, params)
                        e = max_rel_error(o, ref)
                        ms = do_bench(lambda: launch_config(call, kind, params), return_mode="median")
                        alts[label] = (ms, e)
                    except Exception as exc:  # out of resources etc.
                        alts[label] = (float("nan"), str(exc)[:60])
                pct = lambda ms: 100 * nbytes / (ms * 1e-3) / 1e9 / bw
                best = min((v[0], k) for k, v in alts.items() if v[0] == v[0] and isinstance(v[1], float) and v[1] <= TOLERANCE[dtype])
                print(f"{op:15s} {dname:8s} {rows:6d}x{n:<6d} err {err:.1e} {'ok ' if ok else 'BAD'} "
                      f"default[{t[0].variant}] {pct(default_ms):5.1f}%  eager {pct(eager_ms):5.1f}%  "
                      f"best {best[1]} {pct(best[0]):5.1f}%", flush=True)
                results["rows"].append(dict(op=op, dtype=dname, rows=rows, n=n, err=err, ok=ok,
                                            variant=t[0].variant, default_pct=pct(default_ms),
                                            eager_pct=pct(eager_ms),
                                            alts={k: (pct(v[0]) if v[0] == v[0] else None, v[1]) for k, v in alts.items()}))
    # wall time per call at small shapes (host overhead)
    for shape in [] if args.skip_wall else [(2, 32, 256), (8, 128, 768), (1, 1, 4096)]:
        x = torch.randn(*shape, device=dev, dtype=torch.bfloat16)
        w = torch.randn(shape[-1], device=dev, dtype=torch.bfloat16)
        b = torch.randn(shape[-1], device=dev, dtype=torch.bfloat16)
        fns = {"opforge": lambda: opforge.layer_norm(x, w, b),
               "eager": lambda: F.layer_norm(x, (shape[-1],), w, b),
               "opforge_rms": lambda: opforge.rms_norm(x, w),
               "eager_rms": lambda: F.rms_norm(x, (shape[-1],), w, 1e-6)}
        line = []
        for name, fn in fns.items():
            for _ in range(50):
                fn()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(2000):
                fn()
            torch.cuda.synchronize()
            us = (time.perf_counter() - t0) / 2000 * 1e6
            line.append(f"{name} {us:.1f}us")
            results.setdefault("wall", []).append(dict(shape=shape, impl=name, us=us))
        print("wall", shape, "  ".join(line), "fast_path:", tk._tile.fast_path, flush=True)
    with open(os.path.join(args.out, "norm_tune.json"), "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
