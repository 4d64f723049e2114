"""The model suite's points, budget and result rows (``opforge bench --suite model``; see
``opforge.bench.suites.model``): which (batch, context) and prefill points a shape measures, the
wall-clock budget that skips the rest, and the collector that records and prints each row.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch

def _config(shape: str) -> dict[str, Any]:
    from opforge.models.testing import LLAMA_1B, LLAMA_8B, TINY_LLAMA
    if shape == "tiny":
        return dict(TINY_LLAMA, vocab_size=256, max_position_embeddings=4096)
    return {"1b": LLAMA_1B, "8b": LLAMA_8B}[shape]


def sync(device: torch.device) -> None:
    """Wait for ``device``'s queued work (a no-op off CUDA).

    Example:
        >>> sync(torch.device("cpu"))
    """
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_seconds(fn: Callable[[], Any], device: torch.device, repeats: int = 3) -> float:
    """Median wall seconds of ``fn()`` over ``repeats`` synchronized calls, after one warm-up call.

    Example:
        >>> median_seconds(lambda: sum(range(10)), torch.device("cpu")) >= 0
        True
    """
    fn()
    times = []
    for _ in range(repeats):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


@dataclass(frozen=True)
class Grid:
    """The points measured for one model shape.

    Example:
        >>> g = grid("1b")
        >>> g.batches, g.contexts, g.prefills, g.new_tokens(4096)
        ((1, 8, 32), (512, 4096), ((1, 2048), (8, 512)), 32)
    """

    batches: tuple[int, ...]
    contexts: tuple[int, ...]
    prefills: tuple[tuple[int, int], ...]          # (batch, prompt length)
    short_new: int                                 # new tokens per decode point at the shortest context
    long_new: int                                  # ... at longer contexts (the prefill dominates there)
    peer_new_cap: int = 32                         # transformers eager: ~30 ms a step on an H100 host
    compile_contexts: tuple[int, ...] = ()         # contexts of the compiled peer (a compile per shape)
    compile_batches: tuple[int, ...] = ()

    def new_tokens(self, context: int) -> int:
        return self.short_new if context == min(self.contexts) else self.long_new

    def peer_new_tokens(self, context: int) -> int:
        return min(self.new_tokens(context), self.peer_new_cap if context == min(self.contexts)
                   else self.peer_new_cap // 2)

    def decode_points(self) -> list[tuple[int, int]]:
        """(batch, context), batch-major: the CUDA graph of a batch size is captured once."""
        return [(b, c) for b in self.batches for c in self.contexts]

    @property
    def max_seq_len(self) -> int:
        return max([max(self.contexts) + self.long_new, min(self.contexts) + self.short_new]
                   + [s for _, s in self.prefills]) + 8

    @property
    def max_batch(self) -> int:
        return max(list(self.batches) + [b for b, _ in self.prefills])

    def to_json(self) -> dict[str, Any]:
        return {"batches": list(self.batches), "contexts": list(self.contexts),
                "prefills": [f"{b}x{s}" for b, s in self.prefills],
                "new_tokens": {str(c): self.new_tokens(c) for c in self.contexts},
                "peer_new_tokens": {str(c): self.peer_new_tokens(c) for c in self.contexts},
                "compile_points": [f"b{b} ctx{c}" for b in self.compile_batches for c in self.compile_contexts]}


def grid(shape: str) -> Grid:
    """The grid of ``shape``: the full grid for ``1b``/``8b``; a small one for ``tiny`` (CPU tests)."""
    if shape == "tiny":
        return Grid(batches=(1, 2), contexts=(24, 48), prefills=((1, 64), (2, 32)), short_new=8, long_new=6,
                    peer_new_cap=8, compile_contexts=(24,), compile_batches=(1,))
    return Grid(batches=(1, 8, 32), contexts=(512, 4096), prefills=((1, 2048), (8, 512)), short_new=64,
                long_new=32, compile_contexts=(512,), compile_batches=(1, 8))


def _decode(b: int, c: int) -> str:
    return f"decode b{b} ctx{c}"


def _prefill(b: int, s: int) -> str:
    return f"prefill {b}x{s}"


class Budget:
    """Wall seconds since the suite started, against an optional limit.

    Example:
        >>> Budget(None).allows(1e9), Budget(0).allows()
        (True, False)
    """

    def __init__(self, seconds: Optional[float]):
        self.seconds = seconds
        self.start = time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def allows(self, need_s: float = 0.0) -> bool:
        return self.seconds is None or self.elapsed() + need_s < self.seconds


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0][:200] if text else ''}".rstrip(": ")


@dataclass
class _Run:
    """The results being collected, the printing and the budget (one per ``run_model_suite``)."""

    result: dict[str, Any]
    budget: Budget
    out: Any
    shape: str = ""
    printed: list[str] = field(default_factory=list)

    def record(self, impl: str, precision: str, what: str, tokens_per_s: Optional[float], **extra: Any) -> None:
        row = {"shape": self.shape, "impl": impl, "precision": precision, "what": what,
               "tokens_per_s": tokens_per_s, **extra}
        self.result["rows"].append(row)
        self.print(_row_line(row))

    def skip(self, impl: str, precision: str, what: str, reason: str = "budget") -> None:
        self.result["skipped"].append({"shape": self.shape, "impl": impl, "precision": precision, "what": what,
                                       "reason": reason})
        self.print(f"{self.shape:<5} {impl:<42} {precision:<5} {what:<18} {'skipped':>16}  {reason}")

    def start(self, impl: str, precision: str, what: str, need_s: float = 0.0) -> bool:
        """True if the point may start now; else it is listed as skipped."""
        if self.budget.allows(need_s):
            return True
        reason = f"budget ({self.budget.seconds:g} s; {self.budget.elapsed():.0f} s elapsed" + \
            (f", needs ~{need_s:.0f} s)" if need_s else ")")
        self.skip(impl, precision, what, reason)
        return False

    def peer(self, name: str, status: str) -> None:
        self.result["peers"][f"{self.shape} {name}"] = status
        if status != "ok":
            self.print(f"{self.shape:<5} {name:<42} {'':<5} {'':<18} {'-':>16}  {status}")

    def print(self, line: str) -> None:
        print(line, file=self.out, flush=True)


def _row_line(row: dict[str, Any]) -> str:
    tps = row.get("tokens_per_s")
    value = "-" if tps is None else f"{tps:10.1f} tok/s"
    notes = ", ".join(f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()
                      if k not in ("shape", "impl", "precision", "what", "tokens_per_s", "weight_bytes",
                                   "dense_lm_head_bytes", "kv_bytes_per_step", "batch", "context"))
    return f"{row['shape']:<5} {row['impl']:<42} {row['precision']:<5} {row['what']:<18} {value:>16}  {notes}"
