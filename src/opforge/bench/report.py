"""Terminal reports: full tables per suite, and a compact summary that fits a log tail.

Uses rich when it is installed and plain aligned text otherwise.
"""

from __future__ import annotations

import sys
from typing import Sequence, TextIO

from opforge.bench.fmt import (
    CPU,
    METRIC_LABEL,
    OPFORGE,
    TORCH,
    absent_reasons,
    best_peer_text,
    cell,
    header_lines,
    ordered_impls,
    ratio,
    shape_label,
    us,
)
from opforge.bench.results import OK, RunResult, SuiteResult
from opforge.bench.spec import COMPILE

Row = Sequence[str]


def suite_rows(suite: SuiteResult) -> tuple[list[str], list[list[str]]]:
    """Columns and rows of a suite's main table (one row per case).

    Example:
        >>> # cols, rows = suite_rows(RunResult.load_json("r.json").suites[0])
    """
    impls = ordered_impls(suite)
    gbps = suite.metric == "gpu_us"
    cols = ["op", "shape", "dtype"] + impls + (["opforge GB/s"] if gbps else []) + ["opforge vs fastest peer"]
    has_cpu = CPU in impls
    if has_cpu:
        cols.append("opforge vs CPU")
    rows = []
    for c in suite.cases:
        row = [c.op, shape_label(c.shape), c.dtype] + [cell(c, i, suite.metric) for i in impls]
        if gbps:
            mine = c.results.get(OPFORGE)
            g = mine.gbps if mine is not None and mine.ok else None
            row.append("-" if g is None else f"{g:.0f}" if g >= 10 else f"{g:.2f}")
        row.append(best_peer_text(c, suite.metric))
        if has_cpu:
            row.append(ratio(c.speedup_vs_cpu()))
        rows.append(row)
    return cols, rows


def chain_rows(suite: SuiteResult) -> tuple[list[str], list[list[str]]]:
    """Columns and rows of the eager-vs-CUDA-graph chain table."""
    cols = ["op", "shape", "dtype", "impl", "eager / chain", "graph / chain", "graph speedup"]
    rows = []
    for ch in suite.chains:
        if ch.status != OK:
            rows.append([ch.op, shape_label(ch.shape), ch.dtype, ch.impl, ch.status, "-", "-"])
            continue
        graph = us(ch.graph_us) if ch.graph_status == OK else ch.graph_status
        rows.append([ch.op, shape_label(ch.shape), ch.dtype, ch.impl, us(ch.eager_us), graph,
                     ratio(ch.graph_speedup if ch.graph_status == OK else None)])
    return cols, rows


def compact_rows(suite: SuiteResult) -> tuple[list[str], list[list[str]]]:
    """One row per (op, dtype), one column per shape.

    Cells: a wall-time suite gives ``"<opforge wall time> <speedup vs torch>"``; a suite
    with a CPU column (seed) ``"<opforge GPU time> <speedup vs torch> cpu <speedup vs
    CPU>"``; other GPU-time suites ``"<opforge % of copy> <speedup vs fastest peer>"``.
    ``!`` marks a case that misses one of the suite's targets.
    """
    shapes: list[str] = []
    keys: list[tuple[str, str]] = []
    grid: dict[tuple[str, str, str], str] = {}
    missed = {t.case for t in suite.targets if not t.met}
    for c in suite.cases:
        s, k = shape_label(c.shape), (c.op, c.dtype)
        if s not in shapes:
            shapes.append(s)
        if k not in keys:
            keys.append(k)
        mine = c.results.get(OPFORGE)
        if mine is None or mine.status != OK:
            text = mine.status.upper() if mine else "-"
        elif suite.metric == "wall_us":
            text = f"{us(mine.wall_us)} {ratio(c.speedup(TORCH, 'wall_us'))}"
        elif CPU in suite.impls:
            vs_cpu = c.speedup_vs_cpu()
            text = f"{us(mine.gpu_us)} {ratio(c.speedup(TORCH, suite.metric))}"
            if vs_cpu is not None:
                text += f" cpu {vs_cpu:.1f}x" if vs_cpu < 10 else f" cpu {vs_cpu:.0f}x"
        else:
            best = c.best_peer(suite.metric)
            pct = f"{mine.pct_copy:.0f}%" if mine.pct_copy is not None else us(mine.gpu_us)
            text = f"{pct} {ratio(c.speedup(best[0], suite.metric)) if best else '-'}"
        grid[(c.op, c.dtype, s)] = text + (" !" if c.label in missed else "")
    rows = [[op, dt] + [grid.get((op, dt, s), "") for s in shapes] for op, dt in keys]
    return ["op", "dtype"] + shapes, rows


def compact_chain_rows(suite: SuiteResult) -> tuple[list[str], list[list[str]]]:
    """opforge's chains: one row per (op, dtype), cells ``"<eager> -> <graph>"`` by shape."""
    shapes: list[str] = []
    keys: list[tuple[str, str]] = []
    grid: dict[tuple[str, str, str], str] = {}
    for ch in suite.chains:
        if ch.impl != OPFORGE:
            continue
        s, k = shape_label(ch.shape), (ch.op, ch.dtype)
        shapes += [s] if s not in shapes else []
        keys += [k] if k not in keys else []
        if ch.status != OK:
            text = ch.status
        else:
            graph = us(ch.graph_us) if ch.graph_status == OK else ch.graph_status
            text = f"{us(ch.eager_us)} -> {graph}"
        grid[(ch.op, ch.dtype, s)] = text
    rows = [[op, dt] + [grid.get((op, dt, s), "") for s in shapes] for op, dt in keys]
    return ["op", "dtype"] + shapes, rows


