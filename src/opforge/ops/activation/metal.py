"""Metal kernels for gelu, silu, relu, swiglu and geglu: launch wrapper and the ``metal`` variant.

The kernels are in ``activation.metal`` next to this file, one per (activation, dtype); one
variant, ``pointwise`` (the name of the Triton variant, so traces read alike): one element
per thread, float32 math, rounded once. The three layouts of ``problem.py`` run in place:
``flat`` and ``dense`` inputs are walked as one row of ``numel`` elements (a dense output
gets the input's strides), ``rows`` inputs are addressed with two strides and give a packed
output; any other layout was already copied by ``prepare`` (and traced so).

On MPS tensors the kernels run through ``torch.mps.compile_shader``; on CPU tensors, with
``OPFORGE_METAL_EMULATE=1``, through the MSL emulator of the tests (see
``opforge.runtime.metal``). Kernels bind tensors with no dtype or layout check, so the
launcher checks every tensor it binds. Importing this module registers the variant.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch

from ...runtime import alloc
from ...runtime.errors import kernel_dtype_reason
from ...runtime.metal import library as metal_runtime
from .problem import GATED, ActivationCall, ActivationProblem

SOURCE = Path(__file__).with_name("activation.metal")
GROUP = 256                          # threads per threadgroup
MAX_THREADS_PER_LAUNCH = 1 << 30     # grids stay well inside 32-bit thread positions

TYPE_NAMES = metal_runtime.TYPE_NAMES


def kernel_name(op: str, approximate: Optional[str], dtype: torch.dtype) -> str:
    """The MSL function for (op, approximate, dtype), e.g. ``geglu_tanh_half``."""
    suffix = "_tanh" if op in ("gelu", "geglu") and approximate == "tanh" else ""
    return f"{op}{suffix}_{TYPE_NAMES[dtype]}"


def _checked(name: str, t: torch.Tensor, dtype: torch.dtype, device: torch.device, layout: str) -> torch.Tensor:
    """Kernels bind raw storage: refuse a tensor whose dtype, device or layout is wrong."""
    ok = t.dtype == dtype and t.device == device
    if layout == "flat":
        ok = ok and t.is_contiguous()
    elif layout == "rows":
        ok = ok and (t.dim() == 0 or t.shape[-1] <= 1 or t.stride(-1) == 1)
    if not ok:
        raise RuntimeError(f"metal launcher: {name} must be {dtype} on {device} laid out {layout!r}, "
                           f"got {t.dtype} on {t.device} with strides {t.stride()}")
    return t


def launch_pointwise(call: ActivationCall) -> torch.Tensor:
    p = call.problem
    x_rows = call.rows[0]
    u_rows = call.rows[1] if p.gated else x_rows
    device = x_rows.tensor.device
    x = _checked("gate" if p.gated else "x", x_rows.tensor, p.dtype, device, call.layout)
    u = _checked("up", u_rows.tensor, p.dtype, device, call.layout) if p.gated else x
    if call.layout == "rows":
        n = p.shape[-1]
        xa = (x_rows.inner, x_rows.stride_outer, x_rows.stride_inner)
        ua = (u_rows.inner, u_rows.stride_outer, u_rows.stride_inner)
        y = alloc.empty(p.shape, p.dtype, device)
    else:  # flat or dense: one row of numel elements, walked in storage order
        n = p.numel
        xa = ua = (1, 0, 0)
        if call.layout == "dense":
            # the storage starts at the smallest address of the view (strides are positive here)
            y = alloc.empty((p.numel,), p.dtype, device).as_strided(p.shape, x.stride())
        else:
            y = alloc.empty_packed_like(x)
        if call.layout == "dense":
            x = x.as_strided((p.numel,), (1,))
            u = u.as_strided((p.numel,), (1,)) if p.gated else x
    y_flat = y if call.layout == "rows" else y.as_strided((p.numel,), (1,))
    fn = metal_runtime.kernel(SOURCE, kernel_name(p.op, p.approximate, p.dtype), device.type)
    group = min(GROUP, metal_runtime.max_threads_per_threadgroup(fn, GROUP))
    total = p.numel
    for base in range(0, total, MAX_THREADS_PER_LAUNCH):
        count = min(MAX_THREADS_PER_LAUNCH, total - base)
        fn(x, u, y_flat, n, total, *xa, *ua, base, threads=count, group_size=group)
    return y


def _dtype_reason(p: ActivationProblem) -> Optional[str]:
    return kernel_dtype_reason("metal", p.dtype, "gate" if p.op in GATED else "x") or \
        metal_runtime.bfloat_reason(p.dtype, p.device_type, SOURCE, kernel_name("relu", None, torch.bfloat16))


def supports_pointwise(p: ActivationProblem) -> Optional[str]:
    return _dtype_reason(p)


VARIANTS = (
    ("pointwise", supports_pointwise, launch_pointwise, "one element per thread, float32 math, strided rows in place"),
)
