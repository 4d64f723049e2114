"""Why the one-row GEMV reads a planes-layout weight slower than a rows-layout one (H100: 0.82-0.94x
in the ``quant_batch`` suite), and the dequantize kernel on both layouts. CUDA graphs over
L2-cold weight copies (``int4_candidate.graph_us``), bf16 x, int4 g128, the nine 1B/8B shapes.

Forms at M = 1: ``rows`` / ``planes`` (each weight's own GEMV); ``planes words as rows`` (the rows
GEMV over the planes weight's words: the same weight bytes, x read as rows reads it; the result is
not the weight's, so it is timed, not checked); ``rows words as planes`` (the converse); the planes
GEMV at other wide-K tiles. Then ``dequantize`` rows vs planes.

    PYTHONPATH=src python benchmarks/tools/gemv_layout_probe.py      # JSON in $OUT/gemv_layout_probe.json
"""
from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from int4_candidate import SHAPES_1B, SHAPES_8B, copies_for, graph_us, oracle, write_json  # noqa: E402

import opforge  # noqa: E402
from opforge.ops.quant import repack, triton_kernels as tk  # noqa: E402
from opforge.ops.quant.problem import prepare  # noqa: E402
from opforge.ops.quant.weight import QuantizedWeight  # noqa: E402

TILES = [(1, 16, 1024, False, 4, 1), (1, 4, 2048, False, 4, 1)]


def relabel(w: QuantizedWeight, layout: str) -> QuantizedWeight:
    return QuantizedWeight(w.packed, w.scales_t, w.zeros_t, w.bits, w.group_size, w.shape, layout)


def main() -> int:
    rows = []
    for n, k, label in SHAPES_1B + SHAPES_8B:
        g = torch.Generator(device="cuda").manual_seed(n + k)
        base = torch.randn((n, k), generator=g, device="cuda").mul_(0.02)
        qw = opforge.quantize_weight(base, 4, 128)
        copies = copies_for(qw.nbytes, False)
        qs = [qw] + [opforge.quantize_weight(base + 1e-3 * i, 4, 128) for i in range(1, copies)]
        ps = [repack(q, "planes") for q in qs]
        x = torch.randn((1, k), device="cuda", dtype=torch.bfloat16)
        want = oracle(x, qw)
        err = {name: float((opforge.linear(x, w[0]).double() - want).norm() / want.norm())
               for name, w in (("rows", qs), ("planes", ps))}
        us = {"rows": graph_us([lambda q=q: opforge.linear(x, q) for q in qs]),
              "planes": graph_us([lambda p=p: opforge.linear(x, p) for p in ps]),
              "planes words as rows": graph_us([lambda p=relabel(p, "rows"): opforge.linear(x, p) for p in ps]),
              "rows words as planes": graph_us([lambda q=relabel(q, "planes"): opforge.linear(x, q) for q in qs])}
        calls = [prepare(x, p, None) for p in ps]
        for cfg in TILES:
            if k % cfg[2]:
                continue
            try:
                us[f"planes {cfg[1]}x{cfg[2]} w{cfg[4]} s{cfg[5]}"] = graph_us(
                    [lambda c=c: tk.launch_config(c, cfg, 4, join=False, swap=False) for c in calls])
            except Exception as exc:   # report, go on
                us[f"planes {cfg[1]}x{cfg[2]} w{cfg[4]} s{cfg[5]}"] = f"error: {str(exc).splitlines()[0][:120]}"
        for name, ws in (("dequant rows", qs), ("dequant planes", ps)):
            us[name] = graph_us([lambda w=w: tk.dequantize(w, torch.bfloat16) for w in ws])
        assert torch.equal(tk.dequantize(ps[0], torch.bfloat16), tk.dequantize(qs[0], torch.bfloat16))
        row = {"shape": label, "n": n, "k": k, "rel_err": err, "us": us}
        rows.append(row)
        print(label, {a: (round(b, 1) if isinstance(b, float) else b) for a, b in us.items()}, flush=True)
        del qs, ps, calls
        torch.cuda.empty_cache()
    write_json({"device": torch.cuda.get_device_name(), "rows": rows}, "gemv_layout_probe.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
