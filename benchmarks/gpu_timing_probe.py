"""Is the first variant timed on a fresh set of weights slower than the same variant timed again?

Session 7's M = 1 sweep timed ``opforge.linear`` twice per weight set under two labels ("int8
linear", then "int8 linear wide": the same launch, since WIDE_K is the default); the first was
slower by up to 16% on 4 of 18 pairs (int8 1B lm_head 107.5 vs 92.9 us). This probe times, in the
sweep's setting (a CUDA graph of L launches over L different weights, ``graph_us``), each of
cuBLAS bf16, int8 and int4 ``opforge.linear`` three times in a row on the same weights, for the
shapes where the gap was largest, and writes every timing.

    PYTHONPATH=src python3 benchmarks/gpu_timing_probe.py     # GPU only; $OUT/timing_probe.json
"""
from __future__ import annotations

import sys

import torch

import opforge
from gpu_decode_breakdown import copies_for, graph_us, write_json

SHAPES = ((128256, 2048, "1B lm_head"), (28672, 4096, "8B gate_up"), (4096, 14336, "8B down"))


def main() -> int:
    if not torch.cuda.is_available():
        print("GPU only")
        return 0
    out: dict = {}
    for n, k, label in SHAPES:
        gen = torch.Generator(device="cuda").manual_seed(n + k)
        x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16, generator=gen)
        row = out.setdefault(label, {})
        dense = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=gen) * 0.02
                 for _ in range(copies_for(n * k * 2, False))]
        row["cublas bf16"] = [graph_us([lambda w=w: torch.nn.functional.linear(x, w) for w in dense]) for _ in range(3)]
        for bits, group, sym in ((8, -1, True), (4, 128, False)):
            qs = [opforge.quantize_weight(w, bits=bits, group_size=group, symmetric=sym) for w in dense]
            qs += [opforge.quantize_weight(dense[i % len(dense)] * 1.01, bits=bits, group_size=group, symmetric=sym)
                   for i in range(copies_for(n * k * bits // 8, False) - len(qs))]
            row[f"int{bits} linear"] = [graph_us([lambda q=q: opforge.linear(x, q) for q in qs]) for _ in range(3)]
            del qs
        row["cublas bf16 again"] = [graph_us([lambda w=w: torch.nn.functional.linear(x, w) for w in dense])]
        del dense
        torch.cuda.empty_cache()
        print(label, {name: [round(v, 1) for v in vals] for name, vals in row.items()}, flush=True)
    write_json(out, "timing_probe.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
