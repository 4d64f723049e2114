"""Plots (matplotlib): per suite, one panel per (op, dtype), one line per implementation.

GPU-time suites plot the share of copy bandwidth per shape; wall-time suites plot wall
time per call (log scale). Absent and wrong results leave gaps: they are not zeros.
"""

from __future__ import annotations

import math
from pathlib import Path

from opforge.bench.fmt import ordered_impls
from opforge.bench.results import OK, RunResult, SuiteResult
from opforge.bench.spec import CPU, shape_label


#: One color per implementation, the same in every panel and every plot.
COLORS = {"opforge": "tab:blue", "torch": "tab:orange", "torch.compile": "tab:green", "liger": "tab:red",
          "torch-cpu": "tab:gray"}


def plot_paths(path: str | Path, suites: list[str]) -> dict[str, Path]:
    """Where each suite's plot goes: ``path`` itself for one suite, else ``<stem>-<suite><ext>``.

    Example:
        >>> sorted(plot_paths("out/bw.png", ["seed", "llm"]).values())
        [PosixPath('out/bw-llm.png'), PosixPath('out/bw-seed.png')]
    """
    p = Path(path)
    if len(suites) == 1:
        return {suites[0]: p}
    return {s: p.with_name(f"{p.stem}-{s}{p.suffix}") for s in suites}


def _pyplot():  # type: ignore[no-untyped-def]
    import matplotlib

    matplotlib.use("Agg")  # files only: never open a window
    import matplotlib.pyplot as plt

    return plt


def _figure(suite: SuiteResult, device: str):  # type: ignore[no-untyped-def]
    plt = _pyplot()
    panels = list(dict.fromkeys((c.op, c.dtype) for c in suite.cases))
    ncols = min(4, max(1, len(panels)))
    nrows = max(1, math.ceil(len(panels) / ncols))
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.2 * ncols, 3.4 * nrows), squeeze=False)
    wall = suite.metric == "wall_us"
    impls = [i for i in ordered_impls(suite) if wall or i != CPU]
    for k, (op, dtype) in enumerate(panels):
        ax = axes[k // ncols][k % ncols]
        cases = [c for c in suite.cases if c.op == op and c.dtype == dtype]
        labels = [shape_label(c.shape) for c in cases]
        for impl in impls:
            ys = []
            for c in cases:
                r = c.results.get(impl)
                v = None
                if r is not None and r.status == OK:
                    v = r.wall_us if wall else r.pct_copy
                ys.append(float("nan") if v is None else v)
            if all(math.isnan(y) for y in ys):
                continue
            ax.plot(range(len(cases)), ys, marker="o", label=impl, color=COLORS.get(impl),
                    linewidth=2.2 if impl == "opforge" else 1.2)
        ax.set_title(f"{op} {dtype}", fontsize=10)
        ax.set_xticks(range(len(cases)))
        ax.set_xticklabels(labels, rotation=35, ha="right", fontsize=7)
        if wall:
            ax.set_yscale("log")
            ax.set_ylabel("wall time per call (us)", fontsize=8)
        else:
            ax.set_ylabel("% of copy bandwidth", fontsize=8)
            ax.set_ylim(0, max(105.0, ax.get_ylim()[1]))
            ax.axhline(100, color="grey", linewidth=0.6, linestyle=":")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    for k in range(len(panels), nrows * ncols):
        axes[k // ncols][k % ncols].axis("off")
    what = "wall time per call" if wall else "share of device-to-device copy bandwidth"
    fig.suptitle(f"opforge bench '{suite.name}': {what} on {device}", fontsize=11)
    fig.tight_layout()
    return fig


def write(run: RunResult, path: str | Path) -> list[Path]:
    """Write one image per suite (see :func:`plot_paths`); returns the paths written.

    Example:
        >>> # write(RunResult.load_json("results.json"), "bandwidth.png")
    """
    plt = _pyplot()
    device = str(run.meta.get("device_name") or run.meta.get("device"))
    written = []
    for name, p in plot_paths(path, [s.name for s in run.suites]).items():
        suite = next(s for s in run.suites if s.name == name)
        if not suite.cases:
            continue
        fig = _figure(suite, device)
        fig.savefig(p, dpi=110)
        plt.close(fig)
        written.append(p)
    return written
