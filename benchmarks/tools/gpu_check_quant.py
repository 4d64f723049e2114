"""Check, then time, opforge.linear with quantized weights on a GPU, against cuBLAS bf16 and
torch's own weight-only int4 (tinygemm) and int8 kernels.

Run on the GPU machine (well under 120 s on an H100):

    PYTHONPATH=src python3 benchmarks/tools/gpu_check_quant.py [--budget SECONDS] [--out DIR]
    PYTHONPATH=src python3 benchmarks/tools/gpu_check_quant.py --sweep         # tile configs, for tuning
    PYTHONPATH=src python3 benchmarks/tools/gpu_check_quant.py --cpu-smoke     # tiny shapes, interpreter

1. Correctness (at most ~45 s: first compiles): the timed formats at every variant's M, the other
   formats (int4/int8, group 32/128/-1, symmetric or not) at M = 1 and 17, the in-kernel split
   reduction against the combine kernel; outputs NaN-poisoned first, against
   ``x.double() @ w.dequantize(float64).T`` (‖out−ref‖/‖ref‖ within bf16 tolerance). The format's
   own quantization error against the dense weight is reported, not judged. torch's tinygemm is
   fed the same int4 codes and checked against the same oracle (reported).
2. Timing (``triton.testing.do_bench``, median, L2 flushed between runs) at (N, K) 4096x4096,
   14336x4096, 4096x14336, 28672x8192, 128256x2048 and M = 1, 4, 8, 16, 64, 4096, bf16 x:
   opforge int4 g128 (asymmetric), opforge int8 per-channel (symmetric, like torch's int8
   kernel) and int8 g128 at M = 1/16, cuBLAS bf16 ``F.linear``, torch int4 tinygemm (g128),
   torch ``_weight_int8pack_mm``, and at M = 4096 "dequantize to bf16 + cuBLAS" (torch ops).
   % of copy bandwidth counts packed weights + scales (+ zeros) + x + out; speedups are over bf16.
3. The targets, each PASS/MISS, then a compact table. JSON to ``$OUT/quant.json``.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import traceback
from typing import Any, Callable, Optional

if "--cpu-smoke" in sys.argv:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch
import torch.nn.functional as F

import opforge
from opforge.runtime import alloc
from opforge.testing import TOLERANCE, rel_error

SHAPES = [(4096, 4096), (14336, 4096), (4096, 14336), (28672, 8192), (128256, 2048)]
MS = [1, 4, 8, 16, 64, 4096]
#: Timed first, on every shape (the targets); then MS_LATER while the budget lasts.
MS_FIRST = [1, 16, 64, 4096]
MS_LATER = [4, 8]
T0 = time.perf_counter()


def elapsed() -> float:
    return time.perf_counter() - T0


class Bench:
    def __init__(self, device: str, budget: float):
        self.device, self.budget = device, budget

    def left(self) -> float:
        return self.budget - elapsed()

    def spent(self, label: str, results: dict) -> bool:
        """True (having said so and recorded ``label`` as skipped) when under 6 s are left."""
        if self.left() >= 6:
            return False
        print(f"-- budget spent: skipping {label} and later", flush=True)
        results["skipped"].append(label)
        return True

    def ms(self, fn: Callable[[], Any]) -> float:
        if self.device == "cuda":
            from triton.testing import do_bench
            return do_bench(fn, warmup=3, rep=15, return_mode="median")
        fn()
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3


def measure_copy_gbs(device: str) -> float:
    if device != "cuda":
        return float("nan")
    from triton.testing import do_bench
    src = torch.empty(1 << 28, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    ms = do_bench(lambda: dst.copy_(src), warmup=5, rep=40, return_mode="median")
    del src, dst
    return 2 * (1 << 30) / (ms * 1e-3) / 1e9


def pick_device(cpu_smoke: bool) -> Optional[str]:
    """"cpu" for a smoke run, "cuda" when there is one, else None (having said to use --cpu-smoke)."""
    if cpu_smoke:
        return "cpu"
    if not torch.cuda.is_available():
        print("no CUDA device: use --cpu-smoke", file=sys.stderr)
        return None
    return "cuda"


def oracle(x: torch.Tensor, qw: opforge.QuantizedWeight) -> torch.Tensor:
    return x.double() @ qw.dequantize(torch.float64).T


# -- torch peers ---------------------------------------------------------------------------------------

def tinygemm_pack(qw: opforge.QuantizedWeight):
    """torch's int4 weight-only format from our int4 codes: w = (q - 8) * scale + zero (bf16).

    Ours is (q - z) * s = (q - 8) * s + (8 - z) * s, so the same codes serve. The packing API
    changed across torch versions (int32 (N, K) codes before 2.5, uint8 (N, K/2) after), so both
    are tried; returns (mm function, description) or raises."""
    codes = qw.codes()
    n, k = qw.shape
    s = qw.scales.float()
    z = qw.zeros.float() if qw.zeros is not None else torch.full_like(s, 8.0)
    sz = torch.stack([s, (8.0 - z) * s], dim=-1).transpose(0, 1).contiguous().to(torch.bfloat16)  # (K/g, N, 2)
    errors = []
    for inner in (8, 4, 2):
        for name, packed_in in (("uint8", ((codes[:, ::2] << 4) | codes[:, 1::2]).to(torch.uint8)), ("int32", codes)):
            try:
                packed = torch._convert_weight_to_int4pack(packed_in.contiguous(), inner)
                fn = (lambda x, p=packed: torch._weight_int4pack_mm(x, p, qw.group, sz))
                fn(torch.zeros(1, k, dtype=torch.bfloat16, device=codes.device))
                return fn, f"tinygemm ({name} codes, innerKTiles={inner})"
            except Exception as exc:  # try the next form
                errors.append(f"{name}/{inner}: {type(exc).__name__}: {str(exc)[:80]}")
    raise RuntimeError("; ".join(errors))


def int8pack(w: torch.Tensor):
    """torch._weight_int8pack_mm with per-channel symmetric int8 codes of w (the same grid as
    opforge's int8 group -1 symmetric, whose codes are ours minus 128)."""
    qw = opforge.quantize_weight(w, 8, -1, symmetric=True)
    codes = (qw.codes() - 128).to(torch.int8).contiguous()
    scales = qw.scales.reshape(-1).to(w.dtype)
    fn = (lambda x: torch._weight_int8pack_mm(x, codes, scales))
    fn(torch.zeros(1, w.shape[1], dtype=w.dtype, device=w.device))
    return fn, qw


# -- 1. correctness --------------------------------------------------------------------------------------

CORRECTNESS_BUDGET = 30.0   # seconds: each new constexpr combination compiles (~1 s); timing comes next


def correctness(device: str, smoke: bool, results: dict) -> None:
    """The timed formats at every variant's M; the other formats at M = 1 and 17 (both kernels)."""
    n, k = (64, 256) if smoke else (1536, 2048)
    full = (1, 3, 17) if smoke else (1, 2, 3, 16, 17, 64, 100, 300)
    w = torch.randn(n, k, device=device) * 0.02
    few = (1, 3, 17)        # the GEMV kernel with 1 and 4 rows, the dot kernel
    plan = [(4, 128, False, full), (8, -1, True, (1, 2, 3, 16, 17)), (8, 128, False, (1, 16)),
            (4, 32, False, few), (4, -1, True, few), (4, 128, True, few), (8, 32, True, (1, 2, 17)),
            (8, -1, False, (1, 17))]
    for bits, g, sym, ms in plan:
        fmt = f"int{bits} g{g} {'sym' if sym else 'asym'}"
        if elapsed() > CORRECTNESS_BUDGET:
            results["skipped"].append(f"correctness {fmt}")
            print(f"-- correctness budget spent: skipping {fmt}", flush=True)
            continue
        qw = opforge.quantize_weight(w, bits, g, sym)
        qerr = rel_error(qw.dequantize(), w)
        if bits == 4 and g == 128 and not sym:
            check_fixup(device, qw, results)
        for m in ms:
            label = f"{fmt} {n}x{k} M={m}"
            try:
                x = torch.randn(m, k, device=device, dtype=torch.bfloat16)
                with alloc.poisoned_outputs(), opforge.strict(), opforge.backend("triton"), opforge.trace() as t:
                    y = opforge.linear(x, qw)
                err = rel_error(y, oracle(x, qw))
                ok = err <= TOLERANCE[torch.bfloat16]
                results["correctness"].append(dict(case=label, variant=t[0].variant, err=err, ok=ok, quant_err=qerr))
                print(f"{'PASS' if ok else 'FAIL'} {label:34s} {t[0].variant:8s} err {err:.2e}  "
                      f"(format vs dense weight: {qerr:.4f})", flush=True)
            except Exception as exc:
                results["correctness"].append(dict(case=label, ok=False, error=repr(exc)[:300]))
                print(f"FAIL {label}: {type(exc).__name__}: {exc}", flush=True)


def check_fixup(device: str, qw: opforge.QuantizedWeight, results: dict) -> None:
    """The in-kernel split reduction (SPLIT_FIXUP_GEMV/_DOT) against the oracle and the combine kernel, 20 calls."""
    from opforge.ops.quant import problem as qproblem, triton_kernels as qtk
    for m in (1, 8, 40):
        label = f"int4 g128 M={m} split reduction in the kernel (FIXUP)"
        try:
            x = torch.randn(m, qw.shape[1], device=device, dtype=torch.bfloat16)
            call = qproblem.prepare(x, qw, None)
            cfg = qtk.tile_config(call.problem)
            with alloc.poisoned_outputs():
                ref = qtk.launch_config(call, cfg, 8, fixup=False)
                outs = [qtk.launch_config(call, cfg, 8, fixup=True) for _ in range(20)]
            same = all(torch.equal(o, ref) for o in outs)
            exact = oracle(x, qw)
            err = max(rel_error(o, exact) for o in outs)
            ok = same and err <= TOLERANCE[torch.bfloat16]
            results["correctness"].append(dict(case=label, err=err, ok=ok, same_as_combine=same))
            print(f"{'PASS' if ok else 'FAIL'} {label}: err {err:.2e}, bitwise equal to the combine kernel: {same}",
                  flush=True)
        except Exception as exc:
            results["correctness"].append(dict(case=label, ok=False, error=repr(exc)[:300]))
            print(f"FAIL {label}: {type(exc).__name__}: {exc}", flush=True)


# -- 2. timing ------------------------------------------------------------------------------------------

def time_shape(bench: Bench, n: int, k: int, ms: list, copy_gbs: float, results: dict) -> None:
    dev = bench.device
    w = torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02
    q4 = opforge.quantize_weight(w, 4, 128)
    q8c = opforge.quantize_weight(w, 8, -1, symmetric=True)
    q8g = opforge.quantize_weight(w, 8, 128)
    peers: dict[str, Optional[Callable]] = {}
    notes = {}
    if dev == "cuda":
        try:
            peers["torch int4 tinygemm"], notes["tinygemm"] = tinygemm_pack(q4)
        except Exception as exc:
            notes["tinygemm"] = f"unavailable: {exc}"[:300]
        try:
            if min(ms) < 64:
                peers["torch int8pack"], _ = int8pack(w)
        except Exception as exc:
            notes["int8pack"] = f"unavailable: {type(exc).__name__}: {exc}"[:300]
    results["peer_notes"].update({f"{n}x{k} {key}": v for key, v in notes.items()})
    for m in ms:
        if bench.spent(f"{n}x{k} M={m}", results):
            continue
        x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        io_bytes = x.numel() * 2 + m * n * 2
        impls: list[tuple[str, Callable, int, Optional[opforge.QuantizedWeight]]] = [
            ("bf16 cuBLAS", lambda: F.linear(x, w), n * k * 2 + io_bytes, None),
            ("opforge int4 g128", lambda: opforge.linear(x, q4), q4.nbytes + io_bytes, q4),
            ("opforge int8 per-ch", lambda: opforge.linear(x, q8c), q8c.nbytes + io_bytes, q8c),
        ]
        if m in (1, 16):
            impls.append(("opforge int8 g128", lambda: opforge.linear(x, q8g), q8g.nbytes + io_bytes, q8g))
        if "torch int4 tinygemm" in peers:
            impls.append(("torch int4 tinygemm", lambda: peers["torch int4 tinygemm"](x),
                          n * k // 2 + (k // 128) * n * 4 + io_bytes, None))
        if "torch int8pack" in peers and m < 64:     # 36 ms .. 2.3 s per call from M = 64 on
            impls.append(("torch int8pack", lambda: peers["torch int8pack"](x), n * k + n * 2 + io_bytes, None))
        if m >= 1024:
            from opforge.ops.quant import problem as qproblem, triton_kernels as qtk
            call = qproblem.prepare(x, q4, None)
            gemm_cfg = qtk.tile_config(call.problem)
            impls.append(("opforge int4 triton-gemm", lambda: qtk.launch_config(call, gemm_cfg),
                          q4.nbytes + io_bytes, None))
            impls.append(("dequant+cuBLAS (torch)", lambda: F.linear(x, q4.dequantize(torch.bfloat16)),
                          q4.nbytes + n * k * 2 * 2 + io_bytes, None))
        base = None
        for name, fn, nbytes, qw in impls:
            row: dict[str, Any] = dict(shape=[n, k], m=m, impl=name)
            try:
                small = m <= 64 or n * k <= 4096 * 4096      # where the float64 oracle is cheap
                if name == "opforge int4 triton-gemm" and small:
                    with alloc.poisoned_outputs():
                        row["err"] = rel_error(fn(), oracle(x, q4))
                    row["ok"] = row["err"] <= TOLERANCE[torch.bfloat16]
                elif qw is not None and small:
                    with alloc.poisoned_outputs(), opforge.trace() as t:
                        y = fn()
                    row["variant"] = t[0].variant
                    row["err"] = rel_error(y, oracle(x, qw))
                    row["ok"] = row["err"] <= TOLERANCE[torch.bfloat16]
                elif name == "torch int4 tinygemm" and m <= 64:
                    row["err_vs_same_codes"] = rel_error(fn(), oracle(x, q4))
                elif qw is not None:
                    with opforge.trace() as t:
                        fn()
                    row["variant"] = t[0].variant
                row["ms"] = bench.ms(fn)
                row["pct_copy"] = 100.0 * nbytes / (row["ms"] * 1e-3) / 1e9 / copy_gbs
                if name == "bf16 cuBLAS":
                    base = row["ms"]
                row["speedup_vs_bf16"] = base / row["ms"] if base else None
            except Exception as exc:
                row["error"] = f"{type(exc).__name__}: {exc}"[:300]
                traceback.print_exc(limit=2)
            results["timing"].append(row)
            print(f"{n:>6d}x{k:<6d} M={m:<5d} {name:24s} " +
                  (f"{row['ms'] * 1e3:9.1f} us {row['pct_copy']:6.1f}% copy  x{row['speedup_vs_bf16'] or 0:5.2f}"
                   f"{'  err %.1e' % row['err'] if 'err' in row else ''}"
                   f"{'  (FAIL)' if row.get('ok') is False else ''}" if "ms" in row else row["error"]), flush=True)
    del w, q4, q8c, q8g, peers


# The defaults that are still guesses (int4 g128): (BLOCK_M, BLOCK_N, BLOCK_K, use_dot, warps, stages).
# GEMV (use_dot False) takes M <= BLOCK_M <= 16; the dot kernel any M. Defaults are marked.
SWEEP = {
    1: [(1, 128, 128, False, 4, 3), (1, 256, 128, False, 4, 3), (1, 64, 128, False, 4, 3),
        (1, 128, 256, False, 4, 3), (1, 256, 128, False, 8, 3), (16, 64, 128, True, 4, 3)],
    4: [(4, 128, 128, False, 4, 3), (4, 64, 128, False, 4, 3), (16, 64, 128, True, 4, 3)],
    8: [(16, 64, 128, True, 4, 3), (16, 128, 128, True, 4, 3), (8, 32, 128, False, 4, 3)],
    16: [(16, 64, 128, True, 4, 3), (16, 128, 128, True, 4, 3), (16, 32, 128, True, 4, 3), (16, 64, 128, True, 4, 4)],
    64: [(64, 64, 64, True, 4, 3), (64, 64, 128, True, 4, 3), (64, 128, 64, True, 4, 3), (32, 64, 128, True, 4, 3),
         (16, 128, 128, True, 4, 3)],
}
#: split targets (programs per SM) and the in-kernel split reduction, timed with the default tiles
SPLIT_CHOICES = [(2, False), (4, False), (8, False), (4, True), (8, True)]
#: rows at which "dequantize + cuBLAS" (the dequant_gemm variant) is timed against the Triton GEMM
DEQUANT_MS = [256, 1024, 4096]
SWEEP_BUDGET = 55.0


def sweep(bench: Bench, results: dict) -> None:
    """Time the choices whose defaults are guesses, int4 g128 on a small and a large shape: tile
    configs per M, split targets and the in-kernel split reduction (M <= 16), and the M from which
    dequantize + cuBLAS beats the Triton GEMM. Prints the best per (shape, M) last."""
    from opforge.ops.quant import problem as qproblem, triton_kernels as qtk
    smoke = bench.device == "cpu"
    bench.budget = min(bench.budget, SWEEP_BUDGET)
    best: dict = {}

    def timed(label: str, key: tuple, fn, ref, nbytes: int, default: bool, row: dict) -> None:
        if bench.left() < 3:
            results["skipped"].append(f"sweep {label}")
            return
        try:
            with alloc.poisoned_outputs():
                y = fn()
            if ref is not None:
                row["err"] = rel_error(y, ref)
                row["ok"] = row["err"] <= TOLERANCE[torch.bfloat16]
            row["ms"] = bench.ms(fn)
            row["pct_copy"] = 100.0 * nbytes / (row["ms"] * 1e-3) / 1e9 / results["copy_gbs"]
            if row.get("ok", True) and (key not in best or row["ms"] < best[key][0]):
                best[key] = (row["ms"], label, default)
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {exc}"[:200]
        results["sweep"].append(row)
        print(f"sweep {label:62s} " +
              (f"{row['ms'] * 1e3:8.1f} us {row['pct_copy']:5.1f}%{' err %.1e' % row['err'] if 'err' in row else ''}"
               f"{'  (FAIL)' if row.get('ok') is False else ''}{'  <- default' if default else ''}"
               if "ms" in row else row["error"]), flush=True)

    for n, k in [(64, 256)] if smoke else [(4096, 4096), (28672, 8192)]:
        w = torch.randn(n, k, device=bench.device, dtype=torch.bfloat16) * 0.02
        q4 = opforge.quantize_weight(w, 4, 128)
        x1 = torch.randn(1, k, device=bench.device, dtype=torch.bfloat16)
        base = bench.ms(lambda: F.linear(x1, w))
        print(f"sweep {n}x{k}: bf16 cuBLAS M=1 {base * 1e3:.1f} us", flush=True)
        for m, configs in SWEEP.items():
            x = torch.randn(m, k, device=bench.device, dtype=torch.bfloat16)
            call = qproblem.prepare(x, q4, None)
            default = qtk.tile_config(call.problem)
            ref = oracle(x, q4)
            nbytes = q4.nbytes + x.numel() * 2 + m * n * 2
            choices = [(cfg, qtk.PROGRAMS_PER_SM, qtk.split_fixup(cfg)) for cfg in (configs[:2] if smoke else configs)]
            if m <= 16:
                choices += [(default, pps, fx) for pps, fx in SPLIT_CHOICES
                            if (pps, fx) != (qtk.PROGRAMS_PER_SM, qtk.split_fixup(default))]
            for cfg, pps, fixup in choices:
                label = f"{n}x{k} M={m:<4d} {str(cfg):32s} pps={pps}{' fixup' if fixup else ''}"
                is_default = cfg == default and pps == qtk.PROGRAMS_PER_SM and fixup == qtk.split_fixup(default)
                row = dict(shape=[n, k], m=m, config=list(cfg), programs_per_sm=pps, fixup=fixup, default=is_default)
                timed(label, (n, k, m), lambda: qtk.launch_config(call, cfg, pps, fixup), ref, nbytes, is_default, row)
        for m in ([64] if smoke else DEQUANT_MS):
            x = torch.randn(m, k, device=bench.device, dtype=torch.bfloat16)
            call = qproblem.prepare(x, q4, None)
            gemm_cfg = qtk.tile_config(call.problem)
            nbytes = q4.nbytes + x.numel() * 2 + m * n * 2
            ref = oracle(x, q4) if m <= 256 else None
            default_dq = qproblem.DEQUANT_GEMM_MIN_M is not None and m >= qproblem.DEQUANT_GEMM_MIN_M
            for name, fn, is_default in (("triton GEMM", lambda: qtk.launch_config(call, gemm_cfg), not default_dq),
                                         ("dequant+cuBLAS", lambda: qtk.launch_dequant_gemm(call), default_dq),
                                         ("bf16 cuBLAS (dense)", lambda: F.linear(x, w), False)):
                label = f"{n}x{k} M={m:<4d} {name}"
                row = dict(shape=[n, k], m=m, impl=name, default=is_default)
                dense = name.startswith("bf16")
                timed(label, (n, k, m, "dense" if dense else "quant"), fn, None if dense else ref, nbytes, is_default,
                      row)
        del w, q4
    print("== sweep: best per (shape, M); 'quant' rows: Triton GEMM vs dequant+cuBLAS, 'dense': the bf16 reference")
    for key, (ms_, label, is_default) in best.items():
        verdict = "(reference)" if key[-1] == "dense" else "(the default)" if is_default else "(NOT the default)"
        print(f"  best {label:62s} {ms_ * 1e3:8.1f} us  {verdict}")
    skipped = [x for x in results["skipped"] if x.startswith("sweep")]
    if skipped:
        print(f"  sweep budget spent: {len(skipped)} choices not timed, from {skipped[0]}")
    results["sweep_best"] = {str(key): dict(ms=v[0], choice=v[1], default=v[2]) for key, v in best.items()}


def judge_targets(results: dict) -> list[str]:
    rows = {(tuple(r["shape"]), r["m"], r["impl"]): r for r in results["timing"] if "ms" in r}
    lines = []

    def check(label: str, impl: str, m: int, want: Callable[[dict], bool], shown: Callable[[dict], str]):
        for shape in SHAPES:
            r = rows.get((shape, m, impl))
            if r is None:
                lines.append(f"  ----  {label:44s} {shape[0]}x{shape[1]}: not measured")
                continue
            lines.append(f"  {'PASS' if want(r) else 'MISS'}  {label:44s} {shape[0]}x{shape[1]}: {shown(r)}")

    sp = (lambda r: f"x{r['speedup_vs_bf16']:.2f}")
    check("int4 g128 >= 3.0x bf16 at M=1", "opforge int4 g128", 1, lambda r: r["speedup_vs_bf16"] >= 3.0, sp)
    check("int4 g128 >= 80% of copy at M=1", "opforge int4 g128", 1, lambda r: r["pct_copy"] >= 80,
          lambda r: f"{r['pct_copy']:.1f}%")
    check("int4 g128 >= 2.0x bf16 at M=16", "opforge int4 g128", 16, lambda r: r["speedup_vs_bf16"] >= 2.0, sp)
    check("int4 g128 never slower than bf16 at M=64", "opforge int4 g128", 64, lambda r: r["speedup_vs_bf16"] >= 1.0, sp)
    check("int4 g128 >= 0.8x bf16 at M=4096", "opforge int4 g128", 4096, lambda r: r["speedup_vs_bf16"] >= 0.8, sp)
    for m in (1, 16):
        check(f"int8 per-channel >= 1.8x bf16 at M={m}", "opforge int8 per-ch", m,
              lambda r: r["speedup_vs_bf16"] >= 1.8, sp)
        check(f"int8 g128 >= 1.8x bf16 at M={m}", "opforge int8 g128", m, lambda r: r["speedup_vs_bf16"] >= 1.8, sp)
    return lines


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny shapes on the CPU through the interpreter")
    ap.add_argument("--budget", type=float, default=95.0)
    ap.add_argument("--sweep", action="store_true", help="only the tile-config sweep (a second run, for tuning)")
    ap.add_argument("--out", default=os.environ.get("OUT", "./gpu-out"))
    args = ap.parse_args()
    device = pick_device(args.cpu_smoke)
    if device is None:
        return 2
    torch.manual_seed(0)
    bench = Bench(device, args.budget)
    results: dict[str, Any] = dict(device=str(opforge.device_info()), torch=torch.__version__, correctness=[],
                                   timing=[], peer_notes={}, skipped=[], sweep=[], compare=[])
    try:
        import triton
        results["triton"] = triton.__version__
    except ImportError:
        pass
    copy_gbs = measure_copy_gbs(device)
    results["copy_gbs"] = copy_gbs
    print(f"device {results['device']}, torch {torch.__version__}, copy {copy_gbs:.0f} GB/s", flush=True)
    if args.sweep:
        sweep(bench, results)
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "quant_sweep.json"), "w") as f:
            json.dump(results, f, indent=1, default=str)
        print(f"wrote {os.path.join(args.out, 'quant_sweep.json')} ({elapsed():.0f} s)")
        return 0
    print("== correctness (vs x.double() @ w.dequantize(float64).T)", flush=True)
    try:
        correctness(device, args.cpu_smoke, results)
    except Exception:
        traceback.print_exc()
    print(f"== timing ({elapsed():.0f} s so far)", flush=True)
    shapes = [(64, 256), (96, 512)] if args.cpu_smoke else SHAPES
    phases = [[1, 16, 1024], [4, 17]] if args.cpu_smoke else [MS_FIRST, MS_LATER]
    ms = sorted(set(m for phase in phases for m in phase))
    for phase in phases:
        for n, k in shapes:
            try:
                time_shape(bench, n, k, phase, copy_gbs, results)
            except Exception:
                traceback.print_exc()
            if device == "cuda":
                torch.cuda.empty_cache()
    print(f"== targets (int4/int8 vs cuBLAS bf16, {elapsed():.0f} s)")
    for line in judge_targets(results):
        print(line)
    for key, note in results["peer_notes"].items():
        print(f"  peer {key}: {note}")
    print("== table: us (x speedup over bf16, % of copy on the bytes moved)")
    impls = []
    for r in results["timing"]:
        if r["impl"] not in impls:
            impls.append(r["impl"])
    print(f"{'shape':>14s} {'M':>5s} " + " ".join(f"{i[:22]:>24s}" for i in impls))
    by = {(tuple(r["shape"]), r["m"], r["impl"]): r for r in results["timing"]}
    for n, k in shapes:
        for m in ms:
            cells = []
            for i in impls:
                r = by.get(((n, k), m, i))
                cells.append(f"{'':>24s}" if r is None else f"{'error':>24s}" if "ms" not in r else
                             f"{r['ms'] * 1e3:8.1f} x{(r['speedup_vs_bf16'] or 0):4.2f} {r['pct_copy']:5.1f}%".rjust(24))
            print(f"{n:>7d}x{k:<6d} {m:>5d} " + " ".join(cells))
    bad = [c for c in results["correctness"] if not c.get("ok")] + \
          [r for r in results["timing"] if r.get("ok") is False]
    print(f"correctness: {len(results['correctness']) - sum(1 for c in results['correctness'] if not c.get('ok'))}"
          f"/{len(results['correctness'])} PASS; timing-run checks failing: {sum(1 for r in results['timing'] if r.get('ok') is False)}")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "quant.json"), "w") as f:
        json.dump(results, f, indent=1, default=str)
    print(f"wrote {os.path.join(args.out, 'quant.json')} ({elapsed():.0f} s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
