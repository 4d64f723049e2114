"""Metal kernels for the normalizations: launch wrappers and the ``metal`` variants.

The kernels are in ``norm.metal`` next to this file. Three variants, chosen by the row
length N (the same names as the Triton variants, so traces read alike):

* ``multirow`` (N <= 256): one simdgroup per row, eight rows per threadgroup, the row in
  registers; reductions are ``simd_sum`` only, with no threadgroup memory or barriers.
* ``row`` (N <= 4096): one threadgroup per row, four elements per thread in registers;
  ``simd_sum`` then threadgroup memory across simdgroups.
* ``looped`` (any N): one threadgroup per row that sweeps the row three times.

On MPS tensors the kernels run through ``torch.mps.compile_shader``; on CPU tensors, with
``OPFORGE_METAL_EMULATE=1``, through the MSL emulator of the tests (see
``opforge.runtime.metal``). Kernels bind tensors with no dtype or layout check, so the
launcher checks every tensor it binds. Importing this module registers the variants.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import torch

from ...runtime import alloc
from ...runtime.errors import kernel_dtype_reason
from ...runtime.metal import library as metal_runtime
from .problem import NormCall, NormProblem

SOURCE = Path(__file__).with_name("norm.metal")
SIMD_WIDTH = metal_runtime.SIMD_WIDTH
MULTIROW_MAX_N = 8 * SIMD_WIDTH      # kSimdReads * 32 in norm.metal
MULTIROW_ROWS_PER_GROUP = 8
ROW_READS = 4                        # kRowReads in norm.metal
MAX_GROUP = metal_runtime.MAX_GROUP
ROW_MAX_N = ROW_READS * MAX_GROUP
MAX_THREADS_PER_LAUNCH = 1 << 30     # grids stay well inside 32-bit thread positions

TYPE_NAMES = metal_runtime.TYPE_NAMES


def kernel_name(op: str, variant: str, dtype: torch.dtype, weight_dtype: torch.dtype) -> str:
    """The MSL function for (op, variant, x dtype, weight/bias dtype), e.g. ``rms_norm_row_half_float``."""
    return f"{op}_{variant}_{TYPE_NAMES[dtype]}_{TYPE_NAMES[weight_dtype]}"


def group_config(variant: str, n: int, rows: int, max_threads: int = MAX_GROUP) -> tuple[int, int]:
    """(threads per threadgroup, rows per threadgroup) for a variant at row length ``n``."""
    return metal_runtime.row_group_config(variant, n, rows, max_threads, MULTIROW_ROWS_PER_GROUP, ROW_READS)


def _weight_dtype(call: NormCall) -> torch.dtype:
    """x's dtype when every affine tensor has it, else float32 (the others are converted)."""
    dtype = call.problem.dtype
    given = [t for t in (call.weight, call.bias) if t is not None]
    return dtype if all(t.dtype == dtype for t in given) else torch.float32


def _launch(call: NormCall, variant: str) -> Any:
    p = call.problem
    x_rows = call.x
    r_rows = call.residual if call.residual is not None else call.x
    device = x_rows.tensor.device
    x = metal_runtime.check_rows_binding("x", x_rows.tensor, p.dtype, device)
    r = metal_runtime.check_rows_binding("residual", r_rows.tensor, p.dtype, device)
    y = alloc.empty(call.shape, p.dtype, device)
    s = alloc.empty(call.shape, p.dtype, device) if p.has_residual else None
    w_dtype = _weight_dtype(call)
    w = None if call.weight is None else metal_runtime.check_rows_binding("weight", call.weight.to(w_dtype), w_dtype,
                                                                          device)
    b = None if call.bias is None else metal_runtime.check_rows_binding("bias", call.bias.to(w_dtype), w_dtype, device)
    fn = metal_runtime.kernel(SOURCE, kernel_name(p.op, variant, p.dtype, w_dtype), device.type)
    max_threads = metal_runtime.max_threads_per_threadgroup(fn, MAX_GROUP)
    group, rows_per_group = group_config(variant, p.n, p.rows, max_threads)
    flags = (1 if w is not None else 0) | (2 if b is not None else 0)
    dummy = y  # bound where a kernel reads nothing (no weight, no bias, no residual output)
    metal_runtime.launch_rows(fn, p.rows, group, rows_per_group, MAX_THREADS_PER_LAUNCH,
                              x, r, dummy if w is None else w, dummy if b is None else b, y,
                              dummy if s is None else s, p.rows, p.n, x_rows.inner, x_rows.stride_outer,
                              x_rows.stride_inner, r_rows.inner, r_rows.stride_outer, r_rows.stride_inner, flags,
                              float(call.eps))
    return (y, s) if s is not None else y


def launch_multirow(call: NormCall) -> Any:
    return _launch(call, "multirow")


def launch_row(call: NormCall) -> Any:
    return _launch(call, "row")


def launch_looped(call: NormCall) -> Any:
    return _launch(call, "looped")


def _dtype_reason(p: NormProblem) -> Optional[str]:
    return kernel_dtype_reason("metal", p.dtype, "x") or \
        metal_runtime.bfloat_reason(p.dtype, p.device_type, SOURCE, kernel_name("layer_norm", "looped", torch.bfloat16, torch.bfloat16))


def supports_multirow(p: NormProblem) -> Optional[str]:
    return _dtype_reason(p) or (None if p.n <= MULTIROW_MAX_N else f"N={p.n} > {MULTIROW_MAX_N}")


def supports_row(p: NormProblem) -> Optional[str]:
    return _dtype_reason(p) or (None if p.n <= ROW_MAX_N else
                                f"N={p.n} > {ROW_MAX_N}: {ROW_READS} elements per thread x {MAX_GROUP} threads")


def supports_looped(p: NormProblem) -> Optional[str]:
    return _dtype_reason(p)


VARIANTS = (
    ("multirow", supports_multirow, launch_multirow, "one simdgroup per row, several rows per threadgroup"),
    ("row", supports_row, launch_row, "one threadgroup per row, held in registers"),
    ("looped", supports_looped, launch_looped, "one threadgroup per row, three sweeps (any N)"),
)
