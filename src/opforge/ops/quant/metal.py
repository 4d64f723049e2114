"""Metal kernels for ``linear`` with a quantized weight: launch wrappers and the ``metal`` variants.

The kernels are in ``quant.metal`` next to this file:

* ``qmv`` (M <= 16 rows of x, decode): one simdgroup per 4 output features; each lane reads
  16-byte chunks of packed words along K, unpacks them in registers as ``code - zero``, and
  accumulates ``scale * sum_k x * (code - zero)`` in float32 for every row of x; ``simd_sum``
  reduces across the lanes. When the feature groups alone are fewer than ``QMV_TARGET_GROUPS``
  threadgroups, K is split (``qmv_splits``): each split writes float32 partials and a combine
  kernel adds them in split order (deterministic), adds the bias and casts.
* ``qmm`` (M > 16, prefill): one threadgroup of 4 simdgroups per (32 rows, 32 features); per K
  tile of 32 the weight is dequantized to float32 in threadgroup memory and multiplied with
  ``simdgroup_matrix`` 8x8 tiles, float32 accumulators.

Scales and zeros are read as float32: weights whose scales are float16/bfloat16 (what
``quantize_weight`` stores) are converted on every call (one pass over N*K/group values).
On MPS tensors the kernels run through ``torch.mps.compile_shader``; on CPU tensors, with
``OPFORGE_METAL_EMULATE=1``, through the MSL emulator of the tests (``opforge.runtime.metal``).
Verified by emulation only: no timing on Apple hardware yet.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch

from ...runtime import alloc
from ...runtime.metal import library as metal_runtime
from ...runtime.errors import kernel_dtype_reason
from . import epilogue
from .problem import DECODE_MAX_M, LinearCall, LinearProblem

SOURCE = Path(__file__).with_name("quant.metal")
TYPE_NAMES = metal_runtime.TYPE_NAMES
SIMD_WIDTH = metal_runtime.SIMD_WIDTH
QMV_FEATURES = 4          # kQmvFeatures: output features per simdgroup
QMV_SIMDGROUPS = 2        # kQmvSimdgroups: simdgroups per qmv threadgroup
QMV_MAX_M = 16            # kMaxM
TILE = 32                 # kTile: qmm rows / features / K per tile
QMM_THREADS = 128         # kQmmThreads
VECTOR_WORDS = 4          # words per lane chunk of the wide qmv kernels
QMV_TARGET_GROUPS = 256   # split K until about this many qmv threadgroups (a large Apple GPU)
QMV_MAX_SPLITS = 16
QMV_MIN_SPLIT_CHUNKS = 64  # at least two chunks per lane in every split
COMBINE_THREADS = 256


def kernel_name(kind: str, dtype: torch.dtype, bits: int, vector_words: int = 1) -> str:
    """The MSL function of a kernel kind (``qmv``, ``qmm`` or ``combine``: the qmv K-split sum)
    for x's dtype and the weight's bits; qmv kernels also by words per lane chunk (1 or 4).

    Example:
        >>> kernel_name("qmv", torch.float16, 4, 4), kernel_name("qmm", torch.bfloat16, 8)
        ('quant_qmv_half_int4_v4', 'quant_qmm_bfloat_int8')
    """
    if kind == "combine":
        return f"quant_combine_{TYPE_NAMES[dtype]}"
    suffix = f"_v{vector_words}" if kind == "qmv" else ""
    return f"quant_{kind}_{TYPE_NAMES[dtype]}_int{bits}{suffix}"


def qmv_vector_words(bits: int, group: int) -> int:
    """Words each qmv lane reads at once: 4 (a 16-byte load) when a chunk of 4 words never
    straddles a group, else 1.

    Example:
        >>> qmv_vector_words(4, 128), qmv_vector_words(4, 16), qmv_vector_words(8, 16)
        (4, 1, 4)
    """
    return VECTOR_WORDS if group % (VECTOR_WORDS * (32 // bits)) == 0 else 1


def qmv_splits(n: int, chunks: int) -> int:
    """K splits for qmv at N features and ``chunks`` lane chunks along K: enough threadgroups
    (``QMV_TARGET_GROUPS``), at most ``QMV_MAX_SPLITS``, each split at least ``QMV_MIN_SPLIT_CHUNKS``.

    Example:
        >>> qmv_splits(4096, 128), qmv_splits(1024, 128), qmv_splits(64, 16)
        (1, 2, 1)
    """
    groups = -(-n // (QMV_FEATURES * QMV_SIMDGROUPS))
    want = -(-QMV_TARGET_GROUPS // groups)
    return max(1, min(want, QMV_MAX_SPLITS, chunks // QMV_MIN_SPLIT_CHUNKS))


def _operands(call: LinearCall) -> tuple:
    x, qw, bias = call.x, call.w, call.bias
    device, dtype = x.device, x.dtype
    metal_runtime.check_rows_binding("x", x, dtype, device)
    if bias is not None:
        metal_runtime.check_rows_binding("bias", bias, dtype, device)
    packed = qw.packed
    if not packed.is_contiguous() or packed.device != device:
        raise RuntimeError(f"metal launcher: the packed weight must be contiguous on {device}")
    scales = qw.scales_t.to(torch.float32).contiguous()
    zeros = scales if qw.zeros_t is None else qw.zeros_t.to(torch.float32).contiguous()
    p = call.problem
    words = p.k // (32 // p.bits)
    shape = [p.m, p.n, p.k, x.stride(0) if p.m > 1 else p.k, p.group, int(qw.zeros_t is None),
             int(bias is not None), words]
    return x, packed, scales, zeros, (bias if bias is not None else x), shape


def qmv(call: LinearCall, n_split: Optional[int] = None) -> torch.Tensor:
    """Run a ``LinearCall`` with up to 16 rows of x with the qmv kernel; (M, N) output, then
    viewed as ``call.out_shape``. ``n_split`` fixes the number of K splits (default ``qmv_splits``).

    Example (emulated on CPU; needs the test emulator and g++):
        >>> import os, torch, opforge                                      # doctest: +SKIP
        >>> from opforge.ops.quant.problem import prepare                  # doctest: +SKIP
        >>> os.environ["OPFORGE_METAL_EMULATE"] = "1"                      # doctest: +SKIP
        >>> qw = opforge.quantize_weight(torch.randn(40, 256), 4, 64)      # doctest: +SKIP
        >>> qmv(prepare(torch.randn(2, 256), qw, None)).shape              # doctest: +SKIP
        torch.Size([2, 40])
    """
    p = call.problem
    if p.m > QMV_MAX_M:
        raise RuntimeError(f"metal qmv takes at most {QMV_MAX_M} rows of x, got M={p.m}")
    x, packed, scales, zeros, bias, shape = _operands(call)
    out = alloc.empty((p.m, p.n), x.dtype, x.device)
    vw = qmv_vector_words(p.bits, p.group)
    if packed.storage_offset() * packed.element_size() % 16:   # a view: its rows are not 16-byte aligned
        vw = 1
    chunks = p.k // (vw * (32 // p.bits))
    splits = max(1, min(n_split or qmv_splits(p.n, chunks), chunks))
    per_split = -(-chunks // splits)
    splits = -(-chunks // per_split)          # no empty split
    shape += [splits, per_split]
    fn = metal_runtime.kernel(SOURCE, kernel_name("qmv", x.dtype, p.bits, vw), x.device.type)
    groups = -(-p.n // (QMV_FEATURES * QMV_SIMDGROUPS)) * splits
    part = alloc.empty((splits * p.m * p.n if splits > 1 else 1,), torch.float32, x.device)
    fn(x, packed, scales, zeros, bias, out, shape, part, threads=groups * QMV_SIMDGROUPS * SIMD_WIDTH,
       group_size=QMV_SIMDGROUPS * SIMD_WIDTH)
    if splits > 1:
        combine = metal_runtime.kernel(SOURCE, kernel_name("combine", x.dtype, p.bits), x.device.type)
        combine(part, bias, out, shape, threads=-(-p.m * p.n // COMBINE_THREADS) * COMBINE_THREADS,
                group_size=COMBINE_THREADS)
    return epilogue.finish(out, call)


def qmm(call: LinearCall) -> torch.Tensor:
    """Run a ``LinearCall`` (any number of rows) with the simdgroup-matrix qmm kernel; called
    as ``qmv`` (see its example), e.g. ``qmm(prepare(torch.randn(33, 256), qw, None))``."""
    p = call.problem
    x, packed, scales, zeros, bias, shape = _operands(call)
    out = alloc.empty((p.m, p.n), x.dtype, x.device)
    shape += [1, 0]
    fn = metal_runtime.kernel(SOURCE, kernel_name("qmm", x.dtype, p.bits), x.device.type)
    groups = -(-p.m // TILE) * -(-p.n // TILE)
    fn(x, packed, scales, zeros, bias, out, shape, threads=groups * QMM_THREADS, group_size=QMM_THREADS)
    return epilogue.finish(out, call)


def _reason(p: LinearProblem) -> Optional[str]:
    if p.dense:
        return "w is dense (torch's F.linear runs it)"
    if p.planes:
        return "the weight is in the planes layout (a Triton layout; the Metal kernels read rows)"
    if p.bits == 8 and p.k % 4:
        return f"K={p.k}: the Metal int8 kernels read 4 codes per 32-bit word (K a multiple of 4)"
    return kernel_dtype_reason("metal", p.dtype) or \
        metal_runtime.bfloat_reason(p.dtype, p.device_type, SOURCE, kernel_name("qmm", torch.bfloat16, 4))


def supports_qmv(p: LinearProblem) -> Optional[str]:
    """None if the qmv kernel takes problem ``p`` (M <= 16), else why not.

    Example:
        >>> from opforge.ops.quant.problem import LinearProblem
        >>> supports_qmv(LinearProblem(torch.float16, 1, 64, 256, 4, 128, False, False, "mps")) is None
        True
    """
    return _reason(p) or (None if p.m <= DECODE_MAX_M else f"M={p.m} rows > {DECODE_MAX_M}: qmm's")


def supports_qmm(p: LinearProblem) -> Optional[str]:
    """None if the qmm kernel takes problem ``p`` (any M), else why not."""
    return _reason(p)


VARIANTS = (
    ("qmv", supports_qmv, qmv,
     "M <= 16: a simdgroup per 4 features, 16-byte packed loads unpacked in registers, simd_sum, split K"),
    ("qmm", supports_qmm, qmm,
     "M > 16: K tiles of 32 dequantized to threadgroup memory, simdgroup 8x8 float32 accumulation"),
)
