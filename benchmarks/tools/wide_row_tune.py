"""Check, then time, the wide-row candidates of the norms and softmax against today's default and torch.

One command on a GPU machine (about 2-3 minutes on an H100):

    PYTHONPATH=src timeout 600 python3 benchmarks/tools/wide_row_tune.py [--out DIR] [--budget 150]

Without a GPU, ``--registers`` prints each row_split configuration's registers, spills and
programs per SM (ptxas -v for sm_90), and ``--device cpu --shapes 2x8192 --reps 2`` (with
TRITON_INTERPRET=1) runs the whole script in Triton's interpreter as a smoke test.

For every op (layer_norm, rms_norm, softmax, log_softmax; ``--all-ops`` adds add_layer_norm and
add_rms_norm), bf16 and fp16, and the seven `llm` shapes (wide rows first; ``--wide-only``: N >=
16384), it runs today's default selection, torch eager and every candidate that applies:

* ``row_split B/W``: one row across N/B programs of W warps, each holding B values in registers,
  partial statistics exchanged through a per-row counter (``ops/norm/row_split.py``,
  ``ops/softmax/row_split.py``); ``ids`` numbers segments by program id instead of by ticket.
* ``sample64`` (layer norms): today's default variant with the shift taken from the row's first
  64 values (``triton_kernels.SHIFT_SAMPLE = 64``) instead of the full row's mean.

Each output is checked against float64 (relative error within opforge's tolerance), run again
after timing and compared bit for bit with the first run (a lost exchange between programs would
show there), and the row_split counters must be back at zero. A launch that has not finished 10 s
after it was queued (programs waiting on each other forever) is named, the JSON written, and the
script exits with status 3. Time: CUDA events around each call
after a spin kernel (the bench's clock, ``opforge.bench.timing``), median of 25 calls; share of
the copy bandwidth measured in the same run. It prints one line per (op, dtype, shape), writes
``wide_row_tune.json`` to ``--out`` (``$OUT`` by default) after every line, and ends with the
tables the kernels' config should hold where a candidate wins (>= 1 point over the default in
both dtypes, every check passed).
"""
from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F
import triton

import opforge
from opforge.bench.timing import clock_for
from opforge.ops.norm import cases as norm_cases, row_split as norm_split, triton_kernels as norm_tk
from opforge.ops.norm.problem import prepare as norm_prepare
from opforge.ops.softmax import cases as softmax_cases, reference as softmax_reference, row_split as softmax_split
from opforge.ops.softmax.problem import prepare as softmax_prepare
from opforge.runtime import plans
from opforge.runtime.device import measure_copy_bandwidth
from opforge.testing import TOLERANCE, max_rel_error

LLM = [(32768, 1024), (16384, 4096), (8192, 8192), (4096, 16384), (2048, 32768), (1024, 65536), (262144, 128)]
NORMS = ("layer_norm", "rms_norm", "add_layer_norm", "add_rms_norm")
EPS = {"layer_norm": 1e-5, "rms_norm": 1e-6, "add_layer_norm": 1e-5, "add_rms_norm": 1e-6}
# (BLOCK, num_warps, tickets): registers per thread for bf16 from ptxas -v (sm_90): layer_norm
# 71 / 40 / 66 / 42 (programs per SM 1 / 3 / 3 / 5), softmax 56 / 32 / 64 / 32.
SPLIT_CONFIGS = ((16384, 16, True), (8192, 16, True), (8192, 8, True), (4096, 8, True), (8192, 16, False))
REPS = 25


def eager(op: str) -> Callable:
    """torch's own call for ``op`` on (x, residual, weight, bias)."""
    def call(x, r, w, b):
        if op == "softmax":
            return torch.softmax(x, -1)
        if op == "log_softmax":
            return torch.log_softmax(x, -1)
        s = x + r if r is not None else x
        n = (x.shape[-1],)
        y = F.layer_norm(s, n, w, b, EPS[op]) if "layer" in op else F.rms_norm(s, n, w, EPS[op])
        return (y, s) if r is not None else y
    return call


