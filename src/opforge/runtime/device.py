"""Devices: what they are, what they can do, and their measured copy bandwidth.

The copy bandwidth is measured once (a large device-to-device copy, bytes read plus bytes
written) the first time it is asked for, then cached on disk under the user's cache directory,
keyed by device name and driver, so later processes read it back instead of re-measuring.
"""
from __future__ import annotations

import ctypes
import json
import os
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Union

import torch

DeviceLike = Union[str, torch.device, int, None]


@dataclass
class DeviceInfo:
    """Facts about one device. ``copy_bandwidth_gbs`` is measured lazily, then cached on disk.

    Example:
        >>> import opforge
        >>> info = opforge.device_info("cpu")
        >>> info.kind
        'cpu'
    """

    kind: str                                   # "cuda", "rocm", "mps" or "cpu"
    name: str
    device: str                                 # torch device string, e.g. "cuda:0"
    driver: str = ""
    compute_capability: Optional[tuple[int, int]] = None
    multiprocessor_count: Optional[int] = None
    total_memory_bytes: Optional[int] = None
    l2_cache_bytes: Optional[int] = None
    supports_bf16: bool = True
    max_threads_per_block: Optional[int] = None
    recommended_working_set_bytes: Optional[int] = None
    _bandwidth: Optional[float] = field(default=None, repr=False)

    @property
    def copy_bandwidth_gbs(self) -> float:
        """Measured device-to-device copy bandwidth in GB/s (bytes read + bytes written)."""
        if self._bandwidth is None:
            self._bandwidth = _cached_bandwidth(self)
        return self._bandwidth

    def __str__(self) -> str:
        parts = [f"{self.name} ({self.device}, {self.kind})"]
        if self.compute_capability:
            parts.append(f"sm_{self.compute_capability[0]}{self.compute_capability[1]}")
        if self.multiprocessor_count:
            parts.append(f"{self.multiprocessor_count} SMs")
        if self.total_memory_bytes:
            parts.append(f"{self.total_memory_bytes / 2**30:.0f} GiB")
        if self.l2_cache_bytes:
            parts.append(f"L2 {self.l2_cache_bytes / 2**20:.0f} MiB")
        if self.driver:  # on a CPU the field holds the core count, which needs no "driver" label
            parts.append(self.driver if self.kind == "cpu" else f"driver {self.driver}")
        return ", ".join(parts)


def _resolve(device: DeviceLike) -> torch.device:
    if device is None:
        if torch.cuda.is_available():
            return torch.device("cuda", torch.cuda.current_device())
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if isinstance(device, int):
        return torch.device("cuda", device)
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        if not torch.cuda.is_available():  # torch's current_device() would fail with an AssertionError
            raise ValueError("device cuda does not exist here (torch.cuda.is_available() is False)")
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def _cuda_driver_version() -> str:
    if torch.version.hip:
        return f"hip {torch.version.hip}"
    try:
        version = ctypes.c_int()
        ctypes.CDLL("libcuda.so.1").cuDriverGetVersion(ctypes.byref(version))
        return f"cuda {version.value // 1000}.{version.value % 1000 // 10}"
    except OSError:
        return f"cuda runtime {torch.version.cuda}"


_infos: dict[str, DeviceInfo] = {}


def device_info(device: DeviceLike = None) -> DeviceInfo:
    """Describe a device (default: the best one present: CUDA, then MPS, then CPU).

    Example:
        >>> import opforge
        >>> print(opforge.device_info("cpu").kind)
        cpu
    """
    dev = _resolve(device)
    key = str(dev)
    if key not in _infos:
        _infos[key] = _describe(dev)
    return _infos[key]


def _describe(dev: torch.device) -> DeviceInfo:
    if dev.type == "cuda":
        if not torch.cuda.is_available() or dev.index >= torch.cuda.device_count():
            raise ValueError(f"device {dev} does not exist here (CUDA devices: {torch.cuda.device_count()})")
        props = torch.cuda.get_device_properties(dev)
        return DeviceInfo(
            kind="rocm" if torch.version.hip else "cuda",
            name=props.name,
            device=str(dev),
            driver=_cuda_driver_version(),
            compute_capability=(props.major, props.minor),
            multiprocessor_count=props.multi_processor_count,
            total_memory_bytes=props.total_memory,
            l2_cache_bytes=getattr(props, "L2_cache_size", None),
            supports_bf16=torch.cuda.is_bf16_supported(),
            max_threads_per_block=getattr(props, "max_threads_per_block", 1024),
        )
    if dev.type == "mps":
        if not torch.backends.mps.is_available():
            raise ValueError("device mps does not exist here (torch.backends.mps.is_available() is False)")
        working_set = torch.mps.recommended_max_memory() if hasattr(torch.mps, "recommended_max_memory") else None
        return DeviceInfo(kind="mps", name=f"Apple {platform.machine()} GPU", device="mps",
                          driver=f"macOS {platform.mac_ver()[0]}", recommended_working_set_bytes=working_set,
                          max_threads_per_block=1024)
    if dev.type == "cpu":
        return DeviceInfo(kind="cpu", name=platform.processor() or platform.machine(), device="cpu",
                          driver=f"{os.cpu_count()} cores", supports_bf16=True)
    raise ValueError(f"unsupported device type {dev.type!r}")


def _cache_path() -> Path:
    root = os.environ.get("OPFORGE_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "opforge")
    return Path(root) / "device_bandwidth.json"


def _cached_bandwidth(info: DeviceInfo) -> float:
    path = _cache_path()
    key = f"{info.name}|{info.driver}"
    try:
        table = json.loads(path.read_text())
    except (OSError, ValueError):
        table = {}
    if key in table:
        return float(table[key])
    value = measure_copy_bandwidth(info.device)
    table[key] = value
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(table, indent=1))
        tmp.replace(path)
    except OSError:
        pass  # a read-only home still gets the number, just not cached
    return value


def measure_copy_bandwidth(device: DeviceLike = None, nbytes: int = 1 << 28, repeats: int = 20) -> float:
    """Measure a device-to-device copy in GB/s, counting bytes read plus bytes written.

    Example:
        >>> import opforge
        >>> opforge.runtime.device.measure_copy_bandwidth("cpu", nbytes=1 << 20, repeats=3) > 0
        True
    """
    dev = _resolve(device)
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=dev).uniform_()
    dst = torch.empty_like(src)
    times = []
    for i in range(repeats + 3):
        if dev.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dst.copy_(src)
            end.record()
            end.synchronize()
            elapsed = start.elapsed_time(end) / 1e3
        else:
            _sync(dev)
            t0 = time.perf_counter()
            dst.copy_(src)
            _sync(dev)
            elapsed = time.perf_counter() - t0
        if i >= 3:
            times.append(elapsed)
    times.sort()
    return 2 * src.numel() * 4 / times[len(times) // 2] / 1e9


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    elif dev.type == "mps":
        torch.mps.synchronize()
