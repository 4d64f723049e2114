"""Host time of ``opforge.linear`` with a quantized weight, without a GPU: the Triton launches
replaced by no-ops, so what is left is the Python around them (validation, selection, tile
choice, K split, output and workspace allocation). Session 4 used it to rule the Python path out
as the cause of the slow small-shape end-to-end timings on the H100.

    TRITON_INTERPRET=1 PYTHONPATH=src python benchmarks/host_path_quant_cpu.py
"""
from __future__ import annotations

import os
import time

os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

import opforge  # noqa: E402
from opforge.ops.quant import triton_kernels as tk  # noqa: E402


def _no_launch(grid, args, num_warps=4, num_stages=2, key=None):
    return None


def main() -> None:
    tk._gemv = tk._qmm = tk._combine = _no_launch
    tk._sm_count = lambda index: 132          # the H100's, so K splits as there
    w = torch.randn(4096, 4096)
    print(f"torch {torch.__version__}, {os.cpu_count()} CPU cores; N=K=4096, bf16 x, kernels stubbed")
    for bits, group, symmetric in ((4, 128, False), (8, -1, True)):
        qw = opforge.quantize_weight(w, bits, group, symmetric=symmetric)
        for m in (1, 16):
            x = torch.randn(m, 4096, dtype=torch.bfloat16)
            with opforge.backend("triton"):
                for _ in range(50):
                    opforge.linear(x, qw)
                calls = 2000
                t = time.perf_counter()
                for _ in range(calls):
                    opforge.linear(x, qw)
                us = (time.perf_counter() - t) / calls * 1e6
            print(f"int{bits} g{group} M={m:<3d} {us:6.1f} us per call (host Python only)")


if __name__ == "__main__":
    main()
