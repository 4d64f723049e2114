"""The int4 ``planes`` candidate (weights repacked by ``opforge.ops.quant.repack``, the Triton
``planes`` variant) against today's default int4 path and cuBLAS bf16, at batched-decode M.

1. Check: at the nine 1B/8B projection shapes and M = 2, 4, 8, 16, 32, 64 (bf16 x), the
   candidate's output against ``x.double() @ w.dequantize(float64).T`` (within bf16's tolerance),
   and its other forms (plain-op unpack, in-kernel split reduction, other splits and stages,
   fp16 x) at M = 16 and 64. (At one row a planes weight runs the decode variant's GEMV, which
   reads the planes layout: "planes" there is that GEMV, "planes mma" the planes kernel; the
   ``quant_batch`` bench suite now times the planes and rows layouts at 1..128 rows.)
   A candidate form that fails is not timed (it is a result, in ``errors``).
2. Time, as ``gpu_decode_breakdown.py``'s sweep does (its ``graph_us``): a CUDA graph of L
   launches over L different weights (>= 160 MB in all, L2-cold), same x; time per launch =
   replay / L. Per shape and M: cuBLAS bf16 ``F.linear``, ``opforge.linear`` on the rows-layout
   weight (today's default), ``opforge.linear`` on the planes weight (the candidate's default
   tiles), and the candidate's other forms. M = 16 and 64 first (the targets), then 1, 2, 4, 8,
   32 while the budget lasts.
3. A table (speed as a multiple of cuBLAS bf16) and the targets (>= 2.2x at M = 16, >= 1.6x at
   M = 64 on all nine shapes), for the default and the candidate. JSON to ``$OUT/int4_candidate.json``.

    PYTHONPATH=src python3 benchmarks/tools/int4_candidate.py                 # H100: under 3 minutes
    PYTHONPATH=src python3 benchmarks/tools/int4_candidate.py --cpu-smoke     # the logic, interpreter
    PYTHONPATH=src python3 benchmarks/tools/int4_candidate.py --ptx           # the product tiles compiled for sm_90, no GPU
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from typing import Any, Callable, Optional

if "--cpu-smoke" in sys.argv:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch
import torch.nn.functional as F

import opforge
from opforge.ops.quant import planes, planes_tiles, repack
from opforge.ops.quant.problem import prepare
from opforge.testing import TOLERANCE, rel_error

SHAPES_1B = [(3072, 2048, "1B qkv"), (2048, 2048, "1B o"), (16384, 2048, "1B gate_up"), (2048, 8192, "1B down"),
             (128256, 2048, "1B lm_head")]
SHAPES_8B = [(6144, 4096, "8B qkv"), (4096, 4096, "8B o"), (28672, 4096, "8B gate_up"), (4096, 14336, "8B down")]
SHAPE_8B_HEAD = (128256, 4096, "8B lm_head")


def oracle(x: torch.Tensor, qw: opforge.QuantizedWeight) -> torch.Tensor:
    return x.double() @ qw.dequantize(torch.float64).T


def copies_for(nbytes: int, smoke: bool) -> int:
    """Weights a timing graph cycles through: >= 160 MB in all, so every launch reads from DRAM."""
    return 2 if smoke else max(2, math.ceil(160e6 / nbytes))


def write_json(obj: Any, name: str, out_dir: Optional[str] = None) -> None:
    """``obj`` as JSON in ``out_dir/name`` (default: $OUT, else ./gpu-out), the folder made if missing."""
    out_dir = out_dir or os.environ.get("OUT", "./gpu-out")
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, name), "w") as f:
        json.dump(obj, f, indent=1)


def form_error(fn: Callable[[], torch.Tensor], want: torch.Tensor, dtype: torch.dtype = torch.bfloat16) -> Optional[str]:
    """Why a candidate form is not timed: its exception, or its error against the float64 ``want``
    at or over ``dtype``'s tolerance; None when it passes."""
    try:
        err = rel_error(fn(), want)
    except Exception as exc:   # a form that fails to compile or run is a result, not the end of the run
        return f"{type(exc).__name__}: {str(exc)[:200]}"
    return None if err < TOLERANCE[dtype] else f"rel err {err:.3g}"


