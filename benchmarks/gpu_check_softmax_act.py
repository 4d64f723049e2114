"""Check, then time, softmax / log_softmax and the activations on a GPU, at the issue's target shapes.

Run on the GPU machine (about 2.5 minutes on an H100; the sections after the targets are skipped
when the time budget runs out):

    PYTHONPATH=src python3 benchmarks/gpu_check_softmax_act.py [--quick] [--no-compile] [--no-sweep]
                                                               [--sweep-only] [--verify] [--budget SECONDS]
                                                               [--out DIR]

``--sweep-only`` runs the verify cases of both families (every variant, strided rows, dim=0, huge
logits; launch keys checked), the special values and the configuration sweep: a second run for
tuning, since the sweep is cut short when the targets with torch.compile use most of the budget.
``--verify`` adds the verify cases to a full run.

1. Correctness: every case below against the float64 oracle (computed on the GPU in row chunks),
   plus -inf / all -inf / NaN rows through each softmax variant, and special values through each
   activation, compared with torch.
2. Targets: GPU time (``triton.testing.do_bench``, median, L2 flushed) of opforge's default
   selection, torch eager and torch.compile, as % of a measured device-to-device copy
   (bytes read + written / time, the copy timed the same way). Softmax bf16/fp16 at the `llm`
   shapes and 4096x131072: >= 90% of copy and <= 3% behind the fastest peer. swiglu / geglu at
   16384 x (2 x 11008) bf16: >= 90% of copy.
3. Sweep: alternative configurations of each variant (tile sizes, warps, looped chunk and grid,
   split vs looped for few long rows, pointwise block sizes), to set the defaults.
4. Wall time per call at small sizes (host overhead).

Writes ``gpu_check_softmax_act.json`` into --out (default: $OUT or .).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F
import triton
from triton.testing import do_bench

import opforge
from opforge.ops import activation as act
from opforge.ops import softmax as sm
from opforge.ops.activation import problem as act_problem, reference as act_ref, triton_kernels as atk
from opforge.ops.softmax import problem as sm_problem, reference as sm_ref, triton_kernels as stk
from opforge.testing import TOLERANCE

LLM_SHAPES = [(32768, 1024), (16384, 4096), (8192, 8192), (4096, 16384), (2048, 32768), (1024, 65536),
              (262144, 128)]
SOFTMAX_TARGET_SHAPES = LLM_SHAPES + [(4096, 131072)]
GATED_SHAPE = (16384, 11008)
UNARY_SHAPE = (16384, 4096)
LOG_SOFTMAX_SHAPES = [(32768, 1024), (4096, 16384), (4096, 131072), (262144, 128)]
SWEEP_MULTIROW = [(262144, 128), (32768, 1024)]
SWEEP_ROW = [(16384, 4096), (8192, 8192), (4096, 16384), (2048, 32768), (1024, 65536)]
SWEEP_LONG = (4096, 131072)
SWEEP_FEW = [(1, 262144), (8, 262144), (32, 131072), (96, 131072), (128, 131072), (4, 1048576), (1, 1048576)]
DEV = torch.device("cuda")
T0 = time.perf_counter()
BUDGET = 160.0
ROWS = 10**9   # as ctas_per_sm: one program per row (no persistent loop)
DTYPE_NAME = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


def elapsed() -> float:
    return time.perf_counter() - T0


def left() -> float:
    return BUDGET - elapsed()


def bench_ms(fn: Callable[[], Any], fast: bool = False) -> float:
    # short warmup/rep: these kernels run 20 us - 1 ms, so ~40 ms of repetitions is plenty
    return do_bench(fn, warmup=5 if fast else 10, rep=20 if fast else 40, return_mode="median")


def pct(nbytes: int, ms: float, copy_gbs: float) -> float:
    return 100.0 * nbytes / (ms * 1e-3) / 1e9 / copy_gbs


def measure_copy_gbs() -> float:
    src = torch.empty(1 << 28, dtype=torch.float32, device=DEV).uniform_()   # 1 GiB
    dst = torch.empty_like(src)
    ms = bench_ms(lambda: dst.copy_(src))
    del src, dst
    return 2 * (1 << 30) / (ms * 1e-3) / 1e9


# -- the float64 oracle, chunked so 1 GiB inputs do not need 4 GiB float64 copies at once -----------

def rel_error_chunked(out: torch.Tensor, inputs: tuple, ref_fn: Callable[..., torch.Tensor],
                      chunk_elems: int = 1 << 26) -> float:
    rows = out.shape[0] if out.dim() else 1
    per_row = max(1, out.numel() // max(rows, 1))
    step = max(1, chunk_elems // per_row)
    num = den = 0.0
    for i in range(0, rows, step):
        o = out[i:i + step].double()
        r = ref_fn(*(t[i:i + step].double() for t in inputs))
        if not torch.isfinite(o).all():
            return float("inf")
        num += (o - r).pow(2).sum().item()
        den += r.pow(2).sum().item()
    return math.sqrt(num) / math.sqrt(den) if den > 0 else math.sqrt(num)


def torch_compile(fn: Callable) -> Callable:
    cfg = torch._dynamo.config
    for key in ("recompile_limit", "cache_size_limit"):
        if hasattr(cfg, key):
            setattr(cfg, key, 1024)
    return torch.compile(fn, dynamic=False, fullgraph=True)


def eager_softmax(x):
    return torch.softmax(x, dim=-1)


def eager_log_softmax(x):
    return torch.log_softmax(x, dim=-1)


def eager_swiglu(g, u):
    return F.silu(g) * u


def eager_geglu(g, u):
    return F.gelu(g) * u


def eager_gelu(x):
    return F.gelu(x)


def eager_gelu_tanh(x):
    return F.gelu(x, approximate="tanh")


def eager_silu(x):
    return F.silu(x)


def eager_relu(x):
    return torch.relu(x)


COMPILED: dict[Callable, Callable] = {}


def compiled(fn: Callable) -> Callable:
    if fn not in COMPILED:
        COMPILED[fn] = torch_compile(fn)
    return COMPILED[fn]


# -- one timed case ------------------------------------------------------------------------------------

def run_case(results: dict, label: str, dtype: torch.dtype, shape: tuple, inputs: tuple,
             ours: Callable, eager: Callable, ref_fn: Callable, nbytes: int, copy_gbs: float,
             targets: Optional[dict] = None, use_compile: bool = True) -> Optional[dict]:
    from opforge.runtime import launch

    launch._CHECK_KEYS = True  # the first call checks opforge's launch keys against Triton's own
    try:
        with opforge.strict(), opforge.trace() as t:
            out = ours(*inputs)
        torch.cuda.synchronize()
    except Exception as exc:  # report, keep going
        results["cases"].append(dict(op=label, dtype=DTYPE_NAME[dtype], shape=list(shape), ok=False,
                                     error=f"{type(exc).__name__}: {exc}"))
        print(f"{label:12s} {DTYPE_NAME[dtype]} {'x'.join(map(str, shape)):>14s} ERROR {type(exc).__name__}: {exc}",
              flush=True)
        return None
    finally:
        launch._CHECK_KEYS = False
    err = rel_error_chunked(out, inputs, ref_fn)
    ok = err <= TOLERANCE[dtype]
    variant = t[0].variant if len(t) else "?"
    backend = t[0].backend if len(t) else "?"
    del out
    row: dict[str, Any] = dict(op=label, dtype=DTYPE_NAME[dtype], shape=list(shape), err=err, ok=ok,
                               backend=backend, variant=variant, note=t[0].note if len(t) else "")
    row["opforge_ms"] = bench_ms(lambda: ours(*inputs))
    row["torch_ms"] = bench_ms(lambda: eager(*inputs))
    row["compile_ms"] = None
    if use_compile and left() > 45:
        try:
            fn = compiled(eager)
            t_c = time.perf_counter()
            fn(*inputs)
            torch.cuda.synchronize()
            row["compile_first_call_s"] = time.perf_counter() - t_c
            row["compile_ms"] = bench_ms(lambda: fn(*inputs))
        except Exception as exc:  # report, keep going
            row["compile_error"] = f"{type(exc).__name__}: {str(exc)[:120]}"
    for k in ("opforge", "torch", "compile"):
        ms = row[f"{k}_ms"]
        row[f"{k}_pct"] = None if ms is None else pct(nbytes, ms, copy_gbs)
    peers = [row[k] for k in ("torch_ms", "compile_ms") if row[k] is not None]
    best = min(peers)
    row["vs_best_peer"] = best / row["opforge_ms"]
    verdicts = []
    if targets:
        if "min_pct" in targets:
            verdicts.append(row["opforge_pct"] >= targets["min_pct"])
        if "max_behind" in targets:
            verdicts.append(row["opforge_ms"] <= best * (1 + targets["max_behind"]))
        row["target_met"] = bool(ok and all(verdicts))
    results["cases"].append(row)
    tgt = "" if not targets else ("  target MET" if row["target_met"] else "  target MISS")
    comp = "   n/a" if row["compile_pct"] is None else f"{row['compile_pct']:5.1f}%"
    print(f"{label:12s} {DTYPE_NAME[dtype]} {'x'.join(map(str, shape)):>14s} [{variant:9s}] err {err:.1e} "
          f"{'ok ' if ok else 'BAD'} | opforge {row['opforge_pct']:5.1f}%  eager {row['torch_pct']:5.1f}%  "
          f"compile {comp}  ({row['vs_best_peer']:.2f}x best peer){tgt}", flush=True)
    return row


def softmax_ref(op: str) -> Callable:
    return lambda x: sm_ref.run(op, x, -1)


def section_targets(results: dict, copy_gbs: float, quick: bool, use_compile: bool) -> None:
    print("\n== softmax targets (>= 90% of copy, <= 3% behind the fastest peer) ==", flush=True)
    g = torch.Generator(device=DEV).manual_seed(0)
    for dtype in (torch.bfloat16, torch.float16):
        shapes = SOFTMAX_TARGET_SHAPES if not quick or dtype == torch.bfloat16 else SOFTMAX_TARGET_SHAPES[::3]
        for shape in shapes:
            x = (torch.randn(shape, device=DEV, generator=g) * 4).to(dtype)
            run_case(results, "softmax", dtype, shape, (x,), sm.softmax, eager_softmax, softmax_ref("softmax"),
                     2 * x.numel() * x.element_size(), copy_gbs, {"min_pct": 90.0, "max_behind": 0.03},
                     use_compile)
            del x
    print("\n== log_softmax (no separate target; same kernels) ==", flush=True)
    for shape in LOG_SOFTMAX_SHAPES[: 2 if quick else 4]:
        x = (torch.randn(shape, device=DEV, generator=g) * 4).to(torch.bfloat16)
        run_case(results, "log_softmax", torch.bfloat16, shape, (x,), sm.log_softmax, eager_log_softmax,
                 softmax_ref("log_softmax"), 2 * x.numel() * x.element_size(), copy_gbs, None, use_compile)
        del x
    print("\n== gated activations (>= 90% of copy at 16384 x (2 x 11008) bf16) ==", flush=True)
    for name, ours, eager in (("swiglu", act.swiglu, eager_swiglu), ("geglu", act.geglu, eager_geglu)):
        gate = torch.randn(GATED_SHAPE, device=DEV, generator=g).to(torch.bfloat16)
        up = torch.randn(GATED_SHAPE, device=DEV, generator=g).to(torch.bfloat16)
        ref = (lambda gg, uu, op=name: act_ref.run(op, gg, uu, "none" if op == "geglu" else None))
        run_case(results, name, torch.bfloat16, GATED_SHAPE, (gate, up), ours, eager, ref,
                 3 * gate.numel() * gate.element_size(), copy_gbs, {"min_pct": 90.0}, use_compile)
        del gate, up
        # the two halves of one fused projection: strided rows read in place
        h = torch.randn(GATED_SHAPE[0], 2 * GATED_SHAPE[1], device=DEV, generator=g).to(torch.bfloat16)
        halves = (h[:, :GATED_SHAPE[1]], h[:, GATED_SHAPE[1]:])
        run_case(results, name + "[h]", torch.bfloat16, GATED_SHAPE, halves, ours, eager, ref,
                 3 * halves[0].numel() * h.element_size(), copy_gbs, {"min_pct": 90.0}, use_compile)
        del h, halves
    print(f"\n== unary activations at {UNARY_SHAPE[0]} x {UNARY_SHAPE[1]} ==", flush=True)
    unary = [("gelu", act.gelu, eager_gelu, None), ("gelu[tanh]", lambda x: act.gelu(x, approximate="tanh"),
                                                    eager_gelu_tanh, "tanh"),
             ("silu", act.silu, eager_silu, None), ("relu", act.relu, eager_relu, None)]
    for dtype in (torch.bfloat16,):
        x = torch.randn(UNARY_SHAPE, device=DEV, generator=g).to(dtype)
        for name, ours, eager, approx in unary:
            base = name.split("[")[0]
            ref = (lambda xx, op=base, a=approx: act_ref.run(op, xx, None, a or ("none" if op == "gelu" else None)))
            run_case(results, name, dtype, tuple(x.shape), (x,), ours, eager, ref,
                     2 * x.numel() * x.element_size(), copy_gbs, None, use_compile)
        del x


# -- special values through every variant on the GPU ------------------------------------------------------

def section_verify(results: dict) -> None:
    """The families' verify cases (every variant, strided rows, dim=0, huge logits) on the GPU, with
    every caller-supplied launch key checked against Triton's own specialization."""
    from opforge.ops.activation import cases as act_cases
    from opforge.ops.softmax import cases as sm_cases
    from opforge.runtime import launch
    from opforge.testing import max_rel_error

    print("\n== verify cases (launch keys checked) ==", flush=True)
    launch._CHECK_KEYS = True
    failures, count, variants = [], 0, set()
    try:
        for family in (sm_cases, act_cases):
            for case in family.verify_cases(DEV.type):
                args, kwargs = case.make(DEV)
                try:
                    with opforge.backend("triton"), opforge.trace() as t:
                        out = case.call(*args, **kwargs)
                    err = max_rel_error(out, case.oracle(args, kwargs))
                    variants.add(f"{case.op}:{t[0].variant}")
                    if not err <= TOLERANCE[case.dtype]:
                        failures.append(f"{case.op} {case.label} {DTYPE_NAME[case.dtype]}: rel err {err:.2e}")
                except Exception as exc:  # report every failure
                    failures.append(f"{case.op} {case.label} {DTYPE_NAME[case.dtype]}: {type(exc).__name__}: {exc}")
                count += 1
    finally:
        launch._CHECK_KEYS = False
    results["verify"] = {"cases": count, "failures": failures, "variants": sorted(variants)}
    print(f"{count - len(failures)}/{count} passed; variants seen: {', '.join(sorted(variants))}", flush=True)
    for f in failures:
        print("FAIL", f, flush=True)


