"""The host's share of ``generate`` at batch 1 (or ``--batch``): the 1B model (random weights, int4
with the head quantized, then bf16), 512-token prompts, 128 new tokens, run once to capture the graphs, then
under ``cProfile``. Prints the functions by own time and by cumulative time; the time spent
waiting for the device is the own time of the call that reads the tokens back.

``--split`` runs without ``cProfile`` (whose cost per Python call would swamp what it measures):
each engine step's wall time is split into the model call's launch (graph replay and input
copies), the wait for the device's tokens, and the rest (per-sequence bookkeeping: appending
tokens, planning and growing the next step). A step whose wait is near zero is bound by the host.

    PYTHONPATH=src python benchmarks/tools/generate_host_profile.py    # text in $OUT/generate_host_profile.txt
    PYTHONPATH=src python benchmarks/tools/generate_host_profile.py --batch 32 --precisions int4-head
    PYTHONPATH=src python benchmarks/tools/generate_host_profile.py --split --batch 1,8,32
"""
from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import tempfile
import time
from contextlib import contextmanager
from typing import Iterator

import torch

from opforge.models import load
from opforge.models.testing import LLAMA_1B, write_random_checkpoint
from opforge.serve import generate, last_stats
from opforge.serve.engine import Engine

CONTEXT, NEW = 512, 128


@contextmanager
def _timed_steps(steps: list[tuple[float, float, float]]) -> Iterator[None]:
    """Append (step, launches, reads) wall seconds of each engine step to ``steps``."""
    step, launch, read = Engine.step, Engine._launch, Engine._read
    current = [0.0, 0.0]

    def timed(fn, slot):
        def call(self, *args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(self, *args, **kwargs)
            finally:
                current[slot] += time.perf_counter() - t0
        return call

    def timed_step(self):
        current[0] = current[1] = 0.0
        t0 = time.perf_counter()
        try:
            return step(self)
        finally:
            steps.append((time.perf_counter() - t0, current[0], current[1]))
    Engine.step, Engine._launch, Engine._read = timed_step, timed(launch, 0), timed(read, 1)
    try:
        yield
    finally:
        Engine.step, Engine._launch, Engine._read = step, launch, read


def _split(model, batch: int, precision: str, report: io.StringIO) -> None:
    prompt = torch.randint(0, model.config.vocab_size, (batch, CONTEXT))
    generate(model, prompt, NEW)
    rows = []
    for _ in range(5):
        steps: list[tuple[float, float, float]] = []
        with _timed_steps(steps):
            generate(model, prompt, NEW)
        rate = last_stats(model).decode_tokens_per_s
        decode = steps[2:]                        # after the prefill step and the first decode step
        mean = [sum(s[i] for s in decode) * 1e6 / len(decode) for i in range(3)]
        rows.append((rate, mean))
    rows.sort(key=lambda r: r[0])
    rate, (step_us, launch_us, read_us) = rows[len(rows) // 2]
    print(f"{precision:9s} b{batch:<3d} {rate:9.1f} tokens/s ({batch * 1e6 / rate:7.1f} us per token step)  engine step"
          f" {step_us:7.1f} us = launch {launch_us:6.1f} + wait/read {read_us:6.1f} + bookkeeping "
          f"{step_us - launch_us - read_us:6.1f}  (the run of median tokens/s of 5)", file=report)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", default="1", help="batch size; with --split, a comma-separated list")
    parser.add_argument("--precisions", default="int4-head,bf16")
    parser.add_argument("--split", action="store_true", help="time the step's phases instead of profiling")
    args = parser.parse_args()
    batches = [int(b) for b in args.batch.split(",")]
    directory = tempfile.mkdtemp(prefix="opforge-host-")
    write_random_checkpoint(LLAMA_1B, directory, "cuda")
    report = io.StringIO()
    for precision in args.precisions.split(","):
        quantize = None if precision == "bf16" else "int4"
        model = load(directory, device="cuda", dtype=torch.bfloat16, quantize=quantize, quantize_head=bool(quantize),
                     max_seq_len=1024, max_batch=max(batches))
        for batch in batches if args.split else batches[:1]:
            if args.split:
                _split(model, batch, precision, report)
                continue
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
    suffix = "_split" if args.split else ("" if batches[0] == 1 else f"_b{batches[0]}")
    with open(os.path.join(os.environ.get("OUT", "."), f"generate_host_profile{suffix}.txt"), "w") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
