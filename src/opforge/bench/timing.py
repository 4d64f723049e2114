"""Clocks: device time per call, wall time per call, and the copy-bandwidth ceiling.

Device time on CUDA is event-timed, one call per pair of events. Before each timed
call the stream gets a short spin kernel (``torch.cuda._sleep``) that outlasts the
host's launch work, so the start event fires only when the call's kernels are already
queued: what is measured is the GPU's work, not launch gaps. Inputs rotate among
several buffers when one set fits in L2, so the cache is not what is measured.

Elsewhere (CPU, MPS) each call is timed with a host clock around a synchronize.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

Fn = Callable[..., Any]
ArgSets = Sequence[tuple[Any, ...]]


@dataclass
class TimingConfig:
    """How long to measure. Reps adapt to the call's cost within these bounds.

    Example:
        >>> cfg = TimingConfig.quick()
        >>> cfg.gpu_reps_max
        10
    """

    warmup: int = 3
    gpu_reps_min: int = 25
    gpu_reps_max: int = 200
    gpu_target_ms: float = 10.0
    wall_loops: int = 3
    wall_calls_min: int = 20
    wall_calls_max: int = 400
    wall_target_ms: float = 8.0
    wall_rounds: int = 7          # wall-time suites: interleaved rounds over all implementations
    cpu_reps_min: int = 3
    cpu_reps_max: int = 15
    cpu_target_ms: float = 40.0
    copy_mib_gpu: int = 1024
    copy_mib_cpu: int = 64
    rotate_cache_factor: float = 3.0
    rotate_max_buffers: int = 4096

    @classmethod
    def quick(cls) -> "TimingConfig":
        """Few reps: for smoke tests and CPU runs, not for published numbers."""
        return cls(
            warmup=1, gpu_reps_min=3, gpu_reps_max=10, gpu_target_ms=1.0, wall_loops=1,
            wall_calls_min=3, wall_calls_max=20, wall_target_ms=1.0, wall_rounds=1, cpu_reps_min=1,
            cpu_reps_max=3, cpu_target_ms=2.0, copy_mib_gpu=256, copy_mib_cpu=32,
            rotate_max_buffers=16,
        )

    @classmethod
    def fixed(cls, reps: int) -> "TimingConfig":
        """Exactly ``reps`` timed calls everywhere (``--reps``)."""
        reps = max(1, reps)
        return cls(
            gpu_reps_min=reps, gpu_reps_max=reps, wall_calls_min=reps, wall_calls_max=reps,
            cpu_reps_min=reps, cpu_reps_max=reps,
        )


def clamp_reps(estimate_us: float, target_ms: float, lo: int, hi: int) -> int:
    """Reps that add up to about ``target_ms``, within ``[lo, hi]``.

    Example:
        >>> clamp_reps(100.0, 10.0, 5, 1000)
        100
    """
    if estimate_us <= 0 or not math.isfinite(estimate_us):
        return hi
    return int(min(hi, max(lo, round(target_ms * 1000.0 / estimate_us))))


def quantiles(samples: Sequence[float]) -> tuple[float, float, float]:
    """(20th percentile, median, 80th percentile) of ``samples``."""
    s = sorted(samples)
    if len(s) == 1:
        return s[0], s[0], s[0]
    q = statistics.quantiles(s, n=10, method="inclusive")
    return q[1], statistics.median(s), q[7]


class Clock:
    """Synchronous clock: host time around each call plus a synchronize (CPU, MPS)."""

    def __init__(self, device: torch.device):
        self.device = device

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        elif self.device.type == "mps":
            torch.mps.synchronize()

    def device_times(self, fn: Fn, args: ArgSets, reps: int, host_us: float) -> list[float]:
        """Per-call times in microseconds for ``reps`` calls, rotating over ``args``."""
        out = []
        self.sync()
        for i in range(reps):
            a = args[i % len(args)]
            t0 = time.perf_counter()
            fn(*a)
            self.sync()
            out.append((time.perf_counter() - t0) * 1e6)
        return out

    def wall_per_call(self, fn: Fn, args: ArgSets, calls: int) -> float:
        """Microseconds per call of a loop of ``calls`` calls with one sync at the end."""
        self.sync()
        n = len(args)
        t0 = time.perf_counter()
        for i in range(calls):
            fn(*args[i % n])
        self.sync()
        return (time.perf_counter() - t0) * 1e6 / calls


class CudaClock(Clock):
    """Event-timed device clock for CUDA (see the module docstring)."""

    def __init__(self, device: torch.device):
        super().__init__(device)
        self._cycles_per_us = self._calibrate()

    def _calibrate(self) -> float | None:
        sleep = getattr(torch.cuda, "_sleep", None)
        if sleep is None:
            return None
        with torch.cuda.device(self.device):
            sleep(5_000_000)  # a few ms of spinning first, so the clocks have ramped up
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            cycles = 1_000_000
            start.record()
            sleep(cycles)
            end.record()
            end.synchronize()
            us = start.elapsed_time(end) * 1000.0
        return cycles / us if us > 0 else None

    def device_times(self, fn: Fn, args: ArgSets, reps: int, host_us: float) -> list[float]:
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        spin = 0
        if self._cycles_per_us:
            # Outlast the host's work for one call by a wide margin (clocks may rise after
            # calibration, which shortens the spin); a longer spin only costs idle time.
            spin = int(self._cycles_per_us * min(3000.0, max(30.0, 3.0 * host_us)))
        n = len(args)
        self.sync()
        for i in range(reps):
            if spin:
                torch.cuda._sleep(spin)
            starts[i].record()
            fn(*args[i % n])
            ends[i].record()
        self.sync()
        return [s.elapsed_time(e) * 1000.0 for s, e in zip(starts, ends)]


def clock_for(device: torch.device) -> Clock:
    """The clock that fits ``device``. Example: ``clock_for(torch.device("cpu"))``."""
    return CudaClock(device) if device.type == "cuda" else Clock(device)


def copy_bandwidth_gbps(device: torch.device, cfg: TimingConfig) -> float:
    """Device-to-device copy bandwidth in GB/s (1e9 bytes/s), bytes read plus written.

    Example:
        >>> copy_bandwidth_gbps(torch.device("cpu"), TimingConfig.quick()) > 0
        True
    """
    mib = cfg.copy_mib_gpu if device.type in ("cuda", "mps") else cfg.copy_mib_cpu
    n = mib * (1 << 20) // 4
    src = torch.randn(n, device=device)
    dst = torch.empty_like(src)
    clock = clock_for(device)
    for _ in range(2):
        dst.copy_(src)
    reps = 10 if device.type != "cpu" else 5
    times = clock.device_times(dst.copy_, [(src,)], reps, host_us=50.0)
    _, med, _ = quantiles(times)
    del src, dst
    return 2.0 * n * 4 / (med * 1e-6) / 1e9
