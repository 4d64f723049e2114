"""Where the host time of one eager ``opforge.linear`` call goes on the GPU machine (session 5
found 82-148 us per call there against 34 us on the 2-core CI machine with kernels stubbed):
wall time per call for int4 / int8 / dense weights at M = 1, then cProfile's top entries.

    PYTHONPATH=src python3 benchmarks/gpu_host_profile.py [--out DIR]
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import time

import torch

import opforge


def wall_us(fn, calls: int) -> float:
    for _ in range(20):
        fn()
    torch.cuda.synchronize() if torch.cuda.is_available() else None
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    per = (time.perf_counter() - t) / calls * 1e6
    torch.cuda.synchronize() if torch.cuda.is_available() else None
    return per


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=os.environ.get("OUT", "./gpu-out"))
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    calls = args.calls if device == "cuda" else 50
    w = torch.randn(4096, 4096, device=device, dtype=torch.bfloat16) * 0.02
    x = torch.randn(1, 4096, device=device, dtype=torch.bfloat16)
    weights = {"int4 g128": opforge.quantize_weight(w, 4, 128), "int8": opforge.quantize_weight(w, 8, -1, symmetric=True),
               "dense": w}
    result: dict = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "wall_us": {}, "profile": {}}
    for name, weight in weights.items():
        result["wall_us"][name] = wall_us(lambda: opforge.linear(x, weight), calls)
        result["wall_us"][name + " (F.linear)"] = wall_us(lambda: torch.nn.functional.linear(x, w), calls)
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(calls):
            opforge.linear(x, weight)
        prof.disable()
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(18)
        result["profile"][name] = text.getvalue()
        print(f"{name}: {result['wall_us'][name]:.1f} us per call (F.linear {result['wall_us'][name + ' (F.linear)']:.1f})")
        print(text.getvalue()[-3500:])
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "host_profile.json"), "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
