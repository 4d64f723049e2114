"""A one-line progress bar on stderr (tensors and bytes), shown only for slow loads in a terminal."""
from __future__ import annotations

import sys
import time
from typing import Optional, TextIO


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB"


class LoadProgress:
    """Counts tensors and bytes; draws ``[#####.....] 12/291 tensors 1.20/13.5 GB 2.1 GB/s``.

    ``enabled``: True draws from the start, False never, None (default) draws once the load has
    taken ``delay`` seconds and only if ``stream`` is a terminal.

    Example:
        >>> import io
        >>> from opforge.io.progress import LoadProgress
        >>> out = io.StringIO()
        >>> p = LoadProgress(2, 2000, stream=out, enabled=True)
        >>> p.advance(1000); p.advance(1000); p.close()
        >>> "2/2 tensors" in out.getvalue()
        True
    """

    def __init__(self, tensors: int, nbytes: int, stream: Optional[TextIO] = None,
                 enabled: Optional[bool] = None, delay: float = 2.0, width: int = 30):
        self.stream = stream or sys.stderr
        self.total_tensors, self.total_bytes = tensors, nbytes
        self.tensors = self.bytes = 0
        self.t0 = self._last = time.perf_counter()
        self.width = width
        self.delay = 0.0 if enabled else delay
        is_tty = getattr(self.stream, "isatty", lambda: False)()
        self.enabled = enabled if enabled is not None else bool(is_tty)
        self._drawn = False

    def advance(self, nbytes: int) -> None:
        self.tensors += 1
        self.bytes += nbytes
        now = time.perf_counter()
        if self.enabled and now - self.t0 >= self.delay and (now - self._last > 0.1 or self.tensors == self.total_tensors):
            self._last = now
            self._draw(now)

    def _draw(self, now: float) -> None:
        frac = self.bytes / self.total_bytes if self.total_bytes else 1.0
        done = int(frac * self.width)
        rate = self.bytes / max(now - self.t0, 1e-9)
        self.stream.write(f"\rloading [{'#' * done}{'.' * (self.width - done)}] {self.tensors}/{self.total_tensors} "
                          f"tensors {_gb(self.bytes)}/{_gb(self.total_bytes)} {rate / 1e9:.1f} GB/s")
        self.stream.flush()
        self._drawn = True

    def close(self) -> None:
        if self._drawn:
            self.stream.write("\n")
            self.stream.flush()