class Cell:
    """Inputs, the float64 reference and the candidates' launches of one (op, dtype, shape)."""

    def __init__(self, op: str, dtype: torch.dtype, shape: tuple, dev: torch.device):
        self.op, self.dtype, self.shape = op, dtype, shape
        rows, n = shape
        s = torch.tensor([], dtype=dtype).element_size()
        if op in NORMS:
            case = norm_cases.make_case(op, shape, dtype)
            self.args, self.kwargs = case.make(dev)
            self.public = lambda: case.call(*self.args, **self.kwargs)
            x = self.args[0]
            self.r = self.args[1] if len(self.args) > 1 else None
            self.w, self.b = self.kwargs.get("weight"), self.kwargs.get("bias")
            self.ref = case.oracle(self.args, self.kwargs)
            self.judge = (lambda out: norm_cases.judge_by_stored_sum(op, self.args, self.kwargs, out)) \
                if op.startswith("add_") else (lambda out: self.ref)
            vectors = (self.w is not None) + (self.b is not None)
            self.nbytes = rows * n * s * (4 if self.r is not None else 2) + vectors * n * s
        else:
            x = softmax_cases.random_logits(shape, dtype, dev)
            self.args, self.kwargs, self.r, self.w, self.b = (x,), {}, None, None, None
            fn = opforge.softmax if op == "softmax" else opforge.log_softmax
            self.public = lambda: fn(x, -1)
            self.ref = softmax_reference.run(op, x.double())
            self.judge = lambda out: self.ref
            self.nbytes = 2 * rows * n * s
        self.x = x

    def torch_call(self) -> Callable:
        f = eager(self.op)
        return lambda: f(self.x, self.r, self.w, self.b)

    def candidates(self) -> list[tuple[str, Callable[[], Any], Optional[Callable[[], int]]]]:
        """(label, launch, counters-left) for every candidate that applies to this cell."""
        rows, n = self.shape
        out = []
        if self.op in NORMS:
            call = norm_prepare(self.op, self.x, self.r, self.w, self.b, EPS[self.op])
            for block, warps, tickets in SPLIT_CONFIGS:
                if n // block >= 2:
                    label = f"row_split {block}/{warps}" + ("" if tickets else " ids")
                    out.append((label, lambda b=block, w=warps, t=tickets: norm_split.launch_row_split(call, b, w, t),
                                lambda: int(norm_split.WORKSPACE.counters(self.x.device, rows).abs().sum())))
            if "layer" in self.op:
                out.append(("sample64", lambda: _with_sample(64, self.public), None))
        else:
            call = softmax_prepare(self.op, self.x, -1)
            for block, warps, tickets in SPLIT_CONFIGS:
                if n // block >= 2:
                    label = f"row_split {block}/{warps}" + ("" if tickets else " ids")
                    out.append((label,
                                lambda b=block, w=warps, t=tickets: softmax_split.launch_row_split(call, b, w, t),
                                lambda: int(softmax_split.WORKSPACE.counters(self.x.device, rows).abs().sum())))
        return out


def _with_sample(sample: int, fn: Callable[[], Any]) -> Any:
    """``fn()`` with the norms' SHIFT_SAMPLE set to ``sample`` (launch plans skipped: they fix the old one)."""
    old, plans_on = norm_tk.SHIFT_SAMPLE, plans.set_enabled(False)
    norm_tk.SHIFT_SAMPLE = sample
    try:
        return fn()
    finally:
        norm_tk.SHIFT_SAMPLE = old
        plans.set_enabled(plans_on)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, tuple):
        return all(torch.equal(x, y) for x, y in zip(a, b))
    return torch.equal(a, b)


def _shape_of(out: Any, shape: tuple) -> Any:
    return tuple(o.view(shape) for o in out) if isinstance(out, tuple) else out.view(shape)


