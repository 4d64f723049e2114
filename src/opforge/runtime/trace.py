"""Proof of what ran: ``with opforge.trace() as t`` records one event per op call.

    with opforge.trace(timing=True) as t:
        y = opforge.layer_norm(x)
    print(t)            # op, backend, variant, device, dtype, shape, note, gpu time

When no trace is active the cost on the hot path is one truthiness test of a list.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional

import torch

_active: list["Trace"] = []


@dataclass
class TraceEvent:
    """One op call: which kernel ran where, on what."""

    op: str
    backend: str
    variant: str
    device: str
    dtype: str
    shape: tuple
    note: str = ""
    gpu_ms: Optional[float] = None
    _events: Any = field(default=None, repr=False, compare=False)

    def resolve(self) -> None:
        if self._events is not None:
            start, end = self._events
            end.synchronize()
            self.gpu_ms = start.elapsed_time(end)
            self._events = None


class Trace:
    """The events recorded inside one ``opforge.trace()`` block; a list-like object.

    Example:
        >>> import torch, opforge
        >>> with opforge.trace() as t:
        ...     _ = opforge.rms_norm(torch.randn(2, 16))
        >>> t[0].op, t[0].backend
        ('rms_norm', 'torch')
    """

    def __init__(self, timing: bool = False):
        self.timing = timing
        self.events: list[TraceEvent] = []

    def __enter__(self) -> "Trace":
        _active.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _active.remove(self)
        for event in self.events:
            event.resolve()

    def __len__(self) -> int:
        return len(self.events)

    def __iter__(self) -> Iterator[TraceEvent]:
        return iter(self.events)

    def __getitem__(self, i: int) -> TraceEvent:
        return self.events[i]

    def __str__(self) -> str:
        for event in self.events:
            event.resolve()
        header = ("op", "backend", "variant", "device", "dtype", "shape", "gpu time", "note")
        rows = [header] + [
            (e.op, e.backend, e.variant, e.device, e.dtype, "x".join(map(str, e.shape)) or "()",
             "" if e.gpu_ms is None else f"{e.gpu_ms * 1000:.1f} us", e.note)
            for e in self.events
        ]
        widths = [max(len(str(r[i])) for r in rows) for i in range(len(header))]
        lines = ["  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
        lines.insert(1, "  ".join("-" * w for w in widths))
        return "\n".join(lines)

    __repr__ = __str__


def trace(timing: bool = False) -> Trace:
    """Record which kernel ran for every opforge call inside the ``with`` block.

    With ``timing=True`` each event on a GPU also carries ``gpu_ms``, measured with device events.

    Example:
        >>> import torch, opforge
        >>> with opforge.trace() as t:
        ...     _ = opforge.layer_norm(torch.randn(2, 16))
        >>> print(t)   # doctest: +SKIP
        op          backend  variant    device  dtype    shape  gpu time  note
        layer_norm  torch    reference  cpu     float32  2x16
    """
    return Trace(timing)


def run_traced(op: str, backend: str, variant: str, x: torch.Tensor, note: str,
               fn: Callable[..., Any], *args: Any) -> Any:
    """Call ``fn(*args)`` and record it in every active trace (GPU-timed if any asks)."""
    timing = any(t.timing for t in _active) and x.device.type in ("cuda", "mps")
    events = None
    if timing:
        module = torch.cuda if x.device.type == "cuda" else torch.mps
        start, end = module.Event(enable_timing=True), module.Event(enable_timing=True)
        start.record()
        result = fn(*args)
        end.record()
        events = (start, end)
    else:
        result = fn(*args)
    event = TraceEvent(op, backend, variant, str(x.device), str(x.dtype).replace("torch.", ""),
                       tuple(x.shape), note, None, events)
    for t in _active:
        t.events.append(event)
    return result
