"""The weight prefetch before the PDL wait (``config.PREFETCH_BYTES``): each decode GEMV after the
kernel before it, with and without the prefetch.

1. Check: ``opforge.linear`` at one and eight rows of x on int4 ``planes`` weights (the 8B
   projections and output head; the smaller ones do not prefetch, ``PLANES_PREFETCH_MIN_NK``)
   gives the same bits with the prefetch as without, and is within bf16's tolerance of
   ``x.double() @ w.T`` (float64).
2. Time: a CUDA graph of L pairs ``rms_norm`` -> ``linear`` over L weight copies (>= 160 MB in
   all, L2-cold), the norm standing for the kernel a decode GEMV follows; per pair, with the
   budget of ``--bytes`` (default: the product's) and with none, each the mean of two graphs
   timed in the order without, with, with, without.
3. ``--bytes N --cli ARGS``: run ``opforge ARGS`` (e.g. ``bench --suite model ...``) with a budget of
   N bytes (0: no prefetch), for the same suite at HEAD beside it.

    PYTHONPATH=src python3 benchmarks/tools/prefetch_probe.py                 # H100: about a minute
    PYTHONPATH=src python3 benchmarks/tools/prefetch_probe.py --bytes 0 --cli bench --suite model --shapes 1b
"""
from __future__ import annotations

import os
import sys

import torch

import opforge
from opforge.ops.quant import config, repack

sys.path.insert(0, os.path.dirname(__file__))
from int4_candidate import copies_for, form_error, graph_us, oracle, probe_parser, write_json  # noqa: E402

INT4 = [(28672, 4096, "8B gate_up"), (4096, 14336, "8B down"), (128256, 4096, "8B head")]


def _with_budget(budget: int, fn):
    saved, config.PREFETCH_BYTES = config.PREFETCH_BYTES, budget
    try:
        return fn()
    finally:
        config.PREFETCH_BYTES = saved


def _case(label: str, ws: list, x: torch.Tensor, want: torch.Tensor, budget: int) -> dict:
    norm_w = torch.ones(x.shape[-1], device=x.device, dtype=x.dtype)
    row: dict = {"shape": label, "m": x.shape[0], "budget": budget}
    on = _with_budget(budget, lambda: opforge.linear(x, ws[0]))
    off = _with_budget(0, lambda: opforge.linear(x, ws[0]))
    row["bitwise_equal"] = bool(torch.equal(on, off))
    row["error"] = form_error(lambda: on, want)
    if row["bitwise_equal"] and row["error"] is None:
        pairs = [lambda w=w: opforge.linear(opforge.rms_norm(x, norm_w), w) for w in ws]
        times: dict = {0: [], budget: []}
        for b in (0, budget, budget, 0):   # both orders: the first graph timed on new weights reads slow
            times[b].append(_with_budget(b, lambda: graph_us(pairs)))
        row["us_with"], row["us_without"] = (sum(times[budget]) / 2, sum(times[0]) / 2)
    print(row, flush=True)
    return row


def main() -> int:
    parser = probe_parser("another prefetch budget")
    parser.add_argument("--bytes", type=int, default=None, help="weight bytes prefetched per launch (0: none)")
    args = parser.parse_args()
    if args.cli:
        from opforge.cli import main as cli_main
        if args.bytes is None:
            parser.error("--cli needs --bytes")
        config.PREFETCH_BYTES = args.bytes
        return cli_main(args.cli)
    budget = config.PREFETCH_BYTES if args.bytes is None else args.bytes
    if budget <= 0:
        parser.error("the probe compares a budget with none: --bytes must be > 0 without --cli")
    rows = []
    g = torch.Generator(device="cuda").manual_seed(0)
    for n, k, label in INT4:
        w = torch.randn((n, k), generator=g, device="cuda") * 0.02
        ws = [repack(opforge.quantize_weight(w + 1e-3 * i, 4, 128), "planes") for i in range(copies_for(n * k // 2, False))]
        for m in (1, 8):
            x = torch.randn((m, k), generator=g, device="cuda").to(torch.bfloat16)
            rows.append(_case(label, ws, x, oracle(x, ws[0]), budget))
        del ws
    write_json({"device": torch.cuda.get_device_name(), "budget": budget, "rows": rows}, "prefetch_probe.json", args.out)
    bad = [r for r in rows if not r["bitwise_equal"] or r["error"]]
    print("failures:", bad or "none")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