def measure(clock: Any, fn: Callable[[], Any]) -> float:
    """Median microseconds per call (events around each call, after a spin kernel)."""
    fn()
    times = sorted(clock.device_times(lambda: fn(), [()], REPS, host_us=100.0))
    return times[len(times) // 2]


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


#: Where a hang is reported: the results so far and the JSON path (set by main).
WATCH: dict[str, Any] = {}
HANG_S = 10.0


def _finish_or_stop(dev: torch.device, label: str) -> None:
    """Wait for the work queued so far, at most HANG_S seconds; past that (programs waiting on each
    other forever), write the JSON with the hang named and leave the process (the driver ends the kernel)."""
    if dev.type != "cuda":
        return
    done = torch.cuda.Event()
    done.record()
    start = time.time()
    while not done.query():
        if time.time() - start > HANG_S:
            WATCH["result"]["hang"] = label
            with open(WATCH["path"], "w") as f:
                json.dump(WATCH["result"], f, indent=1)
            print(f"HANG: {label} did not finish in {HANG_S:.0f} s; stopped here (JSON written)", flush=True)
            os._exit(3)
        time.sleep(0.001)


def run_candidate(clock, cell: Cell, fn, counters, label: str = "default") -> dict:
    """Check (float64, repeat, counters), then time one launch."""
    try:
        first = _shape_of(fn(), cell.shape)
        _finish_or_stop(cell.x.device, f"{cell.op} {cell.dtype} {cell.shape} {label}")
        err = max_rel_error(first, cell.judge(first))
        us = measure(clock, fn)
        again = _shape_of(fn(), cell.shape)
        _sync(cell.x.device)
        same = _same(first, again)
        left = counters() if counters else 0
        ok = err <= TOLERANCE[cell.dtype] and same and left == 0
        return dict(us=us, err=err, repeat_identical=same, counters_left=left, ok=ok)
    except Exception as exc:  # out of resources, compile errors: reported, the sweep goes on
        return dict(us=None, err=None, ok=False, error=f"{type(exc).__name__}: {str(exc)[:120]}")


def main() -> None:
    global REPS
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--budget", type=float, default=150.0, help="seconds; cells not started by then are skipped")
    ap.add_argument("--all-ops", action="store_true", help="also add_layer_norm and add_rms_norm")
    ap.add_argument("--wide-only", action="store_true", help="only the llm shapes with N >= 16384")
    ap.add_argument("--dtypes", default="bfloat16,float16")
    ap.add_argument("--shapes", default="", help="rows x N list instead of the llm shapes, e.g. 4x8192,2x16384")
    ap.add_argument("--device", default="cuda", help="cpu: a smoke test of this script in Triton's interpreter")
    ap.add_argument("--reps", type=int, default=REPS)
    ap.add_argument("--registers", action="store_true", help="only print the candidates' registers (no GPU needed)")
    args = ap.parse_args()
    if args.registers:
        registers()
        return
    REPS = args.reps
    t0 = time.time()
    dev = torch.device(args.device)
    bw = measure_copy_bandwidth(dev, nbytes=1 << 30 if dev.type == "cuda" else 1 << 24)
    clock = clock_for(dev)
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu (interpreter)"
    sms = torch.cuda.get_device_properties(dev).multi_processor_count if dev.type == "cuda" else 0
    print(f"{name} ({sms} SMs)  torch {torch.__version__}  triton {triton.__version__}  "
          f"copy {bw:.0f} GB/s", flush=True)
    result = {"device": name, "copy_gbs": bw, "torch": torch.__version__, "triton": triton.__version__,
              "cells": [], "skipped": []}
    path = os.path.join(args.out, "wide_row_tune.json")
    WATCH.update(result=result, path=path)
    ops = ("layer_norm", "rms_norm", "softmax", "log_softmax")
    if args.all_ops:
        ops += ("add_layer_norm", "add_rms_norm")
    shapes = LLM if not args.wide_only else [s for s in LLM if s[1] >= 16384]
    if args.shapes:
        shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    dtypes = [getattr(torch, d) for d in args.dtypes.split(",")]
    # the wide rows (the candidates' shapes) first, so a budget cut drops only narrow ones
    order = sorted(((shape, op, dtype) for shape in shapes for op in ops for dtype in dtypes),
                   key=lambda c: (c[0][1] < 16384, shapes.index(c[0]), ops.index(c[1])))
    for shape, op, dtype in order:
        dname = str(dtype).replace("torch.", "")
        if time.time() - t0 > args.budget:
            result["skipped"].append([op, dname, list(shape)])
            continue
        cell = Cell(op, dtype, shape, dev)
        pct = lambda us: None if us is None else 100.0 * cell.nbytes / (us * 1e-6) / 1e9 / bw
        with opforge.trace() as t:
            cell.public()
        default = run_candidate(clock, cell, cell.public, None)
        default["variant"] = t[0].variant if len(t) else "?"
        torch_us = measure(clock, cell.torch_call())
        cands = {}
        for label, fn, counters in cell.candidates():
            cands[label] = run_candidate(clock, cell, fn, counters, label)
        for r in [default] + list(cands.values()):
            r["pct"] = pct(r.get("us"))
        row = dict(op=op, dtype=dname, rows=shape[0], n=shape[1], nbytes=cell.nbytes, default=default,
                   torch_us=torch_us, torch_pct=pct(torch_us), candidates=cands)
        result["cells"].append(row)
        good = {k: v for k, v in cands.items() if v["ok"]}
        best = max(good.items(), key=lambda kv: kv[1]["pct"]) if good else None
        bad = [k for k, v in cands.items() if not v["ok"]]
        line = "  ".join(f"{k} {v['pct']:.1f}" if v.get("pct") else f"{k} FAIL" for k, v in cands.items())
        print(f"{op:14s} {dname:8s} {shape[0]:5d}x{shape[1]:<6d} default[{default['variant']}] "
              f"{default['pct']:.1f}%{'' if default['ok'] else ' WRONG'}  torch {pct(torch_us):.1f}%  | {line}"
              + (f"  | best {best[0]} {best[1]['pct']:.1f}%" if best else "")
              + (f"  | failed checks: {bad}" if bad else ""), flush=True)
        for k in bad:
            print(f"    {k}: {cands[k]}", flush=True)
        with open(path, "w") as f:
            json.dump(result, f, indent=1)
    tables(result)
    result["seconds"] = time.time() - t0
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    skipped = f"; skipped (budget): {result['skipped']}" if result["skipped"] else ""
    print(f"{time.time() - t0:.0f} s; JSON: {path}{skipped}")


def registers() -> None:
    """Registers and spills per thread of each row_split configuration (bf16, sm_90, ptxas -v): no GPU
    needed. Programs per SM = min(64 warps / W, 65536 / (32 W * registers rounded up to 8))."""
    import re
    import sys

    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from ptxas_tool import ptxas_verbose

    def report(kernel, sig: dict, consts: dict, aligned: tuple, warps: int) -> str:
        sig = dict(sig, **{k: "constexpr" for k in consts})
        attrs = {(kernel.arg_names.index(a),): [["tt.divisibility", 16]] for a in aligned}
        ptx = triton.compile(ASTSource(kernel, sig, constexprs=consts, attrs=attrs), target=GPUTarget("cuda", 90, 32),
                             options={"num_warps": warps}).asm["ptx"]
        text = ptxas_verbose(ptx)
        used = re.search(r"Used (\d+) registers", text)
        spill = re.search(r"(\d+) bytes spill stores", text)
        regs = int(used.group(1)) if used else 0
        per_sm = min(64 // warps, 65536 // (32 * warps * (-(-regs // 8) * 8))) if regs else 0
        return f"{regs} registers, {spill.group(1) if spill else '?'} B spilled, {per_sm} programs per SM"

    norm_ptrs = ("x_ptr", "r_ptr", "y_ptr", "s_ptr", "w_ptr", "b_ptr")
    norm_sig = {a: "*bf16" for a in norm_ptrs}
    norm_sig.update(part_ptr="*fp32", cnt_ptr="*i32", eps="fp32")
    norm_sig.update({a: "i32" for a in ("rows", "n", "x_inner", "x_so", "x_si", "r_inner", "r_so", "r_si", "units",
                                        "reset_at")})
    soft_sig = {"x_ptr": "*bf16", "y_ptr": "*bf16", "part_ptr": "*fp32", "cnt_ptr": "*i32"}
    soft_sig.update({a: "i32" for a in ("n", "x_inner", "x_so", "x_si", "units", "reset_at")})
    for block, warps, _ in SPLIT_CONFIGS[:4]:
        for op in ("layer_norm", "rms_norm", "add_layer_norm"):
            consts = dict(IS_RMS="rms" in op, HAS_RES=op.startswith("add_"), HAS_W=True, HAS_B="layer" in op,
                          BLOCK=block, SEGS_P2=16, TICKETS=True, PUBLISH_ONLY=False, PDL=True)
            info = report(norm_split._row_split_kernel, norm_sig, consts,
                          norm_ptrs + ("part_ptr", "cnt_ptr", "n", "x_so", "x_si", "r_so", "r_si"), warps)
            print(f"row_split {block}/{warps} {op:15s} {info}", flush=True)
        for op in ("softmax", "log_softmax"):
            consts = dict(LOG=op == "log_softmax", BLOCK=block, SEGS_P2=16, TICKETS=True, PUBLISH_ONLY=False)
            info = report(softmax_split._row_split_kernel, soft_sig, consts,
                          ("x_ptr", "y_ptr", "part_ptr", "cnt_ptr", "n", "x_so"), warps)
            print(f"row_split {block}/{warps} {op:15s} {info}", flush=True)


def tables(result: dict) -> None:
    """Print the ROW_SPLIT entries (and the SHIFT_SAMPLE verdict) where a candidate wins in every dtype."""
    by_key: dict[tuple, dict] = {}
    for c in result["cells"]:
        key = (c["op"], 2, triton.next_power_of_2(c["n"]))
        for label, r in c["candidates"].items():
            entry = by_key.setdefault(key, {}).setdefault(label, [])
            entry.append((r["ok"], (r["pct"] or 0.0) - (c["default"]["pct"] or 0.0)))
    norm, softmax, sample = {}, {}, []
    for key, labels in sorted(by_key.items()):
        wins = {label: min(g for _, g in v) for label, v in labels.items()
                if all(ok for ok, _ in v) and min(g for _, g in v) >= 1.0}
        split_wins = {k: g for k, g in wins.items() if k.startswith("row_split") and not k.endswith(" ids")}
        if split_wins:
            label = max(split_wins, key=split_wins.get)
            block, warps = (int(v) for v in label.split()[1].split("/"))
            (softmax if "softmax" in key[0] else norm)[key] = (block, warps)
        if "sample64" in wins:
            sample.append((key, wins["sample64"]))
        ids = {k: g for k, g in wins.items() if k.endswith(" ids")}
        if ids:
            print(f"note: {key} numbering segments by program id gains over the default: {ids} "
                  f"(kept off: CUDA does not promise programs start in id order)")
    print("\n# src/opforge/ops/norm/row_split.py")
    print(f"ROW_SPLIT: dict[tuple[str, int, int], tuple[int, int]] = {norm!r}")
    print("# src/opforge/ops/softmax/row_split.py")
    print(f"ROW_SPLIT: dict[tuple[str, int, int], tuple[int, int]] = {softmax!r}")
    print(f"# SHIFT_SAMPLE = 64 wins (>= 1 point, both dtypes) at: {sample or 'none'}")


if __name__ == "__main__":
    main()
