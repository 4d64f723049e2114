"""One row of x on a planes-layout int4 weight (batch-1 decode through the engine): the product's
choice against the planes GEMV's tiles and the one-row planes kernel's K splits, on the weights
that read furthest from the copy bandwidth at M = 1 (1B qkv, o, down; 8B qkv, o, down).

Why: under Nsight Compute the one-row planes kernel ran 0.24-0.32 waves on 8B qkv / o (too few
programs), and the combine kernel that more K splits need is cheaper since every partial is
loaded at once; the GEMV's wide-K tiles were swept on the rows layout of the 1B weights only.

1. Check each form against ``x.double() @ w.dequantize(float64).T`` (bf16 tolerance); a form
   that fails or does not compile is reported, not timed.
2. Time: a CUDA graph of L calls over L weights (>= 160 MB, L2-cold), time per call.
3. ``--cli ARGS``: run ``opforge ARGS`` (e.g. ``bench --suite model ...``) with one row on weights
   of 16M-48M elements with K >= 4096 back on the tile of 2-8 rows (the choice before the wide
   one-row tile), for the same suite at HEAD beside it.

    PYTHONPATH=src python3 benchmarks/tools/one_row_sweep.py                 # H100: about a minute
    PYTHONPATH=src python3 benchmarks/tools/one_row_sweep.py --shapes "8B gate_up,8B head" --no-gemv
    PYTHONPATH=src python3 benchmarks/tools/one_row_sweep.py --cpu-smoke     # the logic, interpreter
"""
from __future__ import annotations

import contextlib
import os
import sys
from typing import Any, Callable

if "--cpu-smoke" in sys.argv:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch

import opforge
from opforge.ops.quant import planes, planes_tiles, repack, triton_kernels as tk
from opforge.ops.quant.problem import prepare

sys.path.insert(0, os.path.dirname(__file__))
from int4_candidate import copies_for, form_error, graph_us, oracle, probe_parser, write_json  # noqa: E402

SHAPES = [(3072, 2048, "1B qkv"), (2048, 2048, "1B o"), (2048, 8192, "1B down"),
          (6144, 4096, "8B qkv"), (4096, 4096, "8B o"), (4096, 14336, "8B down")]
#: ``--shapes`` may name these too (the weights of 48M+ elements, on the two-warp tile at one row)
MORE_SHAPES = [(16384, 2048, "1B gate_up"), (28672, 4096, "8B gate_up"), (128256, 2048, "1B head"),
               (128256, 4096, "8B head")]
#: the planes GEMV: (BLOCK_N rows, BLOCK_K codes) at 4, 8 and 16 KB per step; warps; stages; programs per SM
GEMV_TILES = [(bn, bk) for bn, bk in ((8, 1024), (4, 2048), (16, 1024), (8, 2048), (4, 4096), (32, 1024), (16, 2048),
                                      (8, 4096))]
GEMV_FORMS = [(bn, bk, w, s, pps) for bn, bk in GEMV_TILES for w in (4, 8) for s in (1, 2) for pps in (2, 4)]
#: the one-row planes kernel: (BLOCK_N, warps, stages, chunks per step) x programs per SM
MMA_TILES = [(64, 4, 4, 1), (64, 2, 3, 2), (32, 2, 3, 2), (128, 4, 4, 1), (128, 4, 4, 2), (128, 8, 3, 1),
             (64, 4, 4, 2)]
MMA_FORMS = [(bn, w, s, ch, pps) for bn, w, s, ch in MMA_TILES for pps in (2, 4, 8, 16)]


def forms(calls: list, k: int, gemv: bool = True) -> dict[str, Callable[[Any], torch.Tensor]]:
    out: dict[str, Callable[[Any], torch.Tensor]] = {}
    for bn, bk, w, s, pps in GEMV_FORMS if gemv else []:
        if k % bk == 0:
            out[f"gemv {bn}x{bk} w{w} s{s} pps{pps}"] = \
                lambda c, cfg=(1, bn, bk, False, w, s), pps=pps: tk.launch_config(c, cfg, pps)
    for bn, w, s, ch, pps in MMA_FORMS:
        out[f"mma {bn} w{w} s{s} c{ch} pps{pps}"] = \
            lambda c, cfg=(16, bn, w, s, pps, ch, False, True, False): planes.launch_planes(c, cfg)
    return out


def _before_wide_one_row() -> None:
    """``planes_config`` as it was before the wide one-row tile, in the module that launches with it."""
    rule = planes_tiles.planes_config

    def config(p: Any) -> tuple:
        if p.m == 1 and p.k >= planes_tiles.PLANES_WIDE_MIN_K and p.n * p.k < planes_tiles.PLANES_LARGE_MIN_NK:
            return (16,) + planes_tiles.PLANES_TILE_FEW_ROWS
        return rule(p)
    planes.planes_config = config


def main() -> int:
    parser = probe_parser("the choice before the wide one-row tile")
    parser.add_argument("--shapes", help="comma-separated labels (default: the six of SHAPES), of "
                        + ", ".join(label for _, _, label in SHAPES + MORE_SHAPES))
    parser.add_argument("--no-gemv", action="store_true", help="time the planes kernel's forms only")
    args = parser.parse_args()
    if args.cli:
        from opforge.cli import main as cli_main
        _before_wide_one_row()
        return cli_main(args.cli)
    smoke = args.cpu_smoke or not torch.cuda.is_available()
    device = "cpu" if smoke else "cuda"
    rows: list = []
    errors: list = []
    with opforge.backend("triton") if smoke else contextlib.nullcontext():   # the CPU runs the torch path by default
        chosen = SHAPES if not args.shapes else [s for s in SHAPES + MORE_SHAPES if s[2] in args.shapes.split(",")]
        for n, k, label in [(64, 4096, "smoke")] if smoke else chosen:
            g = torch.Generator(device=device).manual_seed(n + k)
            w = torch.randn((n, k), generator=g, device=device) * 0.02
            ws = [repack(opforge.quantize_weight(w + 1e-3 * i, 4, 128), "planes")
                  for i in range(copies_for(n * k // 2, smoke))]
            x = torch.randn((1, k), generator=g, device=device).to(torch.bfloat16)
            want = oracle(x, ws[0])
            calls = [prepare(x, wq, None) for wq in ws]
            us: dict[str, float] = {}
            candidates = {"default": lambda c: opforge.linear(c.x, c.w), **forms(calls, k, not args.no_gemv)}
            if smoke:
                candidates = dict(list(candidates.items())[:3]) | dict(list(candidates.items())[-2:])
            for name, fn in candidates.items():
                problem = form_error(lambda: fn(calls[0]), want)
                if problem:
                    errors.append(f"{label} {name}: {problem}")
                    continue
                if not smoke:
                    us[name] = graph_us([lambda c=c: fn(c) for c in calls])
            best = sorted(us.items(), key=lambda kv: kv[1])[:8]
            rows.append({"shape": label, "n": n, "k": k, "us": us})
            print(label, "default", round(us.get("default", 0.0), 2), "best", [(a, round(b, 2)) for a, b in best],
                  flush=True)
            del ws, calls
            if not smoke:
                torch.cuda.empty_cache()
    write_json({"device": "cpu smoke" if smoke else torch.cuda.get_device_name(), "rows": rows, "errors": errors},
               "one_row_sweep.json", args.out)
    print("errors:", errors or "none")
    return 0


if __name__ == "__main__":
    sys.exit(main())
