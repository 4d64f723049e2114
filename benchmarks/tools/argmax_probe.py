"""The greedy argmax over 128256-wide logits (``serve.sampling.argmax_rows``): its two stages at
other chunk sizes, and torch's one-stage ``argmax``, on bf16 and float32 logits at 1, 8 and 32
rows; GPU time per call from a CUDA graph of 20 calls (``int4_candidate.graph_us``).

    PYTHONPATH=src python benchmarks/tools/argmax_probe.py    # JSON in $OUT/argmax_probe.json
"""
from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from int4_candidate import graph_us, write_json  # noqa: E402

from opforge.serve.sampling import argmax_rows  # noqa: E402

VOCAB = 128256


def two_stage(logits: torch.Tensor, chunk: int) -> torch.Tensor:
    b, v = logits.shape
    best, where = logits.view(b, v // chunk, chunk).max(-1)
    first = best.argmax(-1, keepdim=True)
    return (first * chunk + where.gather(-1, first))[:, 0]


def main() -> int:
    rows = []
    for dtype in (torch.bfloat16, torch.float32):
        for b in (1, 8, 32):
            x = torch.randn(b, VOCAB, device="cuda").to(dtype)
            want = x.float().argmax(-1)
            row = {"dtype": str(dtype).replace("torch.", ""), "rows": b,
                   "default_us": graph_us([lambda: argmax_rows(x)] * 20),
                   "torch argmax_us": graph_us([lambda: x.argmax(-1)] * 20)}
            for chunk in (256, 501, 1002, 2004):
                assert torch.equal(two_stage(x, chunk), want)
                row[f"chunk {chunk}_us"] = graph_us([lambda c=chunk: two_stage(x, c)] * 20)
            print(row, flush=True)
            rows.append(row)
    write_json({"device": torch.cuda.get_device_name(), "rows": rows}, "argmax_probe.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
