"""Formatting shared by the terminal, compact and Markdown reports."""

from __future__ import annotations

from typing import Sequence

from opforge.bench.results import OK, CaseResult, ImplResult, RunResult, SuiteResult
from opforge.bench.spec import CPU, IMPL_ORDER, OPFORGE, TORCH, shape_label

METRIC_LABEL = {"gpu_us": "GPU time", "wall_us": "wall time per call"}


def us(x: float | None) -> str:
    """``us(3.214) == "3.21 us"``, ``us(1234.0) == "1.23 ms"``, ``us(None) == "-"``."""
    if x is None:
        return "-"
    if x >= 1000.0:
        return f"{x / 1000.0:.2f} ms"
    if x >= 100.0:
        return f"{x:.0f} us"
    if x >= 10.0:
        return f"{x:.1f} us"
    return f"{x:.2f} us"


def ratio(x: float | None) -> str:
    """``ratio(1.2345) == "1.23x"``; ``"-"`` when missing."""
    return "-" if x is None else f"{x:.2f}x"


def status_text(r: ImplResult | None) -> str:
    """Short text for a result that has no number: absent, WRONG, error, skipped."""
    if r is None:
        return "absent"
    return {"absent": "absent", "wrong": "WRONG", "error": "error", "skipped": "skipped"}.get(r.status, r.status)


def impl_time(case: CaseResult, impl: str, metric: str) -> float | None:
    """The number a cell shows: the suite metric (wall time for the CPU)."""
    r = case.results.get(impl)
    if r is None or r.status not in (OK, "wrong"):
        return None
    if impl == CPU:
        return r.wall_us
    return getattr(r, metric)


def cell(case: CaseResult, impl: str, metric: str, with_pct: bool = True) -> str:
    """``"12.3 us 91%"`` for a correct result; a wrong one keeps its time but says WRONG.

    A peer's cell ends with opforge's speedup over it: ``"20.1 us 56% [1.63x]"``.
    """
    r = case.results.get(impl)
    t = impl_time(case, impl, metric)
    if r is None or t is None:
        return status_text(r)
    text = us(t)
    if with_pct and metric == "gpu_us" and r.pct_copy is not None and impl != CPU:
        text += f" {r.pct_copy:.0f}%"
    if r.status != OK:
        return f"WRONG ({text})"
    if impl not in (OPFORGE, CPU):
        sp = case.speedup(impl, metric)
        if sp is not None:
            text += f" [{sp:.2f}x]"
    return text


def ordered_impls(suite: SuiteResult) -> list[str]:
    """The suite's implementations in the standard report order."""
    known = [i for i in IMPL_ORDER if i in suite.impls]
    return known + [i for i in suite.impls if i not in known]


def best_peer_text(case: CaseResult, metric: str) -> str:
    """``"1.05x vs torch.compile"``: opforge's speedup over the fastest correct peer."""
    best = case.best_peer(metric)
    if best is None:
        return "-"
    sp = case.speedup(best[0], metric)
    return f"{ratio(sp)} vs {best[0]}" if sp is not None else f"- ({best[0]} fastest)"


def absent_reasons(run: RunResult) -> list[tuple[str, str]]:
    """Unique (implementation, reason) pairs for everything absent, wrong or failed."""
    seen: list[tuple[str, str]] = []
    for s in run.suites:
        for c in s.cases:
            for name, r in c.results.items():
                if r.reason:
                    kind = r.status if not r.ok else "note"
                    item = (f"{name} ({kind})", r.reason if r.status == "absent" else f"{c.label}: {r.reason}")
                    if item not in seen:
                        seen.append(item)
        for ch in s.chains:
            for status, reason in ((ch.status, ch.reason), (ch.graph_status, ch.graph_reason)):
                if status != OK and reason:
                    item = (f"chain {ch.impl} ({status})", reason)
                    if item not in seen:
                        seen.append(item)
    return seen


def header_lines(run: RunResult) -> list[str]:
    """Device, versions, date and copy bandwidth, one fact per line."""
    m = run.meta
    lines = [
        f"device: {m.get('device_name')} ({m.get('device')})"
        + (f", driver {m['driver']}" if m.get("driver") else "")
        + (f", CUDA {m['cuda']}" if m.get("cuda") and m.get("device_type") == "cuda" else ""),
        f"torch {m.get('torch')}, triton {m.get('triton')}, liger-kernel {m.get('liger_kernel') or 'absent'}, "
        f"opforge {m.get('opforge')} ({m.get('opforge_commit') or 'no git'}), python {m.get('python')}",
        f"date: {m.get('date')}",
    ]
    if run.copy_gbps:
        lines.append(f"copy bandwidth (device-to-device, read + write): {run.copy_gbps:.0f} GB/s")
    return lines


__all__ = [
    "METRIC_LABEL", "us", "ratio", "cell", "status_text", "impl_time", "ordered_impls", "best_peer_text",
    "absent_reasons", "header_lines", "shape_label", "OPFORGE", "TORCH", "CPU",
]


def split_list(values: Sequence[str] | None) -> list[str] | None:
    """Comma-separated option values, flattened; ``None`` when none were given.

    Example:
        >>> split_list(["a,b", " c "])
        ['a', 'b', 'c']
    """
    if not values:
        return None
    return [v.strip() for text in values for v in text.split(",") if v.strip()]
