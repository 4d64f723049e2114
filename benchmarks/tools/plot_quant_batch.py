"""Speed against cuBLAS bf16 per M of a ``quant_batch`` suite JSON (``opforge bench --suite
quant_batch --json``), one line per weight shape, for the results folders.

    python3 benchmarks/tools/plot_quant_batch.py quant_batch.json quant_batch.png
"""
from __future__ import annotations

import json
import sys


def speedups(path: str) -> dict[str, list[tuple[int, float]]]:
    """{"NxK": [(M, cuBLAS time / opforge time), ...]} from the suite's cases."""
    out: dict[str, list[tuple[int, float]]] = {}
    for suite in json.load(open(path))["suites"]:
        for case in suite["cases"]:
            m, n, k = case["shape"]
            res = case["results"]
            if res["opforge"]["status"] == "ok" and res["torch"]["status"] == "ok":
                out.setdefault(f"{n}x{k}", []).append((m, res["torch"]["gpu_us"] / res["opforge"]["gpu_us"]))
    return out


def main(argv: list[str]) -> int:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    src, dst = argv[:2]
    fig, ax = plt.subplots(figsize=(8, 5))
    for shape, points in sorted(speedups(src).items()):
        points.sort()
        ax.plot([m for m, _ in points], [s for _, s in points], marker="o", label=shape)
    ax.set_xscale("log", base=2)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xlabel("rows of x (M)")
    ax.set_ylabel("speed vs cuBLAS bf16 (x)")
    ax.set_title("int4 g128, planes layout, H100 (GPU time, weights L2-cold)")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(dst, dpi=110)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
