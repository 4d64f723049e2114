"""Check, then time, rotary_embedding, kv_cache_append and apply/revert_delay on a GPU.

    PYTHONPATH=src python3 benchmarks/tools/gpu_check_rope.py [--out DIR]      # < 80 s on an H100
    PYTHONPATH=src python3 benchmarks/tools/gpu_check_rope.py --cpu-smoke      # tiny shapes, interpreter

1. Correctness (budget ~36 s, mostly compiles): every kernel specialization class against the
   float64 oracle on fresh random data, outputs NaN-poisoned (ints: their minimum) first;
   PASS/FAIL per case. Fewer dtype x layout repeats than the first version (which spent 106 s here).
2. Copy bandwidth: a 512 MiB device-to-device copy (bytes read + written / median time).
3. Timings, most wanted first (the script stops timing at 75 s):
   delay at the largest (B=32, T=3072, C=32, int64/int32: the >= 85% of copy target) and the
   smallest size (B=1, C=9: the wall-time target vs one eager op); rotary decode and prefill
   (B=1, S=4096: the >= 90% of copy target), kv append, the fused rotary_kv_cache_append, a
   small tuning sweep of the rotary prefill kernel (tile size x num_warps), then the other
   delay sizes. GPU time: for small problems (< 32 MB moved) a CUDA graph of 50 calls replayed
   (launch gaps excluded, L2 warm: what a decode loop in a graph sees), for large ones
   do_bench's median (L2 flushed). The same method times the copy of the same bytes, so
   "vs copy" (copy time / op time) compares like with like. Wall time per call: a loop of calls,
   host clock, synchronize at the end (launch-bound sizes: this is what eager code pays).

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


GRAPH_CALLS = 50
GRAPH_BELOW = 32 << 20   # bytes moved: below, time a CUDA graph of calls; above, do_bench


def gpu_ms(fn: Callable[[], Any], nbytes: int = 1 << 40, graph: bool = True) -> tuple[float, str]:
    """(GPU time of one call of fn in ms, method). Small problems: a CUDA graph of GRAPH_CALLS
    calls (fn must be capturable: no host sync, no host-to-device copy); large ones and the
    rest: do_bench's median."""
    if DEV != "cuda":
        fn()
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3, "host"
    if graph and nbytes < GRAPH_BELOW:
        return graph_ms(fn), "graph"
    from triton.testing import do_bench
    return do_bench(fn, warmup=5, rep=20, return_mode="median"), "do_bench"


def graph_ms(fn: Callable[[], Any], replays: int = 10) -> float:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):   # warm up (compiles, caches) outside the capture
        fn()
        fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(GRAPH_CALLS):
            fn()
    g.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        g.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / (replays * GRAPH_CALLS)


def wall_us(fn: Callable[[], Any], n: int = 200) -> float:
    """Host wall time per call: n calls back to back (about 30 ms of calls at most), then synchronize."""
    fn()
    sync()
    start = time.perf_counter()
    for _ in range(3):
        fn()
    sync()
    per_call = (time.perf_counter() - start) / 3
    n = 2 if SMOKE else max(5, min(n, int(0.03 / max(per_call, 1e-7))))
    start = time.perf_counter()
    for _ in range(n):
        fn()
    sync()
    return (time.perf_counter() - start) / n * 1e6


def measure_copy_gbs() -> float:
    n = (1 << 20) if SMOKE else (256 << 20)          # int16 elements: 512 MiB
    src = torch.empty(n, dtype=torch.int16, device=DEV)
    dst = torch.empty_like(src)
    ms, _ = gpu_ms(lambda: dst.copy_(src), graph=False)
    return 2 * n * 2 / ms / 1e6


# ----------------------------------------------------------------------------------------- checks

CHECK_BUDGET_S = 36.0


