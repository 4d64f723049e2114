"""Where does host time go in one small opforge call? Run on the GPU machine:

    PYTHONPATH=src python3 benchmarks/overhead_probe.py
"""
import cProfile
import pstats
import time

import torch
import torch.nn.functional as F

import opforge
from opforge.ops.norm import triton_kernels as tk
from opforge.ops.norm.problem import prepare
from opforge.runtime import registry


def per_call_us(fn, n=3000):
    for _ in range(100):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n * 1e6


x = torch.randn(2, 32, 256, device="cuda", dtype=torch.bfloat16)
w = torch.randn(256, device="cuda", dtype=torch.bfloat16)
b = torch.randn(256, device="cuda", dtype=torch.bfloat16)
call = prepare("layer_norm", x, None, w, b, 1e-5)
stages = {
    "F.layer_norm (eager)": lambda: F.layer_norm(x, (256,), w, b),
    "torch.empty_like": lambda: torch.empty_like(x),
    "prepare": lambda: prepare("layer_norm", x, None, w, b, 1e-5),
    "registry.select": lambda: registry.select("layer_norm", call.problem, "cuda"),
    "launch_multirow (alloc + launch)": lambda: tk.launch_multirow(call),
    "opforge.layer_norm": lambda: opforge.layer_norm(x, w, b),
    "F.rms_norm (eager)": lambda: F.rms_norm(x, (256,), w, 1e-6),
    "opforge.rms_norm": lambda: opforge.rms_norm(x, w),
}
for name, fn in stages.items():
    print(f"{name:36s} {per_call_us(fn):7.2f} us", flush=True)
prof = cProfile.Profile()
prof.enable()
for _ in range(2000):
    opforge.layer_norm(x, w, b)
prof.disable()
torch.cuda.synchronize()
pstats.Stats(prof).sort_stats("tottime").print_stats(25)
