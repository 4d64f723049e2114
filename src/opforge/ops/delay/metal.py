"""Metal kernel for apply_delay and revert_delay: launch wrapper and the ``metal`` variant.

The kernel is in ``delay.metal`` next to this file: one thread per output element, codes and
out addressed through their strides. On MPS tensors it runs through ``torch.mps.compile_shader``;
on CPU tensors, with ``OPFORGE_METAL_EMULATE=1``, through the MSL emulator of the tests.
Importing this module registers the variant.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch

from ...runtime import alloc
from ...runtime.metal import library as metal_runtime
from .problem import DelayCall, DelayProblem

SOURCE = Path(__file__).with_name("delay.metal")
GROUP = 256
MAX_THREADS_PER_LAUNCH = 1 << 30
INDEX_NAMES = {torch.int32: "int", torch.int64: "long"}


def launch(call: DelayCall) -> torch.Tensor:
    codes = call.codes
    device = codes.device
    out = call.out if call.out is not None else alloc.empty(codes.shape, codes.dtype, device)
    delays = call.delays
    if delays.dtype != torch.int32 or not delays.is_contiguous():
        delays = delays.to(torch.int32).contiguous()   # the kernel binds packed int delays
    if out.dtype != codes.dtype or out.device != device or delays.device != device:
        raise RuntimeError("metal launcher: codes, out and delays must share a device and codes' dtype")
    fn = metal_runtime.kernel(SOURCE, f"delay_{INDEX_NAMES[codes.dtype]}", device.type)
    b, t, c = codes.shape
    total = b * t * c
    sign = 1 if call.problem.op == "apply_delay" else -1
    group = min(GROUP, metal_runtime.max_threads_per_threadgroup(fn, GROUP))
    for base in range(0, total, MAX_THREADS_PER_LAUNCH):
        count = min(MAX_THREADS_PER_LAUNCH, total - base)
        fn(codes, delays, out, t, c, *codes.stride(), *out.stride(), sign, call.fill_before, call.fill_after,
           total, base, threads=count, group_size=group)
    return out


def supports(p: DelayProblem) -> Optional[str]:
    return None


VARIANTS = (("elementwise", supports, launch, "one thread per output element"),)
