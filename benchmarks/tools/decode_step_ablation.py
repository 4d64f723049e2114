"""Where a decode step's microseconds go (1B shape, or ``--model 8b``): the step's CUDA graph timed
whole, then with one kind of kernel left out at a time (its call returns an input instead of
launching), at a batch size (default 1), context 512. A difference is the most a fusion that
removes those launches can save; it is timing only (the ablated steps compute nothing useful and
are not checked). ``--profile`` adds each kernel name's GPU time per step, and each launch of a
step in order (the median over the profiled steps), which tells apart the projections one kernel
name serves.

Kinds: the norms (``rms_norm``, ``add_rms_norm``), ``swiglu``, the rotary + KV-cache append, decode
attention (split + merge), every ``linear`` (the GEMVs: what is left is everything else), the
output head's ``linear`` alone, the attention projections' (q|k|v and o) alone, and all but the
GEMVs. Precisions: bf16 and int4 with the head quantized (planes, rows).

    PYTHONPATH=src python benchmarks/tools/decode_step_ablation.py    # JSON in $OUT/decode_step_ablation.json
    PYTHONPATH=src python benchmarks/tools/decode_step_ablation.py --batch 32 --precisions bf16,planes
    PYTHONPATH=src python benchmarks/tools/decode_step_ablation.py --model 8b --precisions planes --profile
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(__file__))
from int4_candidate import graph_us, write_json  # noqa: E402

from opforge import api as opforge   # the module the decoder calls through  # noqa: E402
from opforge.models import load  # noqa: E402
from opforge.models.testing import LLAMA_1B, LLAMA_8B, write_random_checkpoint  # noqa: E402

CONTEXT = 512
NON_GEMV = ("norms", "swiglu", "rotary_append", "attention")
MODELS = {"1b": LLAMA_1B, "8b": LLAMA_8B}


def _patches(kind: str, zeros: dict, config: dict = LLAMA_1B) -> dict:
    real_linear = opforge.linear

    def left_out(w) -> bool:
        """Whether this kind leaves the call on ``w`` out: every linear, or the output head (the
        one weight with the vocabulary's rows), or the attention projections (K = hidden, at most
        twice hidden rows: q|k|v and o)."""
        n, k = w.shape   # a QuantizedWeight's shape is the logical (N, K) too
        if kind == "head":
            return n == config["vocab_size"]
        if kind == "qkv_o":
            return n <= 2 * config["hidden_size"] and n != config["vocab_size"] and k == config["hidden_size"]
        return True

    def no_linear(x, w, bias=None, activation=None):
        if not left_out(w):
            return real_linear(x, w, bias=bias, activation=activation)
        shape = (*x.shape[:-1], w.shape[0] // (2 if activation else 1))
        if shape not in zeros:            # filled by the warm-up run, before the capture
            zeros[shape] = torch.zeros(shape, dtype=x.dtype, device=x.device)
        return zeros[shape]
    table = {"norms": {"rms_norm": lambda x, w, eps=1e-6: x, "add_rms_norm": lambda a, h, w, eps=1e-6: (a, h)},
             "swiglu": {"swiglu": lambda g, u: g},
             "rotary_append": {"rotary_kv_cache_append": lambda q, k, v, kc, vc, s, cos, sin, check=True: q},
             "attention": {"decode_attention": lambda q, k, v, total, scale=None: q},
             "linear": {"linear": no_linear}, "head": {"linear": no_linear}, "qkv_o": {"linear": no_linear}}
    if kind == "non_gemv":
        out = {}
        for name in NON_GEMV:
            out.update(table[name])
        return out
    return table.get(kind, {})


def step_us(model, kind: str, batch: int = 1, replays: int = 50, config: dict = LLAMA_1B) -> float:
    """GPU time of one decode step (``batch`` rows, its cache as filled) with ``kind`` left out: the
    patches are in place while the step is warmed up and captured, then restored."""
    zeros: dict = {}
    patches = _patches(kind, zeros, config)
    saved = {name: getattr(opforge, name) for name in patches}
    for name, fn in patches.items():
        setattr(opforge, name, fn)
    tokens = torch.zeros((batch,), dtype=torch.long, device="cuda")
    try:
        return graph_us([lambda: model.decode_step(tokens, model.cache_seqlens[:batch], float_logits=False)], replays)
    finally:
        for name, fn in saved.items():
            setattr(opforge, name, fn)


def kernel_table(model, batch: int, steps: int = 20) -> tuple[list[dict], list[dict]]:
    """GPU time per step of each kernel name in the full step (torch.profiler over eager steps,
    whose kernels are the graph's), the most expensive first; and ``launch_sequence``."""
    tokens = torch.zeros((batch,), dtype=torch.long, device="cuda")
    step = lambda: model.decode_step(tokens, model.cache_seqlens[:batch], float_logits=False)  # noqa: E731
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    rows = [{"kernel": e.key[:90], "us_per_step": e.device_time_total / steps, "calls_per_step": e.count / steps}
            for e in prof.key_averages() if e.device_time_total > 0]
    return sorted(rows, key=lambda r: -r["us_per_step"]), launch_sequence(prof, steps)


def launch_sequence(prof, steps: int) -> list[dict]:
    """Each launch of one step in order, with its median GPU time over the ``steps`` profiled
    steps (empty if the steps did not launch the same number of kernels)."""
    try:
        kernels = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                         key=lambda e: e.time_range.start)
    except (AttributeError, RuntimeError) as exc:   # the profiler's event API differs by version
        print("no launch sequence:", exc, flush=True)
        return []
    per_step = len(kernels) // steps
    if per_step == 0 or per_step * steps != len(kernels):
        return []
    return [{"kernel": kernels[i].name[:60],
             "us": statistics.median(kernels[s * per_step + i].time_range.elapsed_us() for s in range(steps))}
            for i in range(per_step)]


