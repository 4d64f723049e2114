"""Metal kernels for rotary_embedding and kv_cache_append: launch wrappers and the ``metal`` variants.

The kernels are in ``rotary.metal`` next to this file, one thread per element pair (rotary) or
per element (append); see its header for the exact semantics, which match the Triton kernels:
a position outside the cos/sin table gives zeros in the rotated features, and an append
position outside ``[0, S_max)`` is not written. Rotary runs one launch for q and one for k.

On MPS tensors the kernels run through ``torch.mps.compile_shader``; on CPU tensors, with
``OPFORGE_METAL_EMULATE=1``, through the MSL emulator of the tests. Kernels bind tensors with no
dtype or layout check, so the launchers check what they bind. Importing this module registers
the variants.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch

from ...runtime import alloc
from ...runtime.metal import library as metal_runtime
from ...runtime.errors import kernel_dtype_reason
from .problem import AppendCall, FusedCall, RotaryCall, RotaryProblem

SOURCE = Path(__file__).with_name("rotary.metal")
GROUP = 256
MAX_THREADS_PER_LAUNCH = 1 << 30
TYPE_NAMES = metal_runtime.TYPE_NAMES
INDEX_NAMES = {torch.int32: "int", torch.int64: "long"}


def _bound(name: str, t: torch.Tensor, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Kernels bind raw storage: refuse a tensor whose dtype or device is wrong."""
    if t.dtype != dtype or t.device != device:
        raise RuntimeError(f"metal launcher: {name} must be {dtype} on {device}, got {t.dtype} on {t.device}")
    return t


def _dispatch(fn, total: int, *args) -> None:
    group = min(GROUP, metal_runtime.max_threads_per_threadgroup(fn, GROUP))
    for base in range(0, total, MAX_THREADS_PER_LAUNCH):
        count = min(MAX_THREADS_PER_LAUNCH, total - base)
        fn(*args, total, base, threads=count, group_size=group)


def _rotate_one(fn, x: torch.Tensor, o: torch.Tensor, call: RotaryCall, copy_tail: bool) -> None:
    b, h, s, d = x.shape
    half = call.problem.rotary_dim // 2
    w = half + (d - 2 * half if copy_tail else 0)
    pos = call.positions
    spb, sps = (pos.stride(0), pos.stride(1)) if pos.dim() == 2 else (0, pos.stride(0))
    _dispatch(fn, b * h * s * w, x, o, call.cos, call.sin, pos, s, h, half, call.cos.shape[0], spb, sps,
              call.cos.stride(0), call.sin.stride(0), *x.stride()[:3], *o.stride()[:3], w,
              int(call.problem.interleaved))


def launch_rotary(call: RotaryCall):
    p = call.problem
    device = call.q.device
    q = _bound("q", call.q, p.dtype, device)
    k = _bound("k", call.k, p.dtype, device)
    _bound("cos", call.cos, torch.float32, device)
    _bound("sin", call.sin, torch.float32, device)
    fn = metal_runtime.kernel(SOURCE, f"rope_{TYPE_NAMES[p.dtype]}_{INDEX_NAMES[call.positions.dtype]}", device.type)
    if call.inplace:
        qo, ko = q, k
    else:
        qo = alloc.empty(q.shape, q.dtype, device)
        ko = alloc.empty(k.shape, k.dtype, device)
    copy_tail = not call.inplace
    for x, o in ((q, qo), (k, ko)):
        if x.numel():
            _rotate_one(fn, x, o, call, copy_tail)
    return qo, ko


def launch_kv_append(call: AppendCall) -> None:
    p = call.problem
    device = call.k.device
    kc, vc, k, v = (_bound(n, t, p.dtype, device) for n, t in
                    (("k_cache", call.k_cache), ("v_cache", call.v_cache), ("k", call.k), ("v", call.v)))
    lens = call.cache_seqlens
    fn = metal_runtime.kernel(SOURCE, f"kv_append_{TYPE_NAMES[p.dtype]}_{INDEX_NAMES[lens.dtype]}", device.type)
    b, h, s_new, d = k.shape
    _dispatch(fn, b * h * s_new * d, kc, vc, k, v, lens, s_new, h, d, kc.shape[2], lens.stride(0),
              *kc.stride()[:3], *vc.stride()[:3], *k.stride()[:3], *v.stride()[:3])
    return None


def launch_fused(call: FusedCall) -> torch.Tensor:
    """Not fused on Metal: rotate q (in place or not) and k (into a temporary), then append."""
    rot, app = call.rot, call.app
    positions = call.positions()
    q, k = rot.q, rot.k
    rcall = RotaryCall(rot.problem, q, k, rot.cos, rot.sin, positions, False)
    fn = metal_runtime.kernel(SOURCE, f"rope_{TYPE_NAMES[q.dtype]}_{INDEX_NAMES[positions.dtype]}", q.device.type)
    qo = q if rot.inplace else alloc.empty(q.shape, q.dtype, q.device)
    k_rot = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    if q.numel():
        _rotate_one(fn, q, qo, rcall, not rot.inplace)
    _rotate_one(fn, k, k_rot, rcall, True)
    launch_kv_append(AppendCall(app.problem, app.k_cache, app.v_cache, k_rot, app.v, app.cache_seqlens))
    return qo


def launch(call):
    op = call.problem.op
    if op == "rotary_embedding":
        return launch_rotary(call)
    return launch_kv_append(call) if op == "kv_cache_append" else launch_fused(call)


def supports(p: RotaryProblem) -> Optional[str]:
    return kernel_dtype_reason("metal", p.dtype, "k_cache" if p.op == "kv_cache_append" else "q") or \
        metal_runtime.bfloat_reason(p.dtype, p.device_type, SOURCE, "rope_bfloat_int")


VARIANTS = (("elementwise", supports, launch, "one thread per rotated pair or copied element"),)
