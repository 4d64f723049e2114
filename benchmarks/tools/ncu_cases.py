"""Single kernels to read with Nsight Compute: each case builds its inputs, checks the output
against float64 (or cuDNN for attention), then calls the op a few times so ``ncu --launch-skip``
can pick a warm launch.

    PYTHONPATH=src python3 benchmarks/tools/ncu_cases.py --list
    ncu --clock-control none -k regex:_planes_kernel --launch-skip 2 --launch-count 1 \\
        python3 benchmarks/tools/ncu_cases.py planes16_gate_up
    bash benchmarks/tools/ncu_cases.sh "$OUT"      # every case, one report each (GPU)
"""
from __future__ import annotations

import sys
from typing import Callable

import torch

import opforge
from opforge.ops.quant import repack
from opforge.testing import rel_error

Case = Callable[[], tuple[Callable[[], torch.Tensor], torch.Tensor]]


def _int4(n: int, k: int, m: int, layout: str = "planes") -> tuple[Callable[[], torch.Tensor], torch.Tensor]:
    gen = torch.Generator(device="cuda").manual_seed(n + k + m)
    q = opforge.quantize_weight(torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=gen) * 0.02,
                                bits=4, group_size=128)
    w = repack(q, layout) if layout != "rows" else q
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=gen)
    return (lambda: opforge.linear(x, w)), x.double() @ q.dequantize(torch.float64).T


def _int8(n: int, k: int, m: int) -> tuple[Callable[[], torch.Tensor], torch.Tensor]:
    gen = torch.Generator(device="cuda").manual_seed(n + k + m)
    q = opforge.quantize_weight(torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=gen) * 0.02,
                                bits=8, group_size=-1)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=gen)
    return (lambda: opforge.linear(x, q)), x.double() @ q.dequantize(torch.float64).T


def _prefill(b: int, h: int, s: int, d: int) -> tuple[Callable[[], torch.Tensor], torch.Tensor]:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        want = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).double()
    return (lambda: opforge.attention(q, k, v, causal=True)), want


def _layer_norm(rows: int, n: int) -> tuple[Callable[[], torch.Tensor], torch.Tensor]:
    x = torch.randn(rows, n, device="cuda", dtype=torch.float16)
    w = torch.randn(n, device="cuda", dtype=torch.float16)
    b = torch.randn(n, device="cuda", dtype=torch.float16)
    want = torch.nn.functional.layer_norm(x.double(), (n,), w.double(), b.double())
    return (lambda: opforge.layer_norm(x, w, b)), want


def _rms_norm(rows: int, n: int) -> tuple[Callable[[], torch.Tensor], torch.Tensor]:
    x = torch.randn(rows, n, device="cuda", dtype=torch.float16)
    w = torch.randn(n, device="cuda", dtype=torch.float16)
    want = torch.nn.functional.rms_norm(x.double(), (n,), w.double(), eps=1e-6)
    return (lambda: opforge.rms_norm(x, w)), want


def _softmax(rows: int, n: int) -> tuple[Callable[[], torch.Tensor], torch.Tensor]:
    x = torch.randn(rows, n, device="cuda", dtype=torch.float16)
    return (lambda: opforge.softmax(x, dim=-1)), torch.softmax(x.double(), dim=-1)


CASES: dict[str, Case] = {
    "planes16_gate_up": lambda: _int4(28672, 4096, 16),
    "planes16_down": lambda: _int4(4096, 14336, 16),
    "planes16_1b_down": lambda: _int4(2048, 8192, 16),
    "planes64_gate_up": lambda: _int4(28672, 4096, 64),
    "gemv1_gate_up": lambda: _int4(28672, 4096, 1, "rows"),
    "int8_16_gate_up": lambda: _int8(28672, 4096, 16),
    "prefill_d128_1k": lambda: _prefill(16, 32, 1024, 128),
    "planes1_8b_qkv": lambda: _int4(6144, 4096, 1),
    "planes1_8b_o": lambda: _int4(4096, 4096, 1),
    "layer_norm_65536": lambda: _layer_norm(1024, 65536),
    "rms_norm_65536": lambda: _rms_norm(1024, 65536),
    "softmax_65536": lambda: _softmax(1024, 65536),
}


def main(argv: list[str]) -> int:
    if not argv or argv[0] == "--list":
        print("\n".join(CASES))
        return 0
    fn, want = CASES[argv[0]]()
    err = rel_error(fn(), want)
    print(f"{argv[0]}: rel err vs reference {err:.3g}", flush=True)
    for _ in range(4):
        fn()
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