def check(label: str, fn: Callable[[], float], tol: float) -> None:
    if time.perf_counter() - T0 > CHECK_BUDGET_S:
        print(f"SKIP  {label}  (check budget of {CHECK_BUDGET_S:.0f} s spent)", flush=True)
        RESULTS["checks"].append({"case": label, "skipped": "time budget", "ok": True})
        return
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
    """One case per specialization class that matters (dtype, pairing, partial rotary, layout,
    position shape; decode, prefill and odd sizes): each case compiles a kernel (~1 s), so the
    list is short and the timed configurations come first."""
    bf16, f16, f32 = torch.bfloat16, torch.float16, torch.float32
    i32, i64 = torch.int32, torch.int64
    rot = [(2, 4, 2, 3, 16)] * 4 if SMOKE else [(64, 32, 8, 1, 128), (1, 32, 8, 4096, 128), (3, 12, 4, 77, 64),
                                               (2, 16, 16, 33, 80)]
    app = [(2, 2, 2, 8, 16)] * 3 if SMOKE else [(64, 8, 1, 4096, 128), (1, 8, 4096, 8192, 128), (3, 4, 17, 40, 80)]
    dl = [(2, 40, 9)] * 3 if SMOKE else [(32, 3072, 32), (1, 3072, 9), (3, 1000, 70)]
    fused = [(2, 4, 2, 1, 8, 16)] * 3 if SMOKE else [(64, 32, 8, 1, 4096, 128), (1, 32, 8, 4096, 8192, 128),
                                                   (3, 12, 4, 17, 40, 80)]
    # (r as a fraction of D: 1, 1/2, 1/4; interleaved; layout; positions (B, S) or (S,))
    v0, v1, v2, v3 = (1, False, "packed", "2d"), (1, True, "transposed", "1d"), (2, False, "transposed", "2d"), \
        (4, True, "packed", "2d")
    rotary_plan = [(0, bf16, v) for v in (v0, v1, v2, v3)] + [(0, f16, v0), (0, f32, v3)] + \
        [(1, bf16, v0), (1, bf16, v2), (1, f16, v0), (2, bf16, v1), (3, bf16, v2)]
    delay_plan = [(0, i64, "apply_delay", "packed"), (0, i64, "revert_delay", "strided"),
                  (0, i32, "apply_delay", "strided"), (0, i32, "revert_delay", "packed"),
                  (1, i32, "apply_delay", "packed"), (1, i64, "revert_delay", "packed"),
                  (2, i64, "apply_delay", "strided")]
    for n, dt, op, layout in delay_plan:
        case = delay_cases.make_case(op, dl[n], dt, layout)
        check(f"{op} {dl[n]} {dt} {layout}", lambda c=case: run_case(c), 0.0)
    for shape in dl[:2]:
        check(f"delay round trip {shape}", lambda s=shape: round_trip_err(s), 0.0)
    for n, dt, (frac, inter, layout, pos) in rotary_plan:
        shape = rot[n]
        r = shape[-1] // frac
        case = rot_cases.make_rotary_case(shape, dt, r=r, interleaved=inter, layout=layout, positions=pos)
        check(f"rotary {shape} {dt} {case.label}", lambda c=case: run_case(c), TOLERANCE[dt])
    for shape in rot[:2]:
        check(f"rotary inplace {shape} bf16 transposed", lambda s=shape: rotary_inplace_err(s), TOLERANCE[bf16])
    for n, dt, layout in ((0, bf16, "packed"), (0, f32, "transposed"), (1, bf16, "packed"), (2, f16, "transposed")):
        case = rot_cases.make_append_case(app[n], dt, layout)
        check(f"kv_append {app[n]} {dt} {layout}", lambda c=case: run_case(c), 0.0)
    plain, partial = (1, False, "packed", False), (2, True, "transposed", True)
    for n, (frac, inter, layout, pos) in ((0, plain), (0, partial), (1, plain), (2, partial)):
        shape = fused[n]
        case = rot_cases.make_fused_case(shape, bf16, r=shape[-1] // frac if frac > 1 else 0, interleaved=inter,
                                         layout=layout, positions=pos)
        check(f"rotary_kv_cache_append {shape} bf16 {case.label}", lambda c=case: run_case(c), TOLERANCE[bf16])
    check("kv_append one past the end raises, cache untouched", append_past_end_err, 0.0)
    check("kv_append unchecked in a CUDA graph masks out-of-range writes", append_graph_err, 0.0)


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

