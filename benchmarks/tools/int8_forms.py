"""int8 per-channel tiles of the swapped dot kernel at batched-decode M, against its default and
cuBLAS bf16: each form checked against float64 first, then timed as ``int4_candidate.py`` times
(a CUDA graph over L2-cold weights, time per launch).

    PYTHONPATH=src:benchmarks/tools python3 benchmarks/tools/int8_forms.py            # H100
    PYTHONPATH=src:benchmarks/tools python3 benchmarks/tools/int8_forms.py --cpu-smoke
"""
from __future__ import annotations

import os
import sys

if "--cpu-smoke" in sys.argv:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch
import torch.nn.functional as F

import opforge
from int4_candidate import SHAPES_1B, SHAPES_8B, copies_for, form_error, graph_us, oracle, write_json
from opforge.ops.quant import triton_kernels as tk
from opforge.ops.quant.problem import prepare

#: name -> (BLOCK_M, BLOCK_N, BLOCK_K, dot, warps, stages) of the swapped dot kernel, and its rows
FORMS = {
    "w2 s3": ((16, 64, 128, True, 2, 3), (16,)),
    "w2 s4": ((16, 64, 128, True, 2, 4), (16,)),
    "w2 k256 s3": ((16, 64, 256, True, 2, 3), (16,)),
    "w4 k256 s3": ((16, 64, 256, True, 4, 3), (16,)),
    "(128,4,3)": ((16, 128, 128, True, 4, 3), (16,)),
    "m32 w2 s3": ((32, 64, 128, True, 2, 3), (32,)),
    "m32 (128,4,3)": ((32, 128, 128, True, 4, 3), (32,)),
    "m64 as 4x16 w2": ((16, 64, 128, True, 2, 3), (64,)),
    "m64 as 2x32": ((32, 64, 128, True, 4, 3), (64,)),
    "m64 (128,8,3)": ((64, 128, 128, True, 8, 3), (64,)),
}


def main() -> int:
    smoke = "--cpu-smoke" in sys.argv or not torch.cuda.is_available()
    device = "cpu" if smoke else "cuda"
    rows, errors = [], []
    for n, k, label in ([(96, 256, "smoke")] if smoke else SHAPES_1B + SHAPES_8B):
        gen = torch.Generator(device=device).manual_seed(n + k)
        dense = [torch.randn(n, k, device=device, dtype=torch.bfloat16, generator=gen) * 0.02
                 for _ in range(copies_for(n * k * 2, smoke))]
        qs = [opforge.quantize_weight(torch.randn(n, k, device=device, dtype=torch.bfloat16, generator=gen) * 0.02,
                                      bits=8, group_size=-1) for _ in range(copies_for(n * k, smoke))]
        for m in (16, 32, 64):
            x = torch.randn(m, k, device=device, dtype=torch.bfloat16, generator=gen)
            want = oracle(x, qs[0])
            calls = [prepare(x, q, None) for q in qs]
            timed = {"cublas bf16": [lambda w=w: F.linear(x, w) for w in dense],
                     "default": [lambda q=q: opforge.linear(x, q) for q in qs]}
            for name, (cfg, ms) in FORMS.items():
                if m not in ms:
                    continue
                problem = form_error(lambda cfg=cfg: tk.launch_config(calls[0], cfg, swap=True), want)
                if problem:
                    errors.append(f"{label} M={m} {name}: {problem}")
                    continue
                timed[name] = [lambda c=c, cfg=cfg: tk.launch_config(c, cfg, swap=True) for c in calls]
            row = {"shape": label, "n": n, "k": k, "m": m, "us": {}}
            for name, fns in timed.items():
                if smoke:
                    fns[0]()
                    row["us"][name] = 0.0
                else:
                    row["us"][name] = graph_us(fns)
            rows.append(row)
            print(f"{label:11s} M={m:2d}: " + "  ".join(f"{a} {b:.1f}" for a, b in row["us"].items()), flush=True)
        del dense, qs
    write_json({"rows": rows, "errors": errors}, "int8_forms.json", "/tmp/smoke" if smoke else None)
    print("errors:", errors or "none")
    return 1 if errors and smoke else 0


if __name__ == "__main__":
    sys.exit(main())
