"""Check, then time, rotary_embedding, kv_cache_append and apply/revert_delay on a GPU.

    PYTHONPATH=src python3 benchmarks/gpu_check_rope.py [--out DIR]      # < 2 minutes on an H100
    PYTHONPATH=src python3 benchmarks/gpu_check_rope.py --cpu-smoke      # tiny shapes, interpreter

   rotary_kv_cache_append (one kernel) vs the two opforge calls and the torch composites; the
   % of copy of all three counts the fused op's bytes, so the two-call rows show what the
   rotated k's round trip through memory costs.
1. Correctness: every case against the float64 oracle on fresh random data, outputs NaN-poisoned
   (ints: their minimum) first; PASS/FAIL per case.
2. Copy bandwidth: a 512 MiB device-to-device copy (bytes read + written / median time).
3. Rotary at decode (B=64, S=1, Hq=32, Hkv=8, D=128) and prefill (B=1, S=4096) sizes, bf16 and
   fp16: opforge (new outputs and in place) vs the torch composite (gathered cos/sin, rotate_half,
   two multiplies and an add per tensor: what Hugging Face models run). KV append at decode
   (S_max=4096) and prefill (S_new=4096, S_max=8192), unchecked (graph path) and checked, vs an
   advanced-index assignment. GPU time (do_bench median) as % of copy, and wall time per call
   (a loop of calls, host clock after synchronize).
4. Delay: B = 1, 8, 32, T = 3072, C = 9 and 32, int32 and int64, apply and revert vs the torch
   gather (device delays) and the Dia-style formulation (host-built index tensors + advanced
   indexing + masks), with the index building included and excluded; wall time at the smallest
   size vs one torch eager elementwise op on the same tensor.

Prints PASS/FAIL lines, then a compact table; writes rope.json into --out (default $OUT or ./gpu-out).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from typing import Any, Callable

if "--cpu-smoke" in sys.argv:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch

import opforge
from opforge.ops.delay import cases as delay_cases, reference as delay_ref
from opforge.ops.rotary import cases as rot_cases
from opforge.runtime import alloc
from opforge.testing import TOLERANCE, max_rel_error

SMOKE = "--cpu-smoke" in sys.argv
DEV = "cpu" if SMOKE else "cuda"
T0 = time.perf_counter()
RESULTS: dict[str, Any] = {"checks": [], "timings": [], "device": None}
ROWS: list[tuple] = []


def sync() -> None:
    if DEV == "cuda":
        torch.cuda.synchronize()


def gpu_ms(fn: Callable[[], Any]) -> float:
    """Median GPU time of fn in ms (do_bench on CUDA; a short host-timed loop in the smoke run)."""
    if DEV == "cuda":
        from triton.testing import do_bench
        return do_bench(fn, warmup=10, rep=30, return_mode="median")
    fn()
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def wall_us(fn: Callable[[], Any], n: int = 200) -> float:
    """Host wall time per call: n calls back to back, then synchronize."""
    fn()
    sync()
    start = time.perf_counter()
    for _ in range(3):
        fn()
    sync()
    per_call = (time.perf_counter() - start) / 3
    n = 2 if SMOKE else max(5, min(n, int(0.1 / max(per_call, 1e-7))))   # about 0.1 s of calls at most
    start = time.perf_counter()
    for _ in range(n):
        fn()
    sync()
    return (time.perf_counter() - start) / n * 1e6


def measure_copy_gbs() -> float:
    n = (1 << 20) if SMOKE else (256 << 20)          # int16 elements: 512 MiB
    src = torch.empty(n, dtype=torch.int16, device=DEV)
    dst = torch.empty_like(src)
    ms = gpu_ms(lambda: dst.copy_(src))
    return 2 * n * 2 / ms / 1e6


# ----------------------------------------------------------------------------------------- checks

def check(label: str, fn: Callable[[], float], tol: float) -> None:
    try:
        err = fn()
        ok = err <= tol
    except Exception as exc:  # report and continue
        err, ok = float("nan"), False
        traceback.print_exc()
        label += f" ({type(exc).__name__}: {exc})"
    print(f"{'PASS' if ok else 'FAIL'}  {label}  rel err {err:.2e}", flush=True)
    RESULTS["checks"].append({"case": label, "rel_err": err, "ok": ok})


def run_case(case) -> float:
    args, kwargs = case.make(DEV)
    with alloc.poisoned_outputs(), opforge.trace() as t:
        out = case.call(*args, **kwargs)
    if len(t) != 1 or t[0].backend != "triton":
        raise RuntimeError(f"expected one triton call, trace: {[(e.backend, e.variant) for e in t]}")
    return max_rel_error(out, case.reference(args, kwargs, out))


def section_checks() -> None:
    rot = [(2, 4, 2, 3, 16)] if SMOKE else [(64, 32, 8, 1, 128), (1, 32, 8, 4096, 128), (3, 12, 4, 77, 64),
                                           (2, 16, 16, 33, 80)]
    app = [(2, 2, 2, 8, 16)] if SMOKE else [(64, 8, 1, 4096, 128), (1, 8, 4096, 8192, 128), (3, 4, 17, 40, 80)]
    dl = [(2, 40, 9)] if SMOKE else [(1, 3072, 9), (8, 3072, 32), (32, 3072, 9), (3, 1000, 70)]
    for n, shape in enumerate(rot):
        for dt in (torch.bfloat16, torch.float16, torch.float32) if n < 2 else (torch.bfloat16,):
            variants = ((0, False, "packed", "2d"), (0, True, "transposed", "1d"),
                        (shape[-1] // 2, False, "transposed", "2d"), (shape[-1] // 4, True, "packed", "2d"))
            for r, inter, layout, pos in variants:
                case = rot_cases.make_rotary_case(shape, dt, r=r, interleaved=inter, layout=layout, positions=pos)
                check(f"rotary {shape} {dt} {case.label}", lambda c=case: run_case(c), TOLERANCE[dt])
    for shape in rot[:2]:
        check(f"rotary inplace {shape} bf16 transposed", lambda s=shape: rotary_inplace_err(s),
              TOLERANCE[torch.bfloat16])
    for shape in app:
        for dt in (torch.bfloat16, torch.float16, torch.float32):
            for layout in ("packed", "transposed"):
                case = rot_cases.make_append_case(shape, dt, layout)
                check(f"kv_append {shape} {dt} {layout}", lambda c=case: run_case(c), 0.0)
    fused = [(2, 4, 2, 1, 8, 16)] if SMOKE else [(64, 32, 8, 1, 4096, 128), (1, 32, 8, 4096, 8192, 128),
                                               (3, 12, 4, 17, 40, 80)]
    for n, shape in enumerate(fused):
        for dt in (torch.bfloat16, torch.float16, torch.float32) if n < 2 else (torch.bfloat16,):
            for r, inter, layout, pos in ((0, False, "packed", False), (shape[-1] // 2, True, "transposed", True)):
                case = rot_cases.make_fused_case(shape, dt, r=r, interleaved=inter, layout=layout, positions=pos)
                check(f"rotary_kv_cache_append {shape} {dt} {case.label}", lambda c=case: run_case(c), TOLERANCE[dt])
    check("kv_append one past the end raises, cache untouched", append_past_end_err, 0.0)
    check("kv_append unchecked in a CUDA graph masks out-of-range writes", append_graph_err, 0.0)
    for shape in dl:
        for dt in (torch.int32, torch.int64):
            for op in ("apply_delay", "revert_delay"):
                for layout in ("packed", "strided"):
                    case = delay_cases.make_case(op, shape, dt, layout)
                    check(f"{op} {shape} {dt} {layout}", lambda c=case: run_case(c), 0.0)
        check(f"delay round trip {shape}", lambda s=shape: round_trip_err(s), 0.0)


def rotary_inplace_err(shape) -> float:
    b, hq, hkv, s, d = shape
    q, k, cos, sin, pos = rot_cases.make_rotary_inputs(b, hq, hkv, s, d, d, torch.bfloat16, DEV, "transposed")
    ref = rot_cases.rotary_oracle((q, k, cos, sin, pos), {})
    qo, ko = opforge.rotary_embedding(q, k, cos, sin, pos, inplace=True)
    assert qo is q and ko is k
    return max_rel_error((q, k), ref)


def append_past_end_err() -> float:
    kc, vc = torch.randn(2, 2, 8, 16, device=DEV), torch.randn(2, 2, 8, 16, device=DEV)
    k, v = torch.randn(2, 2, 3, 16, device=DEV), torch.randn(2, 2, 3, 16, device=DEV)
    kc0 = kc.clone()
    try:
        opforge.kv_cache_append(kc, vc, k, v, torch.tensor([5, 6], device=DEV))
    except IndexError:
        return float(not torch.equal(kc, kc0))
    return 1.0


def append_graph_err() -> float:
    if DEV != "cuda":
        return 0.0
    kc, vc = torch.zeros(2, 2, 4, 16, device=DEV), torch.zeros(2, 2, 4, 16, device=DEV)
    k, v = torch.randn(2, 2, 3, 16, device=DEV), torch.randn(2, 2, 3, 16, device=DEV)
    lens = torch.tensor([0, 0], dtype=torch.int32, device=DEV)
    opforge.kv_cache_append(kc, vc, k, v, lens)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        opforge.kv_cache_append(kc, vc, k, v, lens)
    kc.zero_()
    lens.copy_(torch.tensor([1, 3], dtype=torch.int32))
    graph.replay()
    torch.cuda.synchronize()
    want = torch.zeros_like(kc)
    want[0, :, 1:4] = k[0]
    want[1, :, 3:4] = k[1, :, :1]
    return float(not torch.equal(kc, want))


def round_trip_err(shape) -> float:
    codes = torch.randint(0, 1024, shape, device=DEV)
    d = delay_cases.dia_delays(shape[2])
    back = opforge.revert_delay(opforge.apply_delay(codes, d, bos_id=1026, pad_id=1025), d, pad_id=1025)
    survive = (torch.arange(shape[1], device=DEV).view(-1, 1) + torch.tensor(d, device=DEV)) < shape[1]
    return float(not (torch.equal(back[:, survive], codes[:, survive]) and bool((back[:, ~survive] == 1025).all())))


# ----------------------------------------------------------------------------------------- peers

def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def torch_rope(q, k, cos, sin, pos):
    """The usual eager composite: gather the tables, widen them to D, multiply-add per tensor."""
    c = cos[pos].unsqueeze(1)
    s = sin[pos].unsqueeze(1)
    c = torch.cat((c, c), dim=-1).to(q.dtype)
    s = torch.cat((s, s), dim=-1).to(q.dtype)
    return q * c + rotate_half(q) * s, k * c + rotate_half(k) * s


def torch_append(kc, vc, k, v, lens):
    """Sync-free advanced-index assignment: rows (b, pos) of the caches."""
    b, _, s_new, _ = k.shape
    pos = lens.long().view(b, 1) + torch.arange(s_new, device=k.device).view(1, s_new)
    bi = torch.arange(b, device=k.device).view(b, 1)
    kc[bi, :, pos] = k.permute(0, 2, 1, 3)
    vc[bi, :, pos] = v.permute(0, 2, 1, 3)


def dia_indices(b: int, t: int, c: int, delays, revert: bool, device):
    """Dia-style host-built indices: per-element (b, t, c) index triples and the shifted times."""
    d = torch.tensor(delays, dtype=torch.int32)
    seq = torch.arange(t, dtype=torch.int32).view(1, t, 1).expand(b, t, c)
    seq = seq + d.view(1, 1, c) if revert else seq - d.view(1, 1, c)
    clamped = seq.clamp(0, t - 1)
    bi = torch.arange(b, dtype=torch.int32).view(b, 1, 1).expand(b, t, c)
    ci = torch.arange(c, dtype=torch.int32).view(1, 1, c).expand(b, t, c)
    idx = torch.stack((bi.reshape(-1), clamped.reshape(-1), ci.reshape(-1)), dim=1).long()
    return seq.to(device), idx.to(device)


def dia_gather(codes, bos, pad, indices):
    seq, idx = indices
    gathered = codes[idx[:, 0], idx[:, 1], idx[:, 2]].view_as(codes)
    return torch.where(seq < 0, bos, torch.where(seq >= codes.shape[1], pad, gathered))


# ----------------------------------------------------------------------------------------- timing

def record(group: str, label: str, impl: str, nbytes: int, ms: float, wall: float, copy_gbs: float) -> None:
    pct = nbytes / ms / 1e6 / copy_gbs * 100 if ms > 0 else 0.0
    row = {"group": group, "case": label, "impl": impl, "bytes": nbytes, "gpu_us": ms * 1e3, "wall_us": wall,
           "pct_copy": pct}
    RESULTS["timings"].append(row)
    ROWS.append((group, label, impl, f"{ms * 1e3:.1f}", f"{wall:.1f}", f"{pct:.0f}%"))
    print(f"  {group:9s} {label:34s} {impl:28s} gpu {ms * 1e3:8.1f} us  wall {wall:7.1f} us  {pct:5.0f}% of copy",
          flush=True)


BUDGET_S = 110.0


def timed(group: str, label: str, impl: str, nbytes: int, fn: Callable[[], Any], copy_gbs: float) -> None:
    if time.perf_counter() - T0 > BUDGET_S:
        print(f"  {group} {label} {impl}: skipped (time budget of {BUDGET_S:.0f} s spent)", flush=True)
        RESULTS["timings"].append({"group": group, "case": label, "impl": impl, "skipped": "time budget"})
        return
    try:
        record(group, label, impl, nbytes, gpu_ms(fn), wall_us(fn), copy_gbs)
    except Exception as exc:
        print(f"  {group} {label} {impl}: ERROR {type(exc).__name__}: {exc}", flush=True)
        RESULTS["timings"].append({"group": group, "case": label, "impl": impl, "error": str(exc)})


def timed_copy(group: str, label: str, nbytes: int, copy_gbs: float) -> None:
    """A device-to-device copy moving the same bytes (read + written): the bar at this size."""
    src = torch.empty(max(1, nbytes // 4), dtype=torch.int16, device=DEV)
    dst = torch.empty_like(src)
    timed(group, label, "copy of the same bytes", nbytes, lambda: dst.copy_(src), copy_gbs)


def section_rotary(copy_gbs: float) -> None:
    shapes = {"decode": (64, 32, 8, 1, 128), "prefill": (1, 32, 8, 4096, 128)}
    if SMOKE:
        shapes = {"decode": (2, 4, 2, 1, 16), "prefill": (1, 4, 2, 8, 16)}
    for name, (b, hq, hkv, s, d) in shapes.items():
        for dt in (torch.bfloat16, torch.float16):
            q, k, cos, sin, pos = rot_cases.make_rotary_inputs(b, hq, hkv, s, d, d, dt, DEV, "packed",
                                                              max_positions=8192 if not SMOKE else 64)
            es = q.element_size()
            nbytes = 2 * (q.numel() + k.numel()) * es + 2 * b * s * (d // 2) * 4 + pos.numel() * pos.element_size()
            label = f"{name} B={b} S={s} {str(dt)[6:]}"
            timed_copy("rotary", label, nbytes, copy_gbs)
            timed("rotary", label, "opforge", nbytes, lambda: opforge.rotary_embedding(q, k, cos, sin, pos), copy_gbs)
            timed("rotary", label, "opforge inplace", nbytes,
                  lambda: opforge.rotary_embedding(q, k, cos, sin, pos, inplace=True), copy_gbs)
            timed("rotary", label, "torch composite", nbytes, lambda: torch_rope(q, k, cos, sin, pos), copy_gbs)
            qt = torch.randn(b, s, hq, d, dtype=dt, device=DEV).transpose(1, 2)
            kt = torch.randn(b, s, hkv, d, dtype=dt, device=DEV).transpose(1, 2)
            timed("rotary", label + " (B,S,H,D) view", "opforge", nbytes,
                  lambda: opforge.rotary_embedding(qt, kt, cos, sin, pos), copy_gbs)


def section_append(copy_gbs: float) -> None:
    shapes = {"decode": (64, 8, 1, 4096, 128), "prefill": (1, 8, 4096, 8192, 128)}
    if SMOKE:
        shapes = {"decode": (2, 2, 1, 8, 16), "prefill": (1, 2, 4, 8, 16)}
    for name, (b, h, s_new, s_max, d) in shapes.items():
        dt = torch.bfloat16
        kc = torch.randn(b, h, s_max, d, dtype=dt, device=DEV)
        vc = torch.randn_like(kc)
        k = torch.randn(b, h, s_new, d, dtype=dt, device=DEV)
        v = torch.randn_like(k)
        lens = torch.full((b,), s_max - s_new, dtype=torch.int32, device=DEV)
        nbytes = 4 * k.numel() * k.element_size() + lens.numel() * 4
        label = f"{name} B={b} S_new={s_new} bf16"
        timed_copy("kv_append", label, nbytes, copy_gbs)
        timed("kv_append", label, "opforge check=False", nbytes,
              lambda: opforge.kv_cache_append(kc, vc, k, v, lens, check=False), copy_gbs)
        timed("kv_append", label, "opforge check=True (syncs)", nbytes,
              lambda: opforge.kv_cache_append(kc, vc, k, v, lens, check=True), copy_gbs)
        timed("kv_append", label, "torch index assignment", nbytes, lambda: torch_append(kc, vc, k, v, lens), copy_gbs)


def section_fused(copy_gbs: float) -> None:
    """rotary_kv_cache_append vs the two opforge calls and the torch composites (bytes saved: k's round trip)."""
    shapes = {"decode": (64, 32, 8, 1, 4096, 128), "prefill": (1, 32, 8, 4096, 8192, 128)}
    if SMOKE:
        shapes = {"decode": (2, 4, 2, 1, 8, 16)}
    for name, (b, hq, hkv, s, s_max, d) in shapes.items():
        dt = torch.bfloat16
        q, k, cos, sin, _ = rot_cases.make_rotary_inputs(b, hq, hkv, s, d, d, dt, DEV, max_positions=s_max + 8)
        v = torch.randn_like(k)
        kc = torch.randn(b, hkv, s_max, d, dtype=dt, device=DEV)
        vc = torch.randn_like(kc)
        lens = torch.full((b,), s_max - s, dtype=torch.int32, device=DEV)
        pos = lens.view(b, 1) + torch.arange(s, device=DEV, dtype=torch.int32).view(1, s)
        es = q.element_size()
        table = 2 * b * s * (d // 2) * 4
        fused_bytes = (2 * q.numel() + 4 * k.numel()) * es + table
        label = f"{name} B={b} S={s} bf16"
        timed_copy("fused", label, fused_bytes, copy_gbs)
        timed("fused", label, "opforge fused check=False", fused_bytes,
              lambda: opforge.rotary_kv_cache_append(q, k, v, kc, vc, lens, cos, sin, check=False), copy_gbs)
        timed("fused", label, "opforge fused inplace", fused_bytes,
              lambda: opforge.rotary_kv_cache_append(q, k, v, kc, vc, lens, cos, sin, inplace=True, check=False),
              copy_gbs)

        def two_calls():
            q2, k2 = opforge.rotary_embedding(q, k, cos, sin, pos)
            opforge.kv_cache_append(kc, vc, k2, v, lens, check=False)

        def torch_two():
            q2, k2 = torch_rope(q, k, cos, sin, pos)
            torch_append(kc, vc, k2, v, lens)

        timed("fused", label, "opforge two calls", fused_bytes, two_calls, copy_gbs)
        timed("fused", label, "torch composite", fused_bytes, torch_two, copy_gbs)


def section_delay(copy_gbs: float) -> None:
    sizes = [(b, 3072, c) for c in (9, 32) for b in (1, 8, 32)]
    if SMOKE:
        sizes = [(1, 40, 9), (2, 40, 32)]
    for b, t, c in sizes:
        for dt in (torch.int32, torch.int64):
            codes = torch.randint(0, 1024, (b, t, c), dtype=dt, device=DEV)
            delays = delay_cases.dia_delays(c)
            d_dev = torch.tensor(delays, device=DEV)
            nbytes = 2 * codes.numel() * codes.element_size()
            label = f"B={b} T={t} C={c} {str(dt)[6:]}"
            out = torch.empty_like(codes)
            timed_copy("delay", label, nbytes, copy_gbs)
            timed("delay", label, "opforge apply", nbytes,
                  lambda: opforge.apply_delay(codes, delays, bos_id=1026, pad_id=1025), copy_gbs)
            timed("delay", label, "opforge apply out=", nbytes,
                  lambda: opforge.apply_delay(codes, delays, bos_id=1026, pad_id=1025, out=out), copy_gbs)
            timed("delay", label, "opforge revert", nbytes,
                  lambda: opforge.revert_delay(codes, delays, pad_id=1025), copy_gbs)
            timed("delay", label, "torch gather (device delays)", nbytes,
                  lambda: delay_ref.apply_delay(codes, d_dev, 1026, 1025), copy_gbs)
            pre = dia_indices(b, t, c, delays, False, DEV)
            timed("delay", label, "Dia-style, indices prebuilt", nbytes, lambda: dia_gather(codes, 1026, 1025, pre),
                  copy_gbs)
            timed("delay", label, "Dia-style, indices per call", nbytes,
                  lambda: dia_gather(codes, 1026, 1025, dia_indices(b, t, c, delays, False, DEV)), copy_gbs)
            if (b, c) == sizes[0][::2]:
                timed("delay", label, "torch eager add (1 op)", nbytes, lambda: torch.add(codes, 1), copy_gbs)


def print_table() -> None:
    header = ("group", "case", "impl", "gpu us", "wall us", "% copy")
    rows = [header] + ROWS
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(header))]
    for r in [header, tuple("-" * w for w in widths)] + ROWS:
        print("  ".join(str(x).ljust(w) for x, w in zip(r, widths)))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "./gpu-out"))
    ap.add_argument("--cpu-smoke", action="store_true")
    args = ap.parse_args()
    if DEV == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: use --cpu-smoke")
        return 2
    RESULTS["device"] = torch.cuda.get_device_name() if DEV == "cuda" else "cpu (smoke)"
    torch.manual_seed(0)
    with opforge.backend("triton"):   # what CUDA selects anyway; the smoke run needs it on CPU
        return _run(args)


def _run(args) -> int:
    section_checks()
    copy_gbs = measure_copy_gbs()
    RESULTS["copy_gbs"] = copy_gbs
    print(f"copy bandwidth {copy_gbs:.0f} GB/s  ({time.perf_counter() - T0:.0f} s so far)", flush=True)
    for section in (section_rotary, section_append, section_delay, section_fused):
        try:
            section(copy_gbs)
        except Exception:
            traceback.print_exc()
    failures = sum(not c["ok"] for c in RESULTS["checks"])
    print()
    print_table()
    print(f"\n{len(RESULTS['checks']) - failures}/{len(RESULTS['checks'])} checks passed; "
          f"copy {copy_gbs:.0f} GB/s; {time.perf_counter() - T0:.0f} s")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "rope.json"), "w") as f:
        json.dump(RESULTS, f, indent=1, default=str)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
