"""Markdown report: the tables for the repository (``benchmarks/results/<device>/``)."""

from __future__ import annotations

from pathlib import Path

from opforge.bench.fmt import METRIC_LABEL, absent_reasons, header_lines
from opforge.bench.report import chain_rows, suite_rows, target_lines
from opforge.bench.results import RunResult
from opforge.bench.spec import COMPILE, shape_label

METHOD = """\
How to read this: each cell is the median time per call and, for GPU-time suites, the
share of the device-to-device copy bandwidth measured in the same run (bytes that must
move, each input read once and each output written once, over time). GPU time is the
median of event-timed calls after warm-up, inputs rotating among buffers when one set
fits in L2; wall time per call is a loop of calls with one synchronize at the end. Every
implementation's output is checked against a float64 oracle first: WRONG marks a result
that failed (its time is shown, never ranked); "absent" means it could not run here.
"[1.63x]" in a peer's cell is opforge's speedup over that peer (the peer's time over
opforge's; above 1: opforge is faster); "opforge vs fastest peer" is the same against the
fastest correct peer; "opforge vs CPU" compares wall times per call.
"""


def _table(cols: list[str], rows: list[list[str]]) -> list[str]:
    esc = [[str(x).replace("|", "\\|") for x in r] for r in rows]
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in esc]
    return lines


def render(run: RunResult) -> str:
    """The whole report as Markdown text.

    Example:
        >>> # Path("results.md").write_text(render(RunResult.load_json("results.json")))
    """
    name = run.meta.get("device_name") or run.meta.get("device")
    out = [f"# opforge benchmarks: {name}", ""]
    out += [f"- {line}" for line in header_lines(run)]
    out += ["", METHOD]
    for s in run.suites:
        out += [f"## {s.name}", "", f"{s.description}. Metric: {METRIC_LABEL.get(s.metric, s.metric)}.", ""]
        cols, rows = suite_rows(s)
        out += _table(cols, rows) + [""]
        if s.chains:
            out += [f"### Chain of {s.chains[0].length} calls: eager vs CUDA graph replay (wall time per chain)", ""]
            cols, rows = chain_rows(s)
            out += _table(cols, rows) + [""]
        compiles = [(c, c.results[COMPILE]) for c in s.cases
                    if COMPILE in c.results and c.results[COMPILE].compile_s is not None]
        if compiles:
            out += ["### torch.compile first-call compile time", "",
                    "Static shapes, one compilation per shape and dtype (a shape already compiled by an",
                    "earlier suite in the same run is served from dynamo's cache).", ""]
            out += _table(["op", "shape", "dtype", "compile (s)"],
                          [[c.op, shape_label(c.shape), c.dtype, f"{r.compile_s:.2f}"] for c, r in compiles])
            out += [""]
        lines = target_lines(s, limit=1000)
        if lines:
            out += ["### Targets", ""] + [f"- {line}" for line in lines] + [""]
    notes = absent_reasons(run)
    if notes:
        out += ["## Notes", ""] + [f"- **{who}**: {why}" for who, why in notes] + [""]
    secs = run.meta.get("seconds")
    if secs is not None:
        copy = "not measured" if run.copy_gbps is None else f"{run.copy_gbps:.0f} GB/s"
        out += [f"The run took {secs} s; copy bandwidth {copy}.", ""]
    return "\n".join(out)


def write(run: RunResult, path: str | Path) -> None:
    """Write :func:`render` to ``path``. Example: ``write(run, "results.md")``."""
    Path(path).write_text(render(run))
