"""Progress while a run goes: a rich bar in a terminal, one line per case elsewhere."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    """Silent progress; the base of the others. Example: ``p = Progress(); p.start(3)``."""

    def start(self, total: int) -> None:
        pass

    def step(self, description: str) -> None:
        """Say what is being measured now."""

    def advance(self, n: int = 1) -> None:
        """Mark ``n`` measurements done."""

    def note(self, message: str) -> None:
        """A line worth keeping in the log (a finished case, a warning)."""

    def stop(self) -> None:
        pass


class LineProgress(Progress):
    """Plain lines on a stream: for logs and non-terminals."""

    def __init__(self, stream: TextIO | None = None):
        self.stream = stream or sys.stderr
        self.total = 0
        self.done = 0
        self.t0 = time.perf_counter()

    def start(self, total: int) -> None:
        self.total, self.done, self.t0 = total, 0, time.perf_counter()

    def advance(self, n: int = 1) -> None:
        self.done += n

    def note(self, message: str) -> None:
        width = len(str(self.total))
        elapsed = time.perf_counter() - self.t0
        print(f"[{self.done:>{width}}/{self.total} {elapsed:6.1f}s] {message}", file=self.stream, flush=True)


class RichProgress(Progress):
    """A rich progress bar (spinner, bar, count, elapsed) with notes printed above it."""

    def __init__(self, console: object | None = None):
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            SpinnerColumn,
            TextColumn,
            TimeElapsedColumn,
        )
        from rich.progress import Progress as _Bar

        self._bar = _Bar(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        )
        self._task = None

    def start(self, total: int) -> None:
        self._bar.start()
        self._task = self._bar.add_task("starting", total=total)

    def step(self, description: str) -> None:
        if self._task is not None:
            self._bar.update(self._task, description=description)

    def advance(self, n: int = 1) -> None:
        if self._task is not None:
            self._bar.advance(self._task, n)

    def note(self, message: str) -> None:
        self._bar.console.print(message, highlight=False, markup=False)

    def stop(self) -> None:
        self._bar.stop()


def make_progress(kind: str = "auto") -> Progress:
    """``"rich"``, ``"lines"``, ``"none"`` or ``"auto"`` (rich on a terminal, else lines).

    Example:
        >>> isinstance(make_progress("none"), Progress)
        True
    """
    if kind == "none":
        return Progress()
    if kind in ("auto", "rich"):
        try:
            from rich.console import Console

            console = Console(stderr=True)
            if kind == "rich" or console.is_terminal:
                return RichProgress(console)
        except ImportError:
            pass
    return LineProgress()