def target_lines(suite: SuiteResult, limit: int = 12) -> list[str]:
    """``"<target>: met 50/56; missed: ..."`` per target of the suite."""
    out = []
    names = list(dict.fromkeys(t.target for t in suite.targets))
    for name in names:
        items = [t for t in suite.targets if t.target == name]
        misses = [t for t in items if not t.met]
        line = f"{suite.name}: {name}: met {len(items) - len(misses)}/{len(items)}"
        if misses:
            shown = "; ".join(f"{t.case}: {t.detail}" for t in misses[:limit])
            more = f"; ... {len(misses) - limit} more" if len(misses) > limit else ""
            line += f"; MISSED: {shown}{more}"
        out.append(line)
    return out


def compile_line(suite: SuiteResult) -> str | None:
    """``"seed: torch.compile first calls: 24, median 1.2 s, max 21.0 s"``, or None."""
    times = sorted(c.results[COMPILE].compile_s for c in suite.cases
                   if COMPILE in c.results and c.results[COMPILE].compile_s is not None)
    if not times:
        return None
    return (f"{suite.name}: torch.compile first calls: {len(times)}, median {times[len(times) // 2]:.1f} s, "
            f"max {times[-1]:.1f} s, total {sum(times):.0f} s")


def _plain_table(title: str, cols: list[str], rows: list[list[str]], out: TextIO) -> None:
    widths = [max(len(str(x)) for x in [c] + [r[i] for r in rows]) for i, c in enumerate(cols)]
    print(title, file=out)
    print("  ".join(c.ljust(w) for c, w in zip(cols, widths)), file=out)
    print("  ".join("-" * w for w in widths), file=out)
    for r in rows:
        print("  ".join(str(x).ljust(w) for x, w in zip(r, widths)), file=out)
    print(file=out)


class Printer:
    """Prints tables with rich if available, else plain text.

    Example:
        >>> Printer(width=120).table("t", ["a"], [["1"]])  # doctest: +SKIP
    """

    def __init__(self, out: TextIO | None = None, width: int | None = None, plain: bool = False):
        self.out = out or sys.stdout
        self.console = None
        if not plain:
            try:
                from rich.console import Console

                self.console = Console(file=self.out, width=width, highlight=False)
                if not self.console.is_terminal and width is None:
                    self.console = Console(file=self.out, width=200, highlight=False)
            except ImportError:
                self.console = None

    def line(self, text: str = "") -> None:
        if self.console is not None:
            self.console.print(text, markup=False)
        else:
            print(text, file=self.out)

    def table(self, title: str, cols: list[str], rows: list[list[str]], compact: bool = False) -> None:
        if self.console is None:
            _plain_table(title, cols, rows, self.out)
            return
        from rich import box
        from rich.table import Table

        self.console.print(title, markup=False, soft_wrap=True)  # a table title would wrap at its width
        t = Table(show_lines=False, pad_edge=False, box=box.SIMPLE_HEAD if compact else box.HEAVY_HEAD)
        for i, c in enumerate(cols):
            t.add_column(c, justify="left" if i < 3 else "right", no_wrap=True)
        for r in rows:
            t.add_row(*[_style(x) for x in r])
        self.console.print(t)


def _style(text: str) -> str:
    from rich.markup import escape

    s = escape(text)
    if "WRONG" in text or "error" in text or text.endswith("!"):
        return f"[bold red]{s}[/]"
    if text in ("absent", "-", "skipped"):
        return f"[dim]{s}[/]"
    return s


def print_full(run: RunResult, printer: Printer) -> None:
    """Every suite's main table, chain table, targets, and the absent/wrong notes.

    Example:
        >>> # print_full(RunResult.load_json("r.json"), Printer())
    """
    for line in header_lines(run):
        printer.line(line)
    for s in run.suites:
        cols, rows = suite_rows(s)
        printer.table(f"{s.name}: {s.description} ({METRIC_LABEL.get(s.metric, s.metric)}; % = share of copy)",
                      cols, rows)
        if s.chains:
            cols, rows = chain_rows(s)
            printer.table(f"{s.name}: chain of {s.chains[0].length} calls (wall time per chain)", cols, rows)
        for line in [compile_line(s)] + target_lines(s):
            if line:
                printer.line(line)
    notes = absent_reasons(run)
    if notes:
        printer.line("notes:")
        for who, why in notes:
            printer.line(f"  {who}: {why}")


def print_compact(run: RunResult, printer: Printer) -> None:
    """A short summary: per suite, op x dtype by shape; targets; opforge's chains.

    Example:
        >>> # print_compact(RunResult.load_json("r.json"), Printer())
    """
    for line in header_lines(run):
        printer.line(line)
    for s in run.suites:
        cols, rows = compact_rows(s)
        if s.metric == "wall_us":
            how = "opforge wall time per call, speedup vs torch"
        elif CPU in s.impls:
            how = "opforge GPU time, speedup vs torch, speedup vs CPU (wall)"
        else:
            how = "opforge % of copy bandwidth, speedup vs fastest correct peer"
        printer.table(f"{s.name} ({how}; ! = target missed)", cols, rows, compact=True)
        if s.chains:
            cols, rows = compact_chain_rows(s)
            printer.table(f"{s.name}: opforge chain of {s.chains[0].length}, eager -> CUDA graph (per chain)",
                          cols, rows, compact=True)
        if s.seconds is not None:
            printer.line(f"{s.name}: {len(s.cases)} cases in {s.seconds:.0f} s")
        line = compile_line(s)
        if line:
            printer.line(line)
        for line in target_lines(s, limit=6):
            printer.line(line)
    wrong = [(w, r) for w, r in absent_reasons(run) if "(wrong)" in w or "(error)" in w]
    for who, why in wrong[:10]:
        printer.line(f"{who}: {why}")
