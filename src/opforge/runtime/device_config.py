"""Per-device configuration: the compute dtype, graph capture, and the device's measured limits.

Example:
    >>> import opforge
    >>> cfg = opforge.device_config("cpu")
    >>> cfg.dtype, cfg.graph_capture
    (torch.float32, False)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from .device import DeviceInfo, DeviceLike, device_info


@dataclass(frozen=True)
class DeviceConfig:
    """How opforge runs models on one device (used by ``opforge.models.load`` for its defaults)."""

    device: str
    kind: str
    dtype: torch.dtype                      # bf16 on Ampere+ CUDA/ROCm; fp16 on MPS and older GPUs; CPU float32
    graph_capture: bool                     # CUDA graphs for the decode step (CUDA only; not on MPS/CPU)
    sm_count: Optional[int]
    memory_bytes: Optional[int]
    info: DeviceInfo

    @property
    def copy_bandwidth_gbs(self) -> float:
        """Measured device-to-device copy bandwidth (GB/s, read + write), cached on disk."""
        return self.info.copy_bandwidth_gbs

    def __str__(self) -> str:
        mem = f", {self.memory_bytes / 2**30:.0f} GiB" if self.memory_bytes else ""
        sms = f", {self.sm_count} SMs" if self.sm_count else ""
        return (f"{self.device}: dtype {str(self.dtype).replace('torch.', '')}, "
                f"graph capture {'on' if self.graph_capture else 'off'}{sms}{mem}")


def device_config(device: DeviceLike = None) -> DeviceConfig:
    """The configuration opforge uses on ``device`` (default: the best device present).

    CPU defaults to float32: bf16 matmuls there are emulated and slower, not faster.

    Example:
        >>> import opforge
        >>> print(opforge.device_config("cpu"))
        cpu: dtype float32, graph capture off
    """
    info = device_info(device)
    if info.kind in ("cuda", "rocm"):
        dtype = torch.bfloat16 if info.supports_bf16 and (info.compute_capability or (0, 0)) >= (8, 0) \
            or (info.kind == "rocm" and info.supports_bf16) else torch.float16
        graphs = info.kind == "cuda"
        if info.kind == "rocm":
            graphs = bool(getattr(torch.cuda, "CUDAGraph", None))
    elif info.kind == "mps":
        dtype, graphs = torch.float16, False
    else:
        dtype, graphs = torch.float32, False
    return DeviceConfig(device=info.device, kind=info.kind, dtype=dtype, graph_capture=graphs,
                        sm_count=info.multiprocessor_count,
                        memory_bytes=info.total_memory_bytes or info.recommended_working_set_bytes, info=info)
