"""The host's share of ``generate`` at batch 1 (or ``--batch``): the 1B model (random weights, int4
with the head quantized, then bf16), 512-token prompts, 128 new tokens, run once to capture the graphs, then
under ``cProfile``. Prints the functions by own time and by cumulative time; the time spent
waiting for the device is the own time of the call that reads the tokens back.

    PYTHONPATH=src python benchmarks/tools/generate_host_profile.py    # text in $OUT/generate_host_profile.txt
    PYTHONPATH=src python benchmarks/tools/generate_host_profile.py --batch 32 --precisions int4-head
"""
from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import tempfile
import time

import torch

from opforge.models import load
from opforge.models.testing import LLAMA_1B, write_random_checkpoint
from opforge.serve import generate, last_stats

CONTEXT, NEW = 512, 128


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--precisions", default="int4-head,bf16")
    args = parser.parse_args()
    batch = args.batch
    directory = tempfile.mkdtemp(prefix="opforge-host-")
    write_random_checkpoint(LLAMA_1B, directory, "cuda")
    report = io.StringIO()
    for precision in args.precisions.split(","):
        quantize = None if precision == "bf16" else "int4"
        model = load(directory, device="cuda", dtype=torch.bfloat16, quantize=quantize, quantize_head=bool(quantize),
                     max_seq_len=1024, max_batch=batch)
        prompt = torch.randint(0, model.config.vocab_size, (batch, CONTEXT))
        generate(model, prompt, NEW)
        generate(model, prompt, NEW)
        rate = last_stats(model).decode_tokens_per_s
        profiler = cProfile.Profile()
        t0 = time.perf_counter()
        profiler.enable()
        generate(model, prompt, NEW)
        profiler.disable()
        wall = time.perf_counter() - t0
        print(f"== {precision}: {rate:.1f} tokens/s unprofiled; profiled call {wall * 1e3:.1f} ms "
              f"({wall * 1e6 / NEW:.0f} us per step of {batch})", file=report)
        for key in ("tottime", "cumulative"):
            s = io.StringIO()
            pstats.Stats(profiler, stream=s).sort_stats(key).print_stats(28)
            print(s.getvalue()[-9000:], file=report)
        del model
        torch.cuda.empty_cache()
    text = report.getvalue()
    print(text)
    name = "generate_host_profile.txt" if batch == 1 else f"generate_host_profile_b{batch}.txt"
    with open(os.path.join(os.environ.get("OUT", "."), name), "w") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
