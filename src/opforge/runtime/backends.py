"""Which backends can run on which device.

The ``triton`` backend serves CUDA and ROCm GPUs, and CPU tensors when ``TRITON_INTERPRET=1``
makes Triton interpret its kernels. The ``metal`` backend serves MPS tensors, and CPU tensors
when ``OPFORGE_METAL_EMULATE=1`` routes its kernels through the MSL emulator of the tests.
The ``torch`` backend runs everywhere.
"""
from __future__ import annotations

import functools
import os
from typing import Optional

import torch


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "") not in ("", "0", "false", "False")


def triton_interpreting() -> bool:
    """True when Triton kernels run in Triton's CPU interpreter (``TRITON_INTERPRET=1``)."""
    return _env_flag("TRITON_INTERPRET")


def metal_emulating() -> bool:
    """True when Metal kernels run in the CPU emulator (``OPFORGE_METAL_EMULATE=1``)."""
    return _env_flag("OPFORGE_METAL_EMULATE")


@functools.lru_cache(maxsize=None)
def _triton_importable() -> bool:
    try:
        import triton  # noqa: F401
    except Exception:
        return False
    return True


def native_accelerated_backends(device_type: str) -> tuple[str, ...]:
    """Backends preferred over the torch path on this kind of device, best first."""
    if device_type == "cuda":
        return ("triton",)
    if device_type == "mps":
        return ("metal",)
    return ()


def unavailable_reason(backend: str, device_type: str) -> Optional[str]:
    """Why ``backend`` cannot run on ``device_type`` here, or None if it can."""
    if backend == "torch":
        return None
    if backend == "triton":
        if not _triton_importable():
            return "triton is not installed"
        if device_type == "cuda":
            return None
        if device_type == "cpu":
            return None if triton_interpreting() else "triton needs a GPU (or TRITON_INTERPRET=1 for CPU tensors)"
        return f"triton does not run on {device_type} tensors"
    if backend == "metal":
        if device_type == "mps":
            return None if hasattr(torch, "mps") and hasattr(torch.mps, "compile_shader") else \
                "this torch has no torch.mps.compile_shader (needs torch >= 2.7)"
        if device_type == "cpu":
            if not metal_emulating():
                return "metal needs an MPS device (or OPFORGE_METAL_EMULATE=1 for CPU tensors)"
            from .metal import emulator_unavailable_reason
            return emulator_unavailable_reason()
        return f"metal does not run on {device_type} tensors"
    return f"unknown backend {backend!r}"