def section_special(results: dict) -> None:
    print("\n== special values (-inf entries, all -inf rows, NaN, huge logits) through each variant ==", flush=True)
    failures = []
    launchers = {
        "multirow": lambda c: stk.launch_multirow(c), "row": lambda c: stk.launch_row(c),
        "looped": lambda c: stk.launch_looped(c), "split": lambda c: stk.launch_split(c),
    }
    for n in (300, 5000, 70000):
        x = torch.randn(7, n, device=DEV) * 3
        x[0] *= 1e4
        x[1] = x[1] * 1e4 - 1e30
        x[2, ::3] = float("-inf")
        x[3] = float("-inf")
        x[4, : n - 1] = float("-inf")
        x[5, 17] = float("nan")
        x[6] = 0.0
        for op in ("softmax", "log_softmax"):
            expected = getattr(torch, op)(x.double(), dim=-1)
            for name, launch in launchers.items():
                if name == "multirow" and n > stk.MULTIROW_MAX_N:
                    continue
                if name == "row" and n > stk.ROW_MAX_N[4]:
                    continue
                y = launch(sm_problem.prepare(op, x, -1)).double()
                same_nan = torch.equal(torch.isnan(y), torch.isnan(expected))
                same_inf = torch.equal(torch.isinf(y), torch.isinf(expected))
                fin = torch.isfinite(expected)
                err = ((y[fin] - expected[fin]).norm() / expected[fin].norm()).item()
                if not (same_nan and same_inf and err < 1e-5):
                    failures.append(f"{op} {name} N={n}: nan {same_nan} inf {same_inf} err {err:.1e}")
    x = torch.tensor([0.0, -0.0, 1e-30, 20.0, -20.0, 80.0, -80.0, 1e4, -1e4, 3e38, -3e38,
                      float("inf"), float("-inf"), float("nan")], device=DEV)
    for name, ours, theirs in (("gelu", act.gelu, F.gelu), ("silu", act.silu, F.silu), ("relu", act.relu, torch.relu),
                               ("gelu[tanh]", lambda v: act.gelu(v, approximate="tanh"),
                                lambda v: F.gelu(v, approximate="tanh"))):
        y, e = ours(x).double(), theirs(x.double())
        if not torch.equal(torch.isnan(y), torch.isnan(e)):
            failures.append(f"{name}: NaN positions {y.tolist()} vs torch {e.tolist()}")
    results["special_failures"] = failures
    print("all special values follow torch" if not failures else "\n".join("FAIL " + f for f in failures), flush=True)


