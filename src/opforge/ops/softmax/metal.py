"""Metal kernels for softmax and log_softmax: launch wrappers and the ``metal`` variants.

The kernels are in ``softmax.metal`` next to this file. Three variants, chosen by the row
length N (the names of the Triton variants, so traces read alike):

* ``multirow`` (N <= 256): one simdgroup per row, eight rows per threadgroup, the row in
  registers; reductions are ``simd_max`` / ``simd_sum`` only, with no threadgroup memory.
* ``row`` (N <= 4096): one threadgroup per row, four elements per thread in registers;
  ``simd_max`` / ``simd_sum`` then threadgroup memory across simdgroups.
* ``looped`` (any N): one threadgroup per row; an online maximum and rescaled sum per thread
  in a first sweep, merged across the threadgroup, then a writing sweep.

On MPS tensors the kernels run through ``torch.mps.compile_shader``; on CPU tensors, with
``OPFORGE_METAL_EMULATE=1``, through the MSL emulator of the tests (see
``opforge.runtime.metal``). Kernels bind tensors with no dtype or layout check, so the
launcher checks the tensor it binds. Importing this module registers the variants.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch

from ...runtime import alloc
from ...runtime.errors import kernel_dtype_reason
from ...runtime.metal import library as metal_runtime
from .problem import SoftmaxCall, SoftmaxProblem

SOURCE = Path(__file__).with_name("softmax.metal")
SIMD_WIDTH = metal_runtime.SIMD_WIDTH
MULTIROW_MAX_N = 8 * SIMD_WIDTH      # kSimdReads * 32 in softmax.metal
MULTIROW_ROWS_PER_GROUP = 8
ROW_READS = 4                        # kRowReads in softmax.metal
MAX_GROUP = metal_runtime.MAX_GROUP
ROW_MAX_N = ROW_READS * MAX_GROUP
MAX_THREADS_PER_LAUNCH = 1 << 30     # grids stay well inside 32-bit thread positions

TYPE_NAMES = metal_runtime.TYPE_NAMES


def kernel_name(op: str, variant: str, dtype: torch.dtype) -> str:
    """The MSL function for (op, variant, dtype), e.g. ``log_softmax_row_half``."""
    return f"{op}_{variant}_{TYPE_NAMES[dtype]}"


def group_config(variant: str, n: int, rows: int, max_threads: int = MAX_GROUP) -> tuple[int, int]:
    """(threads per threadgroup, rows per threadgroup) for a variant at row length ``n``."""
    return metal_runtime.row_group_config(variant, n, rows, max_threads, MULTIROW_ROWS_PER_GROUP, ROW_READS)


def _launch(call: SoftmaxCall, variant: str) -> torch.Tensor:
    p = call.problem
    rows = call.x
    device = rows.tensor.device
    x = metal_runtime.check_rows_binding("x", rows.tensor, p.dtype, device)
    y = alloc.empty(call.shape, p.dtype, device)
    fn = metal_runtime.kernel(SOURCE, kernel_name(p.op, variant, p.dtype), device.type)
    max_threads = metal_runtime.max_threads_per_threadgroup(fn, MAX_GROUP)
    group, rows_per_group = group_config(variant, p.n, p.rows, max_threads)
    metal_runtime.launch_rows(fn, p.rows, group, rows_per_group, MAX_THREADS_PER_LAUNCH,
                              x, y, p.rows, p.n, rows.inner, rows.stride_outer, rows.stride_inner)
    return call.finish(y)


def launch_multirow(call: SoftmaxCall) -> torch.Tensor:
    return _launch(call, "multirow")


def launch_row(call: SoftmaxCall) -> torch.Tensor:
    return _launch(call, "row")


def launch_looped(call: SoftmaxCall) -> torch.Tensor:
    return _launch(call, "looped")


def _dtype_reason(p: SoftmaxProblem) -> Optional[str]:
    return kernel_dtype_reason("metal", p.dtype, "x") or \
        metal_runtime.bfloat_reason(p.dtype, p.device_type, SOURCE, kernel_name("softmax", "looped", torch.bfloat16))


def supports_multirow(p: SoftmaxProblem) -> Optional[str]:
    return _dtype_reason(p) or (None if p.n <= MULTIROW_MAX_N else f"N={p.n} > {MULTIROW_MAX_N}")


def supports_row(p: SoftmaxProblem) -> Optional[str]:
    return _dtype_reason(p) or (None if p.n <= ROW_MAX_N else
                                f"N={p.n} > {ROW_MAX_N}: {ROW_READS} elements per thread x {MAX_GROUP} threads")


def supports_looped(p: SoftmaxProblem) -> Optional[str]:
    return _dtype_reason(p)


VARIANTS = (
    ("multirow", supports_multirow, launch_multirow, "one simdgroup per row, several rows per threadgroup"),
    ("row", supports_row, launch_row, "one threadgroup per row, held in registers"),
    ("looped", supports_looped, launch_looped, "one threadgroup per row, online max and sum (any N)"),
)
