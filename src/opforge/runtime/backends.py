"""Backends as data: which backends exist, which devices each serves, and where an op family
keeps its kernels for each.

The ``triton`` backend serves CUDA and ROCm GPUs, and CPU tensors when ``TRITON_INTERPRET=1``
makes Triton interpret its kernels. The ``metal`` backend serves MPS tensors, and CPU tensors
when ``OPFORGE_METAL_EMULATE=1`` routes its kernels through the MSL emulator of the tests.
The ``torch`` backend runs everywhere. Adding a backend means adding its :class:`Backend`
record to ``BACKENDS`` (and a ``family_module`` with ``VARIANTS`` to each op family it serves).

Example:
    >>> [b.name for b in BACKENDS]
    ['triton', 'metal', 'torch']
    >>> native_accelerated_backends("mps")
    ('metal',)
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from .metal import library as metal
from .switches import metal_emulating, triton_interpreting  # noqa: F401  (re-exported: the kernels' import)


@functools.lru_cache(maxsize=None)
def _triton_importable() -> bool:
    try:
        import triton  # noqa: F401
    except Exception:
        return False
    return True


def _triton_unavailable(device_type: str) -> Optional[str]:
    if not _triton_importable():
        return "triton is not installed"
    if device_type == "cuda":
        return None
    if device_type == "cpu":
        return None if triton_interpreting() else "triton needs a GPU (or TRITON_INTERPRET=1 for CPU tensors)"
    return f"triton does not run on {device_type} tensors"


def _metal_unavailable(device_type: str) -> Optional[str]:
    if device_type == "mps":
        return None if hasattr(torch, "mps") and hasattr(torch.mps, "compile_shader") else \
            "this torch has no torch.mps.compile_shader (needs torch >= 2.7)"
    if device_type == "cpu":
        if not metal_emulating():
            return "metal needs an MPS device (or OPFORGE_METAL_EMULATE=1 for CPU tensors)"
        return metal.emulator_unavailable_reason()
    return f"metal does not run on {device_type} tensors"


@dataclass(frozen=True)
class Backend:
    """A backend: its name, the device types where it is the first choice, the module of an op
    family that lists its variants (``VARIANTS``; None for the torch reference every family
    has), and why it cannot run on a device type here (None: it can)."""

    name: str
    native: tuple[str, ...]
    family_module: Optional[str]
    unavailable: Callable[[str], Optional[str]]


#: Every backend, in the order selection tries them after the device's native ones.
BACKENDS: tuple[Backend, ...] = (
    Backend("triton", ("cuda",), "triton_kernels", _triton_unavailable),
    Backend("metal", ("mps",), "metal", _metal_unavailable),
    Backend("torch", (), None, lambda device_type: None),
)
BACKEND_NAMES: tuple[str, ...] = tuple(b.name for b in BACKENDS)
_BY_NAME = {b.name: b for b in BACKENDS}


def native_accelerated_backends(device_type: str) -> tuple[str, ...]:
    """Backends preferred over the torch path on this kind of device, best first."""
    return tuple(b.name for b in BACKENDS if device_type in b.native)


def unavailable_reason(backend: str, device_type: str) -> Optional[str]:
    """Why ``backend`` cannot run on ``device_type`` here, or None if it can."""
    record = _BY_NAME.get(backend)
    if record is None:
        return f"unknown backend {backend!r}"
    return record.unavailable(device_type)
