"""Where ``generate``'s time per token goes beyond the decode step's: the 1B model (random
weights, bf16 and int4 with the head quantized), prompts of 512 tokens (one, or ``--batch``), 64
new tokens, under ``torch.profiler``. Reports wall time per decode step, the GPU's busy share of
it (the union of kernel intervals: programmatic dependent launch overlaps kernels) and its idle
gaps, and the kernels' summed time per step by name.

    PYTHONPATH=src python benchmarks/tools/generate_gaps.py    # JSON in $OUT/generate_gaps.json
    PYTHONPATH=src python benchmarks/tools/generate_gaps.py --batch 32    # generate_gaps_b32.json
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.dirname(__file__))
from int4_candidate import write_json  # noqa: E402

from opforge.models import load  # noqa: E402
from opforge.models.testing import LLAMA_1B, write_random_checkpoint  # noqa: E402
from opforge.serve import generate, last_stats  # noqa: E402

CONTEXT, NEW = 512, 64


def union_us(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=1)
    batch = parser.parse_args().batch
    directory = tempfile.mkdtemp(prefix="opforge-gaps-")
    write_random_checkpoint(LLAMA_1B, directory, "cuda")
    result = {"device": torch.cuda.get_device_name(), "batch": batch, "rows": []}
    for precision, quantize in (("bf16", None), ("int4-head", "int4")):
        model = load(directory, device="cuda", dtype=torch.bfloat16, quantize=quantize, quantize_head=bool(quantize),
                     max_seq_len=1024, max_batch=batch)
        prompt = torch.randint(0, model.config.vocab_size, (batch, CONTEXT))
        generate(model, prompt, NEW)
        rates = []
        for _ in range(3):
            generate(model, prompt, NEW)
            rates.append(last_stats(model).decode_tokens_per_s)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            generate(model, prompt, NEW)
            torch.cuda.synchronize()
            wall = time.perf_counter() - t0
        kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        kernels.sort(key=lambda e: e.time_range.start)
        # the decode window: from the last kernel of the prefill's longest gap on; simpler: the last NEW-1 steps
        # are the final 80% of the timeline
        start = kernels[0].time_range.start
        end = max(e.time_range.end for e in kernels)
        cut = start + 0.2 * (end - start)
        window = [e for e in kernels if e.time_range.start >= cut]
        span = max(e.time_range.end for e in window) - window[0].time_range.start
        busy = union_us([(e.time_range.start, e.time_range.end) for e in window])
        gaps = []
        last_end = window[0].time_range.end
        for e in window[1:]:
            if e.time_range.start - last_end > 3.0:
                gaps.append((round(e.time_range.start - last_end, 1), e.name[:60]))
            last_end = max(last_end, e.time_range.end)
        steps = sum(1 for e in window if "argmax" in e.name or "Argmax" in e.name) or None
        per_name = defaultdict(float)
        for e in window:
            per_name[e.name[:70]] += e.time_range.end - e.time_range.start
        steps_in_window = span / (1e6 * batch / sorted(rates)[1])
        row = {"precision": precision, "decode_tokens_per_s": sorted(rates)[1], "profiled_wall_s": wall,
               "window_us": span, "busy_fraction": busy / span, "steps_in_window": steps_in_window,
               "gaps_over_3us": len(gaps), "gap_us_total": sum(g[0] for g in gaps), "largest_gaps": sorted(gaps)[-8:],
               "argmax_kernels": steps,
               "kernels_us_per_step": {k: round(v / steps_in_window, 2) for k, v in
                                        sorted(per_name.items(), key=lambda kv: -kv[1])[:25]}}
        print(json.dumps(row, indent=1), flush=True)
        result["rows"].append(row)
        del model
        torch.cuda.empty_cache()
    write_json(result, "generate_gaps.json" if batch == 1 else f"generate_gaps_b{batch}.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