def probe_parser(cli_help: str) -> argparse.ArgumentParser:
    """The probe tools' common options: ``--cpu-smoke``, ``--out`` and ``--cli ARGS`` (an opforge
    command run with the tool's earlier form in place, ``cli_help`` naming it)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--cpu-smoke", action="store_true")
    parser.add_argument("--out", default=os.environ.get("OUT", "./gpu-out"))
    parser.add_argument("--cli", nargs=argparse.REMAINDER, help=f"run `opforge ...` with {cli_help}")
    return parser


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

TARGETS = {16: 2.2, 64: 1.6}
ROWS_FIRST = (16, 64)
ROWS_LATER = (1, 2, 4, 8, 32)   # M = 1: "planes" is the GEMV reading the planes layout
#: The candidate's forms besides its default: name -> launch_planes keyword arguments, and the
#: rows they are timed at (the default tiles are always timed).
FORMS: dict[str, tuple[dict, tuple]] = {
    # Keywords: launch_planes' own ("config": (BLOCK_M, BLOCK_N, warps, stages, programs per SM,
    # chunks per step, scale ahead, one K = 128 dot per chunk, scale folded into the codes);
    # "programs_per_sm"; "fixup": the K splits added in the kernel by each tile's last split),
    # and the tool's: "extra", the last two config fields appended to the shape's default tiles;
    # "max_split", K splits capped (1: one launch per call, no combine kernel). A BLOCK_M below M
    # runs several M tiles side by side on the same weight tile (L2 shares it). At one row the
    # forms run the planes kernel on 16 padded rows.
    "unsplit": ({"max_split": 1}, (16, 32, 64)),
}
#: One-row forms of the planes kernel (16 padded rows): the default's tile with the K = 128 dot,
#: other stages, splits, chunks, warps and widths (``--one-row-forms`` adds them at M = 1-8).
ONE_ROW_FORMS: dict[str, tuple[dict, tuple]] = {
    f"1row {bn}x{w}w s{s} pps{pps} c{ch}{' ahead' if ahead else ''}{' k128' if k128 else ''}"
    f"{' fold' if fold else ''}": ({"config": (16, bn, w, s, pps, ch, ahead, k128, fold)}, (1, 2, 4, 8))
    for bn, w, s, pps, ch, ahead, k128, fold in (
        (64, 2, 3, 4, 2, False, False, False), (64, 2, 3, 4, 2, False, True, False),
        (64, 2, 4, 4, 2, False, True, False), (64, 2, 5, 4, 2, False, True, False),
        (64, 2, 6, 4, 2, False, True, False), (64, 2, 3, 2, 2, False, True, False),
        (64, 2, 3, 8, 2, False, True, False), (64, 2, 4, 8, 2, False, True, False),
        (64, 2, 4, 4, 1, False, True, False), (64, 2, 3, 4, 4, False, True, False),
        (64, 2, 3, 4, 2, True, True, False), (64, 2, 4, 4, 2, True, True, False),
        (64, 2, 3, 4, 2, False, True, True), (64, 2, 4, 4, 2, False, True, True),
        (64, 1, 3, 4, 2, False, True, False), (64, 1, 4, 8, 2, False, True, False),
        (32, 1, 3, 4, 2, False, True, False), (32, 2, 3, 4, 2, False, True, False),
        (32, 2, 4, 8, 2, False, True, False), (64, 4, 4, 4, 1, False, True, False),
        (64, 4, 4, 2, 1, False, True, False), (128, 4, 3, 4, 2, False, True, False),
        (128, 4, 4, 2, 2, False, True, False), (128, 4, 4, 4, 1, False, True, False))}
RESULTS: dict[str, Any] = {"rows": [], "errors": [], "skipped": [], "checks": []}


def check(label: str, fn: Callable[[], torch.Tensor], want: torch.Tensor, dtype: torch.dtype) -> bool:
    """``fn()`` against the float64 ``want``; the result (or the exception) recorded."""
    try:
        err = rel_error(fn(), want)
    except Exception as exc:   # a form that fails to compile or run is a result, not the end of the run
        RESULTS["errors"].append(f"{label}: {type(exc).__name__}: {str(exc)[:300]}")
        return False
    ok = err < TOLERANCE[dtype]
    RESULTS["checks"].append({"label": label, "rel_err": err, "ok": ok})
    if not ok:
        RESULTS["errors"].append(f"{label}: rel err {err:.3g} >= {TOLERANCE[dtype]}")
    return ok


def form_fn(call: Any, kwargs: dict) -> Callable[[], torch.Tensor]:
    if "extra" in kwargs:
        kwargs = {k: v for k, v in kwargs.items() if k != "extra"} | {
            "config": tuple(planes_tiles.planes_config(call.problem)) + tuple(kwargs["extra"])}

    cap = kwargs.get("max_split")
    kwargs = {k: v for k, v in kwargs.items() if k != "max_split"}

    def run() -> torch.Tensor:
        if cap is None:
            return planes.launch_planes(call, **kwargs)
        saved, planes.MAX_SPLIT = planes.MAX_SPLIT, cap
        try:
            return planes.launch_planes(call, **kwargs)
        finally:
            planes.MAX_SPLIT = saved
    return run


def shape_rows(n: int, k: int, label: str, ms: tuple, device: str, deadline: float, smoke: bool) -> None:
    """Check, then time, every M of ``ms`` at one (N, K): cuBLAS, the default, the candidate."""
    gen = torch.Generator(device=device).manual_seed(n * 7 + k)
    dense = [torch.randn(n, k, device=device, dtype=torch.bfloat16, generator=gen) * 0.02
             for _ in range(copies_for(n * k * 2, smoke))]
    n_q = copies_for(n * k // 2, smoke)
    qs = [opforge.quantize_weight(torch.randn(n, k, device=device, dtype=torch.bfloat16, generator=gen) * 0.02,
                                  bits=4, group_size=128) for _ in range(n_q)]
    ps = [repack(q, "planes") for q in qs]
    for m in ms:
        if time.time() > deadline:
            RESULTS["skipped"].append(f"{label} M={m}")
            continue
        row: dict[str, Any] = {"shape": label, "n": n, "k": k, "m": m, "us": {}}
        x = torch.randn(m, k, device=device, dtype=torch.bfloat16, generator=gen)
        want = oracle(x, qs[0])
        timed: dict[str, list] = {"cublas bf16": [lambda w=w: F.linear(x, w) for w in dense],
                                  "int4 default": [lambda q=q: opforge.linear(x, q) for q in qs]}
        if check(f"{label} M={m} planes", lambda: opforge.linear(x, ps[0]), want, torch.bfloat16):
            timed["planes"] = [lambda p=p: opforge.linear(x, p) for p in ps]
        calls = [prepare(x, p, None) for p in ps]
        row["planes_config"] = planes_tiles.planes_config(calls[0].problem)
        for name, (kwargs, rows) in FORMS.items():
            if m in rows and check(f"{label} M={m} {name}", form_fn(calls[0], kwargs), want, torch.bfloat16):
                timed[name] = [form_fn(c, kwargs) for c in calls]
        if m in (16, 64) and label in ("1B qkv", "8B gate_up"):   # fp16 x: the other code offset
            x16 = x.to(torch.float16)
            check(f"{label} M={m} planes fp16", lambda: opforge.linear(x16, ps[0]), oracle(x16, qs[0]),
                  torch.float16)
        for name, fns in timed.items():
            if device == "cuda":
                if name == "int4 default":
                    graph_us(fns)   # untimed: a weight set's first timing can read slow (gpu_decode_breakdown)
                row["us"][name] = graph_us(fns)
            else:
                for fn in fns[:1]:
                    fn()
                row["us"][name] = 0.0
        base = row["us"]["cublas bf16"]
        row["speedup"] = {name: (base / us if us else 0.0) for name, us in row["us"].items()}
        best = min((us, name) for name, us in row["us"].items() if name.startswith("planes"))[::-1] \
            if any(name.startswith("planes") for name in row["us"]) else (None, None)
        row["best_planes"] = best[0]
        RESULTS["rows"].append(row)
        cells = "  ".join(f"{name} {us:.1f}" for name, us in sorted(row["us"].items(), key=lambda kv: kv[1]))
        print(f"{label:11s} ({n}x{k}) M={m:2d}: {cells}", flush=True)
    del dense, qs, ps
    if device == "cuda":
        torch.cuda.empty_cache()


def summary() -> list[str]:
    """Per M: the range over shapes of default and candidate speed vs cuBLAS, and the targets."""
    lines = ["", "M   shapes  default x bf16     planes x bf16      best planes form x bf16  target"]
    for m in sorted({r["m"] for r in RESULTS["rows"]}):
        rows = [r for r in RESULTS["rows"] if r["m"] == m]

        def span(name: Optional[str] = None) -> str:
            vals = [r["speedup"].get(name or r["best_planes"] or "", 0.0) for r in rows]
            return f"{min(vals):.2f}-{max(vals):.2f}" if vals else "-"

        target = TARGETS.get(m)
        verdict = ""
        if target is not None:
            cand = min(r["speedup"].get("planes", 0.0) for r in rows)
            verdict = f">= {target}x: {'MET' if cand >= target and len(rows) == 9 else 'MISSED'}"
        lines.append(f"{m:<3d} {len(rows):<7d} {span('int4 default'):18s} {span('planes'):18s} "
                     f"{span():24s} {verdict}")
    lines.append("")
    lines.append("per shape (us): shape M cublas default planes best-form")
    for r in RESULTS["rows"]:
        us = r["us"]
        lines.append(f"  {r['shape']:11s} {r['m']:2d} {us['cublas bf16']:8.1f} {us['int4 default']:8.1f} "
                     f"{us.get('planes', float('nan')):8.1f} {r['best_planes']}")
    return lines


def ptx_report() -> int:
    """The product's tiles (``planes_tiles.PLANES_TILE_*``) compiled for sm_90 (no GPU):
    registers, spills, shared memory, the wgmma waits and whether the codes stay in registers
    (no ``local_alloc`` inside the K loop)."""
    import re

    from quant_ptx import report
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    import triton

    kernel = planes._planes_kernel
    ints = ("M", "N", "stride_xm", "stride_w", "chunks_per_split", "n_chunks", "m_tiles", "n_splits")
    aligned = ("x_ptr", "w_ptr", "gw_ptr", "b_ptr", "out_ptr", "N", "stride_xm", "stride_w")
    block_ms = {"TWO_WARPS_FEW_ROWS": 16, "TWO_WARPS": 16, "FEW_ROWS": 16, "FOUR_WARPS": 32, "WIDE": 16, "WIDE_FOLDED": 32,
                "WIDE_PER_PLANE": 32, "EIGHT_WARPS": 64, "LARGE": 64}
    failures = 0
    for name, block_m in block_ms.items():
        block_n, warps, stages, _, chunks, ahead, k128, fold = getattr(planes_tiles, "PLANES_TILE_" + name)
        for x, group in [("bf16", 128), ("fp16", 128), ("bf16", 32)]:
            consts = dict(GROUP=group, PER_ROW=False, HAS_BIAS=False, PARTIAL=True, FIXUP=False, F32_DOT=False,
                          CODE_MODE=1 if x == "bf16" else 2, BLOCK_M=block_m, BLOCK_N=block_n, ASM=True, PDL=False,
                          CHUNKS=chunks, SCALE_AHEAD=ahead, K128=k128 and group >= 128, FOLD=fold and group >= 128,
                          TMA=False, X_TMA=False)
            sig = {"x_ptr": "*" + x, "w_ptr": "*i32", "gw_ptr": "*i32", "b_ptr": "*" + x,
                   "out_ptr": "*" + x, "ws_ptr": "*fp32", "cnt_ptr": "*i32"}
            sig.update({a: "i32" for a in ints})
            sig.update({k: "constexpr" for k in consts})
            attrs = {(kernel.arg_names.index(a),): [["tt.divisibility", 16]] for a in aligned}
            label = f"{name} (BLOCK_M {block_m}) {x} g{group}"
            try:
                compiled = triton.compile(ASTSource(kernel, sig, constexprs=consts, attrs=attrs),
                                          target=GPUTarget("cuda", 90, 32), options={"num_warps": warps,
                                                                                     "num_stages": stages})
            except Exception as exc:
                failures += 1
                print(f"{label}: {type(exc).__name__}: {exc}"[:400])
                continue
            ttgir = compiled.asm["ttgir"]
            loop = ttgir[ttgir.index("scf.for"):]
            loop = loop[:loop.index("scf.yield")]
            waits = re.findall(r"wgmma\.wait_group\.sync\.aligned (\d+)", compiled.asm["ptx"])
            print(f"{label}: {report(compiled)}, in the K loop {loop.count('ttg.local_alloc')} local_alloc (codes "
                  f"through shared memory), {loop.count('async_copy_global_to_local')} pipelined copies; wgmma waits "
                  f"{len(waits)} (pendings {sorted(set(waits))})", flush=True)
    return 1 if failures else 0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cpu-smoke", action="store_true")
    parser.add_argument("--ptx", action="store_true", help="sm_90 compile report of the candidate's tiles only")
    parser.add_argument("--budget", type=float, default=120.0,
                        help="no new M row starts after this many seconds (the M = 16/64 pass always completes)")
    parser.add_argument("--out", default=os.environ.get("OUT", "./gpu-out"))
    parser.add_argument("--rows", default="", help="comma-separated M to time (default: 16,64 then 1,2,4,8,32)")
    parser.add_argument("--name", default="int4_candidate.json", help="the JSON file's name")
    parser.add_argument("--head8b", action="store_true", help="also the 8B output head (128256x4096)")
    parser.add_argument("--one-row-forms", action="store_true", help="also ONE_ROW_FORMS at M = 1-8")
    args = parser.parse_args()
    if args.one_row_forms:
        FORMS.update(ONE_ROW_FORMS)
    if args.ptx:
        return ptx_report()
    smoke = args.cpu_smoke or not torch.cuda.is_available()
    device = "cpu" if smoke else "cuda"
    RESULTS["device"] = "cpu smoke" if smoke else torch.cuda.get_device_name()
    deadline = time.time() + args.budget
    shapes = [(96, 256, "smoke")] if smoke else SHAPES_1B + SHAPES_8B + ([SHAPE_8B_HEAD] if args.head8b else [])
    passes = (tuple(int(m) for m in args.rows.split(",")),) if args.rows else (ROWS_FIRST, ROWS_LATER)
    for ms in passes:
        for n, k, label in shapes:
            shape_rows(n, k, label, ms if not smoke else tuple(m for m in ms if m in (1, 2, 16, 64)), device,
                       deadline, smoke)
    lines = summary()
    print("\n".join(lines))
    RESULTS["summary"] = lines
    write_json(RESULTS, args.name, args.out)
    print("errors:", RESULTS["errors"] or "none", "| skipped:", RESULTS["skipped"] or "none")
    return 1 if RESULTS["errors"] and smoke else 0


if __name__ == "__main__":
    sys.exit(main())
