"""EXPERIMENTAL, OFF, UNMEASURED: launch a Triton-compiled kernel with the CUDA driver's
``cuLaunchKernel`` through ctypes, skipping Triton's launcher.

Off unless ``OPFORGE_CUDA_LAUNCH=1``. Written and tested on a machine without a GPU (the
parameter packing against a fake ``cuLaunchKernel``); never run on a GPU yet, so no number
anywhere comes from it. It was checked and timed on an H100 (benchmarks/NOTES.md, Host overhead).

The kernel parameters of a Triton-compiled kernel are its arguments that are not constexpr, in
order (``compiled.src.signature``: constexprs and integers specialized as 1 are marked
``"constexpr"``), then two pointers, the global and profile scratch buffers (NULL: only kernels
without scratch are taken). Each plan gets its own packed parameter buffer: the integer slots are
written on its first launch (a plan's integers never change), pointer and float slots on every
launch, under a lock (``cuLaunchKernel`` copies the parameters, so the lock only spans the writes
and the call).
"""
from __future__ import annotations

import ctypes
import os
import threading
from typing import Any, Callable, Optional, Sequence

_CTYPES = {"i32": ctypes.c_int32, "i64": ctypes.c_int64, "u32": ctypes.c_uint32, "u64": ctypes.c_uint64,
           "fp32": ctypes.c_float, "f32": ctypes.c_float, "fp64": ctypes.c_double}

_requested = os.environ.get("OPFORGE_CUDA_LAUNCH", "") not in ("", "0")
_cu_launch: Optional[Callable[..., int]] = None


def enabled() -> bool:
    """Whether plans launch through ``cuLaunchKernel`` (``OPFORGE_CUDA_LAUNCH=1``; default off).

    Example:
        >>> isinstance(enabled(), bool)
        True
    """
    return _requested


def set_enabled(flag: bool) -> bool:
    """Turn the ctypes launch on or off for plans made from now on; returns the old setting.

    Example:
        >>> previous = set_enabled(False)
        >>> enabled()
        False
        >>> _ = set_enabled(previous)
    """
    global _requested
    previous, _requested = _requested, bool(flag)
    return previous


def _driver_launch() -> Optional[Callable[..., int]]:
    global _cu_launch
    if _cu_launch is None:
        try:
            lib = ctypes.CDLL("libcuda.so.1")
        except OSError:
            return None
        fn = lib.cuLaunchKernel
        fn.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        fn.restype = ctypes.c_int
        _cu_launch = fn
    return _cu_launch


def param_layout(signature: Sequence[str]) -> Optional[list[tuple[int, str]]]:
    """``[(argument position, type), ...]`` of the kernel parameters, or None for a type this
    launcher does not pack (tuples, tensor descriptors, 1-16-bit scalars).

    Example:
        >>> param_layout(["*bf16", "*bf16", "i32", "constexpr", "fp32", "constexpr"])
        [(0, '*bf16'), (1, '*bf16'), (2, 'i32'), (4, 'fp32')]
        >>> param_layout(["*fp32", "i1"]) is None
        True
    """
    layout = []
    for i, ty in enumerate(signature):
        if ty == "constexpr":
            continue
        if not isinstance(ty, str) or not (ty.startswith("*") or ty in _CTYPES):
            return None
        layout.append((i, ty))
    return layout


def launcher_for(compiled: Any, launch: Optional[Callable[..., int]] = None) -> Optional[Callable[..., None]]:
    """``go(grid_x, stream, raw_args)`` launching ``compiled`` (a Triton ``CompiledKernel``) on a
    1-D grid with ``cuLaunchKernel``, or None where it does not apply (no libcuda, scratch
    buffers, clusters, cooperative or PDL launches, sanitizer instrumentation, an argument type it
    does not pack).

    ``launch`` replaces the driver function (for tests). Every call of one ``go`` must pass the
    same integer arguments (a plan's are fixed); pointers and floats may change.
    """
    md = getattr(compiled, "metadata", None)
    src = getattr(compiled, "src", None)
    signature = getattr(src, "signature", None)
    if md is None or not isinstance(signature, dict):
        return None
    if getattr(md, "global_scratch_size", 0) or getattr(md, "profile_scratch_size", 0) \
            or getattr(md, "num_ctas", 1) != 1 or getattr(md, "launch_cooperative_grid", False) \
            or getattr(md, "launch_pdl", False) or "gsan" in str(getattr(md, "instrumentation_mode", "")) or tuple(getattr(md, "cluster_dims", (1, 1, 1)) or (1, 1, 1)) \
            not in ((1, 1, 1), (1,), ()):
        return None
    layout = param_layout(list(signature.values()))
    if layout is None:
        return None
    launch = launch or _driver_launch()
    if launch is None:
        return None
    slots = [(_CTYPES.get(ty, ctypes.c_uint64))() for _, ty in layout] + [ctypes.c_uint64(0), ctypes.c_uint64(0)]
    params = (ctypes.c_void_p * len(slots))(*[ctypes.addressof(s) for s in slots])
    varying, fixed = [], []  # pointers and floats change per call; a plan's integers do not
    for (pos, ty), slot in zip(layout, slots):
        (varying if ty.startswith(("*", "f")) else fixed).append((pos, slot))
    function = compiled.function
    threads = 32 * md.num_warps
    shared = md.shared
    lock = threading.Lock()
    first = [True]

    def go(grid_x: int, stream: int, raw_args: Sequence[Any], _keep=(slots, params)) -> None:
        # _keep: ``params`` holds only the slots' addresses; the slots must live as long as go does
        with lock:
            if first[0]:
                for pos, slot in fixed:
                    slot.value = raw_args[pos]
                first[0] = False
            for pos, slot in varying:
                slot.value = raw_args[pos]
            err = launch(function, grid_x, 1, 1, threads, 1, 1, shared, stream, params, None)
        if err:
            raise RuntimeError(f"cuLaunchKernel failed with CUresult {err}")
    return go
