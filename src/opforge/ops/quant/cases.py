"""Checks of ``linear`` with quantized weights against the float64 oracle, for ``opforge verify``
and the tests: each kernel must compute what its QuantizedWeight holds."""
from __future__ import annotations

from typing import Any

import torch

from ...testing import Case
from . import linear
from .weight import quantize_weight


def oracle(args: tuple, kwargs: dict) -> torch.Tensor:
    """``x.double() @ w.dequantize(float64).T (+ bias)``, shaped like x with K replaced by N."""
    x, qw = args[0], args[1]
    bias = args[2] if len(args) > 2 else None
    y = x.double().reshape(-1, qw.shape[1]) @ qw.dequantize(torch.float64).T
    if bias is not None:
        y = y + bias.double()
    return y.reshape(*x.shape[:-1], qw.shape[0])


def make_case(m: int, n: int, k: int, dtype: torch.dtype, bits: int, group_size: int, symmetric: bool = False,
              bias: bool = False, layout: str = "packed") -> Case:
    """A Case: x (m, k) of ``dtype`` (rows strided when ``layout == "strided"``) times a weight
    quantized from random normal data."""

    def make(device: Any):
        qw = quantize_weight(torch.randn(n, k, device=device) * 0.05, bits, group_size, symmetric)
        if layout == "strided":
            x = torch.randn(m, k + 24, device=device, dtype=dtype)[:, 8:8 + k]
        else:
            x = torch.randn(m, k, device=device, dtype=dtype)
        args = (x, qw) + ((torch.randn(n, device=device, dtype=dtype),) if bias else ())
        return args, {}

    label = f"int{bits} g{group_size}{' sym' if symmetric else ''}{' +bias' if bias else ''}" + \
        ("" if layout == "packed" else f" {layout}")
    return Case("linear", (m, n, k), dtype, label, make, linear, oracle)


def verify_cases(device_type: str, quick: bool = False) -> list[Case]:
    """Both variants (decode M <= 16, prefill), int4 and int8, three group sizes, both zero kinds.
    float16/bfloat16 only: float32 x runs on the torch path by design."""
    if device_type == "cpu":   # the interpreter: tiny shapes
        n, k, ms = 64, 256, (1, 5, 33)
    else:
        n, k, ms = 4096, 4096, (1, 5, 16, 64, 1000, 2048)
    if quick:
        ms = ms[::2]
    cases = []
    for i, m in enumerate(ms):
        for bits in (4, 8):
            for j, group in enumerate((32, 128, -1)):
                dtype = torch.bfloat16 if (i + j) % 2 else torch.float16
                cases.append(make_case(m, n, k, dtype, bits, group, symmetric=bool((i + j + bits) % 2)))
    cases.append(make_case(3, n, k, torch.bfloat16, 4, 128, bias=True, layout="strided"))
    cases.append(make_case(40, n, k, torch.float16, 8, 64, bias=True, layout="strided"))
    return cases
