"""A bar chart (PNG) of the tokens/s rows of a serve- or model-suite JSON (``opforge bench --suite
serve|model --json``) or of ``opforge bench-serve --json`` (output tokens/s per mode and setting),
one bar per row, for the results folders.

    python3 benchmarks/tools/plot_rows.py serve-8b.json serve-8b.png [--title TEXT]
"""
from __future__ import annotations

import argparse
import json
from typing import Any


def value(row: dict[str, Any]) -> float:
    """Generated tokens/s of a row (0 if it has none)."""
    return row.get("tokens_per_s") or row.get("output_tokens_per_s") or 0.0


def label(row: dict[str, Any]) -> str:
    """The row's name on the chart: its shape, precision and workload (or measured point), or for
    bench-serve its mode and concurrency."""
    if "mode" in row:
        return f"{row['mode']}, concurrency {row.get('concurrency') or 'unbounded'}"
    what = row.get("workload") or row.get("what") or "?"
    impl = "" if row.get("impl") in (None, "opforge") else f" ({row['impl']})"
    return f"{row.get('shape', '')} {row.get('precision', '')} {what}{impl}".strip()


def plot(rows: list[dict[str, Any]], path: str, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = [r for r in rows if value(r) > 0]
    fig, ax = plt.subplots(figsize=(9, 0.35 * len(rows) + 1.2))
    names = [label(r) for r in rows]
    values = [value(r) for r in rows]
    bars = ax.barh(range(len(rows)), values, color="#3a6ea5")
    ax.set_yticks(range(len(rows)), names, fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("generated tokens/s, all requests (log scale)")
    ax.bar_label(bars, [f"{v:,.0f}" for v in values], fontsize=7, padding=2)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json_path")
    ap.add_argument("png_path")
    ap.add_argument("--title", default=None)
    args = ap.parse_args()
    with open(args.json_path) as f:
        data = json.load(f)
    plot(data["rows"], args.png_path, args.title or f"{args.json_path} ({data.get('device', '')})")


if __name__ == "__main__":
    main()