PRECISIONS = {"bf16": ("bf16", None, None), "planes": ("int4-head planes", "int4", "planes"),
              "rows": ("int4-head rows", "int4", "rows")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--model", choices=sorted(MODELS), default="1b", help="the model's shape")
    parser.add_argument("--precisions", default="bf16,planes,rows", help=f"comma-separated, of {sorted(PRECISIONS)}")
    parser.add_argument("--profile", action="store_true", help="also each kernel's GPU time per step")
    args = parser.parse_args()
    batch, config = args.batch, MODELS[args.model]
    directory = tempfile.mkdtemp(prefix="opforge-ablation-")
    write_random_checkpoint(config, directory, "cuda")
    result = {"device": torch.cuda.get_device_name(), "model": args.model, "context": CONTEXT, "batch": batch,
              "rows": []}
    kinds = ["full", "norms", "swiglu", "rotary_append", "attention", "linear", "head", "qkv_o", "non_gemv"]
    for precision, quantize, layout in (PRECISIONS[name] for name in args.precisions.split(",")):
        model = load(directory, device="cuda", dtype=torch.bfloat16, quantize=quantize, quantize_head=bool(quantize),
                     max_seq_len=1024, max_batch=batch, int4_layout=layout)
        ids = torch.randint(0, model.config.vocab_size, (batch, CONTEXT))
        model.prefill(ids, torch.tensor([CONTEXT] * batch))
        row = {"precision": precision}
        for kind in kinds:
            row[kind] = step_us(model, kind, batch, config=config)
        full = row["full"]
        row["saved_us"] = {k: round(full - row[k], 1) for k in kinds[1:]}
        print(precision, {k: round(row[k], 1) for k in kinds}, "saved", row["saved_us"], flush=True)
        if args.profile:
            row["kernels"], row["launches"] = kernel_table(model, batch)
            for r in row["kernels"][:25]:
                print(f"  {r['us_per_step']:8.1f} us  x{r['calls_per_step']:5.1f}  {r['kernel']}", flush=True)
            for r in row["launches"][:40]:   # the embedding, the first layers
                print(f"  {r['us']:8.2f} us  {r['kernel']}", flush=True)
        result["rows"].append(row)
        del model
        torch.cuda.empty_cache()
    name = "decode_step_ablation" + ("" if args.model == "1b" else f"_{args.model}") + ("" if batch == 1 else f"_b{batch}")
    write_json(result, name + ".json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
