"""Performance tables for the README and docs, generated from a saved run's JSON.

``python -m opforge.bench.tables RESULTS.json SUITE [DTYPE] [--metric pct_copy|gpu_us|wall_us|speedup]``
prints a Markdown table: one row per op of the suite, one column per shape, opforge's value in
each cell (``pct_copy``: share of the copy bandwidth measured in the same run; ``speedup``: over
the fastest correct peer). A cell opforge did not run correctly reads ``-``.

Example:
    >>> from opforge.bench.results import CaseResult, ImplResult, RunResult, SuiteResult
    >>> case = CaseResult("llm", "rms_norm", [4096, 1024], "bf16", 1, results={
    ...     "opforge": ImplResult("opforge", gpu_us=3.0, pct_copy=89.61)})
    >>> run = RunResult(meta={}, copy_gbps=3000.0, suites=[SuiteResult("llm", "", "gpu_us", ["opforge"], [case])])
    >>> print(table(run, "llm", "bf16"))
    | op | 4096x1024 |
    |---|---|
    | rms_norm | 89.6% |
"""

from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from opforge.bench.results import CaseResult, RunResult
from opforge.bench.spec import OPFORGE, shape_label

METRICS = ("pct_copy", "gpu_us", "wall_us", "speedup")


def cell(case: CaseResult, metric: str) -> str:
    """One cell: opforge's ``metric`` on ``case``, or ``-`` where opforge did not run correctly.

    A share of copy bandwidth shows whole percents, but one decimal between 89.5 and 90, so
    that rounding never turns a miss of the 90% target into a hit.
    """
    mine = case.results.get(OPFORGE)
    if mine is None or not mine.ok:
        return "-"
    if metric == "pct_copy":
        if mine.pct_copy is None:
            return "-"
        return f"{mine.pct_copy:.1f}%" if 89.5 <= mine.pct_copy < 90.0 else f"{mine.pct_copy:.0f}%"
    if metric == "speedup":
        best = case.best_peer("gpu_us" if mine.gpu_us is not None else "wall_us")
        mine_t = mine.gpu_us if mine.gpu_us is not None else mine.wall_us
        return "-" if best is None or not mine_t else f"{best[1] / mine_t:.2f}x"
    value = getattr(mine, metric)
    return "-" if value is None else f"{value:.1f}"


def table(run: RunResult, suite: str, dtype: Optional[str] = None, metric: str = "pct_copy") -> str:
    """The Markdown table of ``suite`` (cases of ``dtype`` only, when given) under ``metric``."""
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {', '.join(METRICS)}, got {metric!r}")
    found = [s for s in run.suites if s.name == suite]
    if not found:
        raise ValueError(f"suite {suite!r} is not in this run (it has: {', '.join(s.name for s in run.suites)})")
    cases = [c for c in found[0].cases if dtype is None or c.dtype == dtype]
    if not cases:
        raise ValueError(f"suite {suite!r} has no {dtype} cases")
    shapes = list(dict.fromkeys(shape_label(c.shape) for c in cases))
    ops = list(dict.fromkeys(c.op for c in cases))
    by_key = {(c.op, shape_label(c.shape)): c for c in cases}
    lines = ["| op | " + " | ".join(shapes) + " |", "|" + "---|" * (len(shapes) + 1)]
    for op in ops:
        cells = [cell(by_key[(op, s)], metric) if (op, s) in by_key else "" for s in shapes]
        lines.append(f"| {op} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m opforge.bench.tables RESULTS.json SUITE [DTYPE] [--metric M]``; returns the exit status.

    Example:
        >>> main(["no-such-file.json", "llm"])
        2
    """
    parser = argparse.ArgumentParser(prog="python -m opforge.bench.tables", description=__doc__.splitlines()[0])
    parser.add_argument("results", help="a results.json written by `opforge bench --json`")
    parser.add_argument("suite")
    parser.add_argument("dtype", nargs="?", help="bf16, fp16 or fp32 (default: every dtype of the suite)")
    parser.add_argument("--metric", default="pct_copy", choices=METRICS)
    args = parser.parse_args(argv)
    try:
        run = RunResult.load_json(args.results)
        print(table(run, args.suite, args.dtype, args.metric))
    except (OSError, ValueError, KeyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