def record(group: str, label: str, impl: str, nbytes: int, ms: float, method: str, wall: float,
           copy_gbs: float) -> None:
    pct = nbytes / ms / 1e6 / copy_gbs * 100 if ms > 0 else 0.0
    copy_ms = COPY_MS.get((group, label)) or COPY_MS.get(("rotary" if group == "sweep" else group,
                                                          label.split(" (")[0]))
    vs_copy = copy_ms / ms * 100 if copy_ms and ms > 0 else float("nan")
    row = {"group": group, "case": label, "impl": impl, "bytes": nbytes, "gpu_us": ms * 1e3, "method": method,
           "wall_us": wall, "pct_copy": pct, "pct_of_same_bytes_copy": vs_copy}
    RESULTS["timings"].append(row)
    ROWS.append((group, label, impl, f"{ms * 1e3:.1f}", method, f"{wall:.1f}", f"{pct:.0f}%", f"{vs_copy:.0f}%"))
    print(f"  {group:9s} {label:30s} {impl:30s} gpu {ms * 1e3:8.1f} us ({method:8s}) wall {wall:7.1f} us "
          f"{pct:5.0f}% of copy bw, {vs_copy:4.0f}% of same-bytes copy", flush=True)


BUDGET_S = 75.0
COPY_MS: dict[tuple, float] = {}


def timed(group: str, label: str, impl: str, nbytes: int, fn: Callable[[], Any], copy_gbs: float,
          graph: bool = True) -> None:
    """Time fn; ``graph=False`` for calls a CUDA graph cannot capture (host syncs or copies)."""
    if time.perf_counter() - T0 > BUDGET_S:
        print(f"  {group} {label} {impl}: skipped (time budget of {BUDGET_S:.0f} s spent)", flush=True)
        RESULTS["timings"].append({"group": group, "case": label, "impl": impl, "skipped": "time budget"})
        return
    try:
        ms, method = gpu_ms(fn, nbytes, graph)
        if impl == "copy of the same bytes":
            COPY_MS[(group, label)] = ms
        record(group, label, impl, nbytes, ms, method, wall_us(fn), copy_gbs)
    except Exception as exc:
        if DEV == "cuda":
            torch.cuda.synchronize()
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
            if dt == torch.bfloat16:
                timed("rotary", label, "torch composite", nbytes, lambda: torch_rope(q, k, cos, sin, pos), copy_gbs)
                qt = torch.randn(b, s, hq, d, dtype=dt, device=DEV).transpose(1, 2)
                kt = torch.randn(b, s, hkv, d, dtype=dt, device=DEV).transpose(1, 2)
                timed("rotary", label + " (B,S,H,D) view", "opforge", nbytes,
                      lambda: opforge.rotary_embedding(qt, kt, cos, sin, pos), copy_gbs)


