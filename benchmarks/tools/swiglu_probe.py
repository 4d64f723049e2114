"""SwiGLU in the int4 planes kernel's store (the product's form where K is not split) against the
product written whole, then the ``swiglu`` op (the form it replaced), on the gate|up weights.

1. Check: 1B and 8B gate|up (16384x2048, 28672x4096, planes layout, bf16 x) at M = 1, 2, 8, 16,
   32: the fused output against the float64 oracle (one rounding) and the unfused one (two).
2. Time: a CUDA graph of L calls over L weights (>= 160 MB, L2-cold), time per call, the two forms
   interleaved (three rounds each, medians).
3. ``--cli ARGS``: run ``opforge ARGS`` (e.g. ``bench --suite model ...``) with the decoder's MLP
   calling ``linear`` then ``swiglu`` (the unfused form), for the same suite at HEAD beside it.

    PYTHONPATH=src python3 benchmarks/tools/swiglu_probe.py                  # H100: under a minute
    PYTHONPATH=src python3 benchmarks/tools/swiglu_probe.py --cpu-smoke      # the logic, interpreter
    PYTHONPATH=src python3 benchmarks/tools/swiglu_probe.py --cli bench --suite model ...
"""
from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
from typing import Any

if "--cpu-smoke" in sys.argv:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch

import opforge
from opforge.models.decoder import Decoder
from opforge.testing import TOLERANCE, rel_error

sys.path.insert(0, os.path.dirname(__file__))
from int4_candidate import copies_for, graph_us, write_json  # noqa: E402

SHAPES = ((16384, 2048, "1B gate_up"), (28672, 4096, "8B gate_up"))
ROWS = (1, 2, 8, 16, 32)


def unfused(x: torch.Tensor, w: Any) -> torch.Tensor:
    h = opforge.linear(x, w)
    f = h.shape[-1] // 2
    return opforge.swiglu(h[..., :f], h[..., f:])


def oracle(x: torch.Tensor, w: Any) -> torch.Tensor:
    h = x.double() @ w.dequantize(torch.float64).T
    f = h.shape[-1] // 2
    return torch.nn.functional.silu(h[..., :f]) * h[..., f:]


def _mlp_unfused(self: Decoder, layer: Any, y: torch.Tensor) -> torch.Tensor:
    return opforge.linear(unfused(y, layer.gate_up), layer.down)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cpu-smoke", action="store_true")
    parser.add_argument("--out", default=os.environ.get("OUT", "./gpu-out"))
    parser.add_argument("--cli", nargs=argparse.REMAINDER, help="run `opforge ...` with the unfused MLP")
    args = parser.parse_args()
    if args.cli:
        from opforge.cli import main as cli_main
        Decoder._mlp = _mlp_unfused
        return cli_main(args.cli)
    smoke = args.cpu_smoke or not torch.cuda.is_available()
    device = "cpu" if smoke else "cuda"
    rows: list = []
    errors: list = []
    with opforge.backend("triton") if smoke else contextlib.nullcontext():   # the CPU runs the torch path by default
        for n, k, label in ((256, 128, "smoke"),) if smoke else SHAPES:
            g = torch.Generator(device=device).manual_seed(n + k)
            w = torch.randn((n, k), generator=g, device=device) * 0.02
            weights = [opforge.repack(opforge.quantize_weight(w + 1e-3 * i, 4, 128), "planes")
                       for i in range(copies_for(n * k // 2, smoke))]
            for m in (2, 16) if smoke else ROWS:
                x = torch.randn((m, k), generator=g, device=device).to(torch.bfloat16)
                want = oracle(x, weights[0])
                with opforge.trace() as t:
                    fused = opforge.linear(x, weights[0], activation="swiglu")
                row: dict[str, Any] = {"shape": label, "m": m, "ops": [e.op for e in t],
                                       "rel_err_fused": rel_error(fused, want),
                                       "rel_err_unfused": rel_error(unfused(x, weights[0]), want)}
                if row["rel_err_fused"] >= TOLERANCE[torch.bfloat16] or row["rel_err_unfused"] >= 2 * TOLERANCE[torch.bfloat16]:
                    errors.append(row)
                if not smoke:
                    times: dict[str, list] = {"fused": [], "unfused": []}
                    for _ in range(3):
                        times["fused"].append(graph_us([lambda wq=wq: opforge.linear(x, wq, activation="swiglu")
                                                        for wq in weights]))
                        times["unfused"].append(graph_us([lambda wq=wq: unfused(x, wq) for wq in weights]))
                    row.update({name: statistics.median(v) for name, v in times.items()})
                rows.append(row)
                print(row, flush=True)
    write_json({"device": "cpu smoke" if smoke else torch.cuda.get_device_name(), "rows": rows, "errors": errors},
               "swiglu_probe.json", args.out)
    print("errors:", errors or "none")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