# -- configuration sweep ----------------------------------------------------------------------------------

def _time_alt(label: str, fn: Callable[[], torch.Tensor], ref: torch.Tensor, dtype, nbytes, copy_gbs,
              out: dict) -> None:
    try:
        y = fn()
        err = ((y.double() - ref).norm() / ref.norm()).item()
        if not err <= TOLERANCE[dtype]:
            out[label] = f"wrong (err {err:.1e})"
            return
        out[label] = round(pct(nbytes, bench_ms(fn, fast=True), copy_gbs), 1)
    except Exception as exc:  # out of resources, etc.
        out[label] = f"error: {type(exc).__name__}: {str(exc)[:80]}"


def section_sweep(results: dict, copy_gbs: float, quick: bool) -> None:
    print("\n== sweep: % of copy per configuration (default choice marked *) ==", flush=True)
    sweep: dict[str, dict] = {}
    results["sweep"] = sweep
    g = torch.Generator(device=DEV).manual_seed(1)
    dtype = torch.bfloat16
    plans: list[tuple[tuple, list]] = []
    for shape in SWEEP_MULTIROW:
        alts = []
        bn = triton.next_power_of_2(shape[1])
        for tile in (2048, 4096, 8192, 16384):
            for w in (4, 8):
                bm = max(1, tile // bn)
                alts.append((f"multirow m{bm} w{w}", lambda c, bm=bm, w=w, bn=bn: stk.launch_tile(c, bm, bn, w)))
        plans.append((shape, alts))
    for shape in SWEEP_ROW:
        alts = []
        bn = triton.next_power_of_2(shape[1])
        for w in (4, 8, 16, 32):
            if 4 <= bn // (32 * w) <= 128:
                alts.append((f"row w{w}", lambda c, w=w, bn=bn: stk.launch_tile(c, 1, bn, w)))
        if shape[1] >= 16384:
            for chunk, w in ((8192, 8), (16384, 8), (16384, 16), (32768, 16)):
                for ctas in (1, 2, ROWS):
                    alts.append((f"looped c{chunk} w{w} g{'rows' if ctas == ROWS else ctas}",
                                 lambda c, ch=chunk, w=w, k=ctas: stk.launch_looped(c, ch, w, k)))
        plans.append((shape, alts))
    alts = []
    for chunk, w in ((8192, 8), (16384, 8), (16384, 16), (32768, 16), (32768, 32)):
        for ctas in (1, 2, 4, ROWS):
            alts.append((f"looped c{chunk} w{w} g{'rows' if ctas == ROWS else ctas}",
                         lambda c, ch=chunk, w=w, k=ctas: stk.launch_looped(c, ch, w, k)))
    alts.append(("looped default, no L2 hints", lambda c: stk.launch_looped(c, hints=False)))
    alts.append(("looped default, no prefetch", lambda c: stk.launch_looped(c, prefetch=False)))
    alts.append(("looped default, no hints/prefetch", lambda c: stk.launch_looped(c, hints=False, prefetch=False)))
    for cols in (1024, 2048, 8192, 16384):  # R = chunk / cols values per lane and step (default R = 4)
        alts.append((f"looped default, cols {cols}", lambda c, k=cols: stk.launch_looped(c, cols=k)))
    for stages in (1, 3):
        alts.append((f"looped default, num_stages={stages}", lambda c, st=stages: stk.launch_looped(c, num_stages=st)))
    plans.append((SWEEP_LONG, alts))
    for shape in SWEEP_FEW:
        alts = [("looped default", lambda c: stk.launch_looped(c))]
        for chunk in (1024, 2048, 4096, 8192):
            alts.append((f"split c{chunk}", lambda c, ch=chunk: stk.launch_split(c, ch)))
        alts.append(("split c2048 no prefetch", lambda c: stk.launch_split(c, 2048, prefetch=False)))
        alts.append(("split c2048 x2 splits", lambda c: stk.launch_split(
            c, 2048, splits=2 * stk.split_config(c.problem.rows, c.problem.n, stk._sms(c.x.tensor))[0])))
        plans.append((shape, alts))
    if quick:
        plans = plans[::2]
    for shape, alts in plans:
        if left() < 20:
            print("(time budget spent: sweep cut short)", flush=True)
            break
        x = (torch.randn(shape, device=DEV, generator=g) * 4).to(dtype)
        call = sm_problem.prepare("softmax", x, -1)
        ref = torch.softmax(x.double(), dim=-1) if x.numel() <= (1 << 27) else None
        if ref is None:  # 4096x131072: check against the float32 torch result instead of float64
            ref = torch.softmax(x.float(), dim=-1).double()
        nbytes = 2 * x.numel() * x.element_size()
        out: dict[str, Any] = {}
        with opforge.trace() as t:
            sm.softmax(x)
        default = t[0].variant
        out[f"* default ({default})"] = round(pct(nbytes, bench_ms(lambda: sm.softmax(x), fast=True), copy_gbs), 1)
        for label, launch in alts:
            if left() < 15:
                break
            _time_alt(label, lambda launch=launch: launch(call), ref, dtype, nbytes, copy_gbs, out)
        key = f"softmax bf16 {shape[0]}x{shape[1]}"
        sweep[key] = out
        print(f"{key}: " + ", ".join(f"{k} {v}" for k, v in out.items()), flush=True)
        del x, ref
    # pointwise block sizes
    for name, op in (("swiglu", "swiglu"), ("gelu", "gelu")):
        if left() < 15:
            break
        x = torch.randn(GATED_SHAPE, device=DEV, generator=g).to(dtype)
        u = torch.randn(GATED_SHAPE, device=DEV, generator=g).to(dtype) if op == "swiglu" else None
        call = act_problem.prepare(op, x, u, "none" if op == "gelu" else None)
        ref = act_ref.run(op, x.double(), None if u is None else u.double(), call.approximate)
        nbytes = (3 if u is not None else 2) * x.numel() * x.element_size()
        out = {}
        out["* default"] = round(pct(nbytes, bench_ms(lambda: atk.launch_pointwise(call), fast=True), copy_gbs), 1)
        for block in (1024, 2048, 4096, 8192):
            for w in (4, 8, 16):
                if block // (32 * w) < 2:
                    continue
                _time_alt(f"block {block} w{w}", lambda b=block, w=w: atk.launch_pointwise(call, b, w), ref, dtype,
                          nbytes, copy_gbs, out)
        key = f"{name} bf16 {GATED_SHAPE[0]}x{GATED_SHAPE[1]}"
        sweep[key] = out
        print(f"{key}: " + ", ".join(f"{k} {v}" for k, v in out.items()), flush=True)
        del x, u, ref


def section_wall(results: dict) -> None:
    print("\n== wall time per call at small sizes (us) ==", flush=True)
    wall = []
    for shape in [(2, 32, 256), (8, 128, 768), (1, 1, 4096), (1, 128256)]:
        x = torch.randn(shape, device=DEV, dtype=torch.bfloat16)
        fns = {"opforge.softmax": lambda: sm.softmax(x), "torch.softmax": lambda: torch.softmax(x, -1),
               "opforge.silu": lambda: act.silu(x), "F.silu": lambda: F.silu(x),
               "opforge.swiglu": lambda: act.swiglu(x, x), "F.silu*up": lambda: F.silu(x) * x}
        line = []
        for name, fn in fns.items():
            for _ in range(30):
                fn()
            torch.cuda.synchronize()
            n = 1000
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            torch.cuda.synchronize()
            us = (time.perf_counter() - t0) / n * 1e6
            wall.append(dict(shape=list(shape), impl=name, us=us))
            line.append(f"{name} {us:.1f}")
        print("x".join(map(str, shape)), "  ".join(line), flush=True)
    results["wall"] = wall
    results["fast_path"] = {"softmax_tile": stk._tile.fast_path, "pointwise": atk._pointwise.fast_path}


def main() -> int:
    global BUDGET
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer shapes")
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile peer")
    ap.add_argument("--no-sweep", action="store_true", help="skip the configuration sweep")
    ap.add_argument("--sweep-only", action="store_true", help="only the correctness checks and the sweep")
    ap.add_argument("--verify", action="store_true", help="also run the verify cases (many small compiles)")
    ap.add_argument("--budget", type=float, default=BUDGET, help="seconds before optional sections are cut")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    BUDGET = args.budget
    if not torch.cuda.is_available():
        print("needs a CUDA GPU")
        return 2
    torch.backends.cuda.matmul.allow_tf32 = True
    copy_gbs = measure_copy_gbs()
    info = opforge.device_info()
    header = (f"{info}  torch {torch.__version__}  triton {triton.__version__}  "
              f"copy {copy_gbs:.0f} GB/s (1 GiB, do_bench median)")
    print(header, flush=True)
    results: dict[str, Any] = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                               "triton": triton.__version__, "copy_gbs": copy_gbs, "cases": []}
    try:
        if args.sweep_only or args.verify:
            section_verify(results)
        section_special(results)
        if not args.sweep_only:
            section_targets(results, copy_gbs, args.quick, not args.no_compile)
        if not args.no_sweep and left() > 30:
            section_sweep(results, copy_gbs, args.quick)
        if left() > 5 and not args.sweep_only:
            section_wall(results)
    finally:
        results["elapsed_s"] = elapsed()
        path = os.path.join(args.out, "gpu_check_softmax_act.json")
        with open(path, "w") as f:
            json.dump(results, f, indent=1)
    bad = [c for c in results["cases"] if not c["ok"]]
    misses = [c for c in results["cases"] if c.get("target_met") is False]
    specials = len(results.get("special_failures", []))
    print(f"\n{len(results['cases'])} timed cases, {len(bad)} wrong, {specials} special-value failures, "
          f"{len(misses)} target misses, {elapsed():.0f} s; JSON: {path}")
    for c in bad:
        print(f"  WRONG {c['op']} {c['dtype']} {'x'.join(map(str, c['shape']))}: "
              f"{c.get('error') or 'rel err %.2e' % c['err']}")
    for c in misses:
        print(f"  MISS {c['op']} {c['dtype']} {'x'.join(map(str, c['shape']))} [{c['variant']}]: opforge "
              f"{c['opforge_pct']:.1f}% of copy, {c['vs_best_peer']:.2f}x best peer")
    verify_failures = results.get("verify", {}).get("failures", [])
    if verify_failures:
        print(f"  {len(verify_failures)} verify failures (see above)")
    return 1 if bad or results.get("special_failures") or verify_failures else 0


if __name__ == "__main__":
    sys.exit(main())
