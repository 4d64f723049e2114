"""The planes kernel's codes (and x) through tensor descriptors (Hopper's TMA copies) against its
pointer loads, on the nine 1B/8B projection shapes and the 8B head at 1, 16, 32 and 64 rows.

1. Check: each form (``ptr``: pointer loads; ``w``: the codes through a descriptor; ``wx``: the codes
   and x) gives the bits of ``ptr`` and is within bf16's tolerance of ``x.double() @ w.T`` (float64).
2. Time: a CUDA graph of L launches of ``planes.launch_planes`` (the product's tiles for the shape)
   over L weight copies (>= 160 MB in all, L2-cold), per form the mean of two graphs timed in the
   order ptr, w, wx, wx, w, ptr (the first graph timed on new weights reads slow); and the wall
   time per eager call (host cost of building descriptors).
3. ``--tma ptr|rule --cli ARGS``: run ``opforge ARGS`` (e.g. ``bench --suite model ...``) with
   pointer loads everywhere or with the product's rule (``planes_tiles.planes_tma``).

    PYTHONPATH=src python3 benchmarks/tools/planes_tma_probe.py              # H100: about two minutes
    PYTHONPATH=src python3 benchmarks/tools/planes_tma_probe.py --tma ptr --cli bench --suite model --shapes 8b
    python3 benchmarks/tools/planes_tma_probe.py --plot planes_tma_probe.json planes_tma_probe.png
"""
from __future__ import annotations

import os
import sys

import torch

import opforge
from opforge.bench.timing import Clock
from opforge.ops.quant import planes, planes_tiles, repack
from opforge.ops.quant.problem import prepare

sys.path.insert(0, os.path.dirname(__file__))
from int4_candidate import SHAPE_8B_HEAD, SHAPES_1B, SHAPES_8B, copies_for, form_error, graph_us, oracle, \
    probe_parser, write_json  # noqa: E402

FORMS = {"ptr": (False, False), "w": (True, False), "wx": (True, True)}
#: --cli forms: pointers everywhere, or the product's rule (``planes_tiles.planes_tma``)
CLI_FORMS = ("ptr", "rule")
ORDER = ("ptr", "w", "wx", "wx", "w", "ptr")


def _wall_us(fn, calls: int = 200) -> float:
    """Wall time per eager call (after one warm-up call), by the bench harness's clock."""
    fn()
    return Clock(torch.device("cuda")).wall_per_call(fn, [()], calls)


def _case(label: str, ws: list, x: torch.Tensor, want: torch.Tensor) -> dict:
    row: dict = {"shape": label, "m": x.shape[0], "n": ws[0].shape[0], "k": ws[0].shape[1],
                 "config": list(planes_tiles.planes_config(prepare(x, ws[0], None).problem))}

    def run(form: str, w) -> torch.Tensor:
        tma, x_tma = FORMS[form]
        return planes.launch_planes(prepare(x, w, None), tma=tma, x_tma=x_tma)

    base = run("ptr", ws[0])
    row["errors"] = {f: form_error(lambda f=f: run(f, ws[0]), want) for f in FORMS}
    row["bitwise_equal"] = {f: bool(torch.equal(run(f, ws[0]), base)) for f in FORMS}
    ok = [f for f in FORMS if row["errors"][f] is None and row["bitwise_equal"][f]]
    times: dict = {f: [] for f in ok}
    for f in ORDER:
        if f in ok:
            times[f].append(graph_us([lambda w=w, f=f: run(f, w) for w in ws]))
    row["us"] = {f: sum(t) / len(t) for f, t in times.items()}
    row["wall_us"] = {f: _wall_us(lambda f=f: run(f, ws[0])) for f in ok}
    print(row, flush=True)
    return row


def plot(src: str, dst: str) -> int:
    """Time with descriptors (codes and x) over time with pointers, per weight against rows."""
    import json

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    lines: dict = {}
    for r in json.load(open(src))["rows"]:
        if "wx" in r["us"] and "ptr" in r["us"]:
            lines.setdefault(r["shape"], []).append((r["m"], r["us"]["wx"] / r["us"]["ptr"]))
    fig, ax = plt.subplots(figsize=(8, 5))
    for label, points in sorted(lines.items()):
        points.sort()
        ax.plot([m for m, _ in points], [v for _, v in points], marker="o", label=label)
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("rows of x (M)")
    ax.set_ylabel("time with descriptors / with pointers (below 1: faster)")
    ax.set_title("planes kernel: codes and x through TMA descriptors (H100, CUDA graphs, L2-cold)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(dst, dpi=110)
    return 0


def main() -> int:
    if sys.argv[1:2] == ["--plot"]:
        return plot(sys.argv[2], sys.argv[3])
    parser = probe_parser("a form of the planes kernel's loads as the default")
    parser.add_argument("--tma", choices=CLI_FORMS, default=None, help="the form --cli runs with")
    parser.add_argument("--rows", default="1,16,32,64")
    parser.add_argument("--shapes", default="", help="comma-separated labels (default: all ten)")
    args = parser.parse_args()
    if args.cli:
        from opforge.cli import main as cli_main
        if args.tma is None:
            parser.error("--cli needs --tma")
        if args.tma == "ptr":
            planes_tiles.planes_tma = lambda p: (False, False)
        return cli_main(args.cli)
    rows_m = [int(v) for v in args.rows.split(",")]
    results = []
    g = torch.Generator(device="cuda").manual_seed(0)
    wanted = set(args.shapes.split(",")) if args.shapes else None
    for n, k, label in SHAPES_1B + SHAPES_8B + [SHAPE_8B_HEAD]:
        if wanted and label not in wanted:
            continue
        w = torch.randn((n, k), generator=g, device="cuda") * 0.02
        ws = [repack(opforge.quantize_weight(w + 1e-3 * i, 4, 128), "planes")
              for i in range(copies_for(n * k // 2, False))]
        for m in rows_m:
            x = torch.randn((m, k), generator=g, device="cuda").to(torch.bfloat16)
            if planes.supports_planes(prepare(x, ws[0], None).problem) is not None and m > 1:
                continue    # dequant+cuBLAS runs it
            if m == 1 and n * k < planes_tiles.PLANES_MMA_MIN_NK:
                continue    # the planes GEMV runs it
            results.append(_case(label, ws, x, oracle(x, ws[0])))
        del ws
    write_json({"device": torch.cuda.get_device_name(), "rows": results}, "planes_tma_probe.json", args.out)
    bad = [r for r in results if any(r["errors"].values()) or not all(r["bitwise_equal"].values())]
    print("failures:", [(r["shape"], r["m"], r["errors"], r["bitwise_equal"]) for r in bad] or "none")
    for r in results:
        us = r["us"]
        print(f"{r['shape']:12s} M={r['m']:3d} " + " ".join(f"{f} {us[f]:7.2f}" for f in us)
              + ("  w/ptr %.3f wx/ptr %.3f" % (us.get("w", 0) / us["ptr"], us.get("wx", 0) / us["ptr"])
                 if "ptr" in us else "")
              + "  wall " + " ".join(f"{f} {v:5.1f}" for f, v in r["wall_us"].items()))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
