"""Check and time the Metal quantized-linear kernels (qmv / qmm) on an Apple GPU.

On a Mac with MPS: every case against the float64 oracle (outputs poisoned with NaN first),
PASS/FAIL per case, then median times of ``opforge.linear`` (metal) and of torch's path
(dequantize to x's dtype + ``F.linear`` on MPS), the ratio, and the packed-weight bandwidth
against a measured device copy. Writes JSON to ``$OUT/mps_quant.json``.

``--cpu-smoke`` runs the correctness part on tiny shapes in the MSL emulator (tests/metal_emu),
so a typo cannot waste a Mac run. Nothing here has run on Apple hardware yet.

    python benchmarks/tools/mps_check_quant.py            # on a Mac
    PYTHONPATH=src python benchmarks/tools/mps_check_quant.py --cpu-smoke
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]


def _sync(device: str) -> None:
    if device == "mps":
        torch.mps.synchronize()


def median_us(fn, device: str, reps: int = 30) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(times)


def copy_gbps(device: str) -> float:
    a = torch.empty(64 * 2 ** 20, dtype=torch.uint8, device=device)
    b = torch.empty_like(a)
    us = median_us(lambda: b.copy_(a), device)
    return 2 * a.numel() / us / 1e3


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny shapes in the MSL emulator, no timing")
    args = ap.parse_args()
    import opforge
    from opforge.runtime import alloc
    from opforge.testing import rel_error

    if args.cpu_smoke:
        sys.path.insert(0, str(ROOT / "tests"))
        import metal_emu
        from opforge.runtime.metal import library as metal_runtime
        metal_runtime.set_emulator(metal_emu.compile_shader)
        os.environ["OPFORGE_METAL_EMULATE"] = "1"
        device, shapes, ms = "cpu", [(64, 512)], (1, 4, 33)
    else:
        if not torch.backends.mps.is_available():
            print("no MPS device: run on a Mac, or use --cpu-smoke")
            return 1
        device, shapes, ms = "mps", [(4096, 4096), (11008, 4096), (4096, 11008)], (1, 4, 16, 64, 512)

    rows, results = [], []
    gbps = None if args.cpu_smoke else copy_gbps(device)
    torch.manual_seed(0)
    for n, k in shapes:
        for bits, group in ((4, 128), (4, 32), (8, 128)):
            qw = opforge.quantize_weight(torch.randn(n, k) * 0.05, bits, group).to(device)
            w64 = qw.to("cpu").dequantize(torch.float64)
            for m in ms:
                dtype = torch.float16
                label = f"int{bits} g{group} {n}x{k} M={m}"
                try:
                    x = torch.randn(m, k, dtype=dtype, device=device)
                    ref = x.cpu().double() @ w64.T
                    with opforge.backend("metal"), opforge.trace() as t, alloc.poisoned_outputs():
                        y = opforge.linear(x, qw)
                    err = rel_error(y, ref)
                    ok = err <= 2e-3 and len(t) == 1 and t[0].backend == "metal"
                    entry = {"case": label, "variant": t[0].variant if len(t) else "?", "rel_err": err, "pass": ok}
                    print(f"{'PASS' if ok else 'FAIL'}  {label:28s} {entry['variant']:4s} rel err {err:.2e}")
                    if not args.cpu_smoke:
                        w16 = qw.dequantize(dtype)
                        with opforge.backend("metal"):
                            us = median_us(lambda: opforge.linear(x, qw), device)
                        us_torch = median_us(lambda: F.linear(x, qw.dequantize(dtype)), device)
                        us_dense = median_us(lambda: F.linear(x, w16), device)
                        entry.update(us=us, us_torch_dequant=us_torch, us_dense_fp16=us_dense,
                                     pct_copy=100 * qw.nbytes / us / 1e3 / gbps)
                        rows.append((label, entry["variant"], f"{us:.1f}", f"{us_torch:.1f}",
                                     f"{us_torch / us:.2f}x", f"{us_dense:.1f}", f"{entry['pct_copy']:.0f}%"))
                except Exception as exc:  # report and continue
                    entry = {"case": label, "error": f"{type(exc).__name__}: {exc}", "pass": False}
                    print(f"FAIL  {label}: {entry['error']}")
                results.append(entry)
    if rows:
        print(f"\ncopy bandwidth {gbps:.0f} GB/s (read + write)")
        header = ("case", "variant", "metal us", "torch dequant+linear us", "speedup", "dense fp16 us", "% copy")
        widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
        for r in [header] + rows:
            print("  ".join(str(c).ljust(w) for c, w in zip(r, widths)))
    out = Path(os.environ.get("OUT", "./gpu-out"))
    out.mkdir(parents=True, exist_ok=True)
    (out / "mps_quant.json").write_text(json.dumps({"copy_gbps": gbps, "results": results}, indent=1))
    return 0 if all(r["pass"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