def section_rotary_sweep(copy_gbs: float) -> None:
    """Rotary prefill (B=1, S=4096, bf16, D=R=128): heads per program x num_warps, new outputs and
    in place. The default is TILE=4096 (TILE // 64 pairs = all 32 q heads, all 8 k heads per
    program) with num_warps from the tile (4 here); TILE=1024 gives 16 q heads per program,
    512 gives 8."""
    from opforge.ops.rotary import triton_kernels as rtk
    b, hq, hkv, s, d = (1, 4, 2, 8, 16) if SMOKE else (1, 32, 8, 4096, 128)
    q, k, cos, sin, pos = rot_cases.make_rotary_inputs(b, hq, hkv, s, d, d, torch.bfloat16, DEV, "packed",
                                                      max_positions=8192 if not SMOKE else 64)
    nbytes = 2 * (q.numel() + k.numel()) * 2 + 2 * b * s * (d // 2) * 4 + pos.numel() * pos.element_size()
    label = f"prefill B={b} S={s} bfloat16"
    tile0, warps0 = rtk.TILE, rtk.NUM_WARPS
    try:
        for tile, warps in ((4096, 2), (4096, 8), (1024, 2), (1024, 4), (512, 2)):
            rtk.TILE, rtk.NUM_WARPS = tile, warps
            rtk._plans.clear()
            for inplace in (False, True):
                timed("sweep", label, f"tile {tile} warps {warps}{' inplace' if inplace else ''}", nbytes,
                      lambda ip=inplace: opforge.rotary_embedding(q, k, cos, sin, pos, inplace=ip), copy_gbs)
    finally:
        rtk.TILE, rtk.NUM_WARPS = tile0, warps0
        rtk._plans.clear()


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
              lambda: opforge.kv_cache_append(kc, vc, k, v, lens, check=True), copy_gbs, graph=False)
        timed("kv_append", label, "torch index assignment", nbytes, lambda: torch_append(kc, vc, k, v, lens), copy_gbs,
              graph=False)


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
        timed("fused", label, "torch composite", fused_bytes, torch_two, copy_gbs, graph=False)


DELAY_FIRST = [(32, 3072, 32), (1, 3072, 9)]           # the bandwidth target, the wall-time target
DELAY_REST = [(8, 3072, 32), (32, 3072, 9), (1, 3072, 32), (8, 3072, 9)]


def section_delay(copy_gbs: float, sizes) -> None:
    if SMOKE:
        sizes = [(2, 40, 32)] if sizes is DELAY_FIRST else [(1, 40, 9)]
    for b, t, c in sizes:
        for dt in (torch.int64, torch.int32):
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
            if b == 1:
                timed("delay", label, "torch eager add (1 op)", nbytes, lambda: torch.add(codes, 1), copy_gbs)
            if (b, t, c) in DELAY_FIRST or SMOKE:
                timed("delay", label, "torch gather (device delays)", nbytes,
                      lambda: delay_ref.apply_delay(codes, d_dev, 1026, 1025), copy_gbs, graph=False)
                pre = dia_indices(b, t, c, delays, False, DEV)
                timed("delay", label, "Dia-style, indices prebuilt", nbytes,
                      lambda: dia_gather(codes, 1026, 1025, pre), copy_gbs, graph=False)
                timed("delay", label, "Dia-style, indices per call", nbytes,
                      lambda: dia_gather(codes, 1026, 1025, dia_indices(b, t, c, delays, False, DEV)), copy_gbs,
                      graph=False)


def print_table() -> None:
    header = ("group", "case", "impl", "gpu us", "method", "wall us", "% copy bw", "% same-bytes copy")
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
    sections = (lambda g: section_delay(g, DELAY_FIRST), section_rotary, section_append, section_fused,
                section_rotary_sweep, lambda g: section_delay(g, DELAY_REST))
    for section in sections:
        try:
            section(copy_gbs)
        except Exception:
            traceback.print_exc()
    failures = sum(not c["ok"] for c in RESULTS["checks"])
    skipped = sum("skipped" in c for c in RESULTS["checks"])
    print()
    print_table()
    print(f"\n{len(RESULTS['checks']) - failures - skipped}/{len(RESULTS['checks'])} checks passed "
          f"({skipped} skipped for time); copy {copy_gbs:.0f} GB/s; {time.perf_counter() - T0:.0f} s")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "rope.json"), "w") as f:
        json.dump(RESULTS, f, indent=1, default=str)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
