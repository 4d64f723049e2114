"""Tiles and split counts of the paged decode kernel at the engine's decode shapes (block 16,
blocks shuffled across the pool, every sequence ``ctx`` long), against the contiguous kernel on
the same values. Each form is checked against float64 first, then timed in CUDA graphs over
enough copies of the pools that they do not sit in L2.

Forms: (BLOCK_N, warps, stages, slices per sequence), BLOCK_N 32-128, 2-8 warps, 2-4 stages, the
slices of ``--splits``; BLOCK_R stays the default's (the group's query rows).

    PYTHONPATH=src python benchmarks/tools/paged_decode_sweep.py    # JSON in $OUT/paged_decode_sweep.json
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
from int4_candidate import graph_us, write_json  # noqa: E402

import opforge  # noqa: E402
from opforge.ops.paged import bench, config, reference  # noqa: E402
from opforge.ops.paged import triton_kernels as tk  # noqa: E402
from opforge.ops.paged.problem import prepare_attention  # noqa: E402
from opforge.testing import rel_error  # noqa: E402

#: (B, Hq, Hkv, ctx, D, block): the 1B and 8B models' decode at batch 1 / 8 / 32, context 512;
#: 32 sequences of 4096; then (``--long``) one or eight long sequences, as the ``paged`` suite's
SHAPES = ((32, 32, 8, 512, 64, 16), (8, 32, 8, 512, 64, 16), (1, 32, 8, 512, 64, 16),
          (32, 32, 8, 512, 128, 16), (32, 32, 8, 4096, 64, 16))
LONG_SHAPES = ((1, 32, 8, 4096, 64, 16), (1, 32, 8, 8192, 128, 16), (1, 32, 8, 32768, 128, 16),
               (8, 32, 8, 8192, 128, 16))
L2_COLD_BYTES = 160 * 2**20     # pools timed per shape: over three L2s' worth


def forms(splits: tuple) -> list[tuple[int, int, int, int]]:
    return [(bn, w, s, sp) for bn in (32, 64, 128) for w in (2, 4, 8) for s in (2, 3, 4) for sp in splits
            if not (bn == 128 and w == 2)]


def with_tiles(block_n: int, warps: int, stages: int):
    """A stand-in for ``config.decode_tiles`` returning the default BLOCK_R and slices with these
    tiles (the form's slice count is passed to ``launch_decode``)."""
    default = config.decode_tiles

    def tiles(*args, **kwargs):
        br, _, _, _, splits = default(*args, **kwargs)
        return br, block_n, warps, stages, splits
    return tiles


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--defaults-only", action="store_true", help="time the contiguous kernel and the default only")
    parser.add_argument("--programs-per-sm", default="",
                        help="also the default rule at these split targets, comma-separated "
                             "(config.DECODE_16BIT_PROGRAMS_PER_SM)")
    parser.add_argument("--long", action="store_true", help="the long-context shapes (LONG_SHAPES) instead")
    parser.add_argument("--batches", default="", help="only the shapes of these batch sizes (comma-separated)")
    parser.add_argument("--splits", default="1,2", help="slice counts of the forms (comma-separated)")
    parser.add_argument("--name", default="", help="the JSON file's name")
    parser.add_argument("--budget", type=float, default=150.0, help="seconds before the remaining shapes are skipped")
    args = parser.parse_args()
    deadline = time.time() + args.budget
    dev = torch.device(os.environ.get("SWEEP_DEVICE", "cuda"))
    result = {"device": torch.cuda.get_device_name(), "rows": [], "errors": [], "skipped": []}
    default_tiles = config.decode_tiles
    batches = {int(b) for b in args.batches.split(",") if b}
    shapes = [s for s in (LONG_SHAPES if args.long else SHAPES) if not batches or s[0] in batches]
    chosen = forms(tuple(int(x) for x in args.splits.split(",")))
    for shape in shapes:
        if time.time() > deadline:
            result["skipped"].append(shape)
            continue
        b, hq, hkv, ctx, d, bs = shape
        nbytes = bench._decode_bytes(shape, torch.bfloat16)
        copies = max(2, -(-L2_COLD_BYTES // nbytes))
        g = torch.Generator(device=dev).manual_seed(sum(shape))
        sets = [bench._decode_inputs(shape, torch.bfloat16, dev, g) for _ in range(copies)]
        q, kp, vp, tables, lens, cu, kc, vc = sets[0]
        want = reference.paged_attention(q.double(), kp.double(), vp.double(), tables, lens, cu, d ** -0.5)
        calls = [prepare_attention(s[0], s[1], s[2], s[3], s[4], s[5], 1, None) for s in sets]
        row = {"shape": shape, "bytes": nbytes, "us": {}, "rel_err": {}}
        contiguous = [lambda s=s: opforge.decode_attention(s[0].unsqueeze(2), s[6], s[7], s[4]) for s in sets]
        row["us"]["contiguous"] = graph_us(contiguous)
        row["us"]["default"] = graph_us([lambda c=c: opforge.paged_attention(*(c.q, c.k_pages, c.v_pages,
                                         c.block_tables, c.cache_seqlens, c.cu_seqlens), max_query_len=1)
                                         for c in calls])
        for pps in (int(x) for x in args.programs_per_sm.split(",") if x):
            saved, config.DECODE_16BIT_PROGRAMS_PER_SM = config.DECODE_16BIT_PROGRAMS_PER_SM, pps
            config.decode_tiles.cache_clear()   # its answers depend on the constant
            try:
                splits = config.decode_tiles(d, 2, hq // hkv, b, hkv, calls[0].problem.capacity, tk._sms(q))
                name = f"rule pps{pps} (n{splits[1]} w{splits[2]} s{splits[3]} x{splits[4]})"
                out = tk.launch_decode(calls[0])
                row["rel_err"][name] = rel_error(out, want)
                row["us"][name] = graph_us([lambda c=c: tk.launch_decode(c) for c in calls])
            finally:
                config.DECODE_16BIT_PROGRAMS_PER_SM = saved
                config.decode_tiles.cache_clear()
        for bn, w, st, sp in ([] if args.defaults_only else chosen):
            name = f"n{bn} w{w} s{st} x{sp}"
            config.decode_tiles = with_tiles(bn, w, st)
            try:
                out = tk.launch_decode(calls[0], sp)
                err = rel_error(out, want)
                row["rel_err"][name] = err
                if err > 1e-2:
                    result["errors"].append(f"{shape} {name}: rel err {err:.3g}")
                    continue
                row["us"][name] = graph_us([lambda c=c: tk.launch_decode(c, sp) for c in calls])
            except Exception as exc:   # a form that fails to compile is a result
                result["errors"].append(f"{shape} {name}: {type(exc).__name__}: {str(exc)[:200]}")
            finally:
                config.decode_tiles = default_tiles
        best = sorted(row["us"].items(), key=lambda kv: kv[1])
        row["gbs"] = {k: nbytes / us / 1e3 for k, us in row["us"].items() if us}
        print(shape, "  ".join(f"{k} {us:.1f}" for k, us in best[:8]),
              f"| default {row['us']['default']:.1f} contiguous {row['us']['contiguous']:.1f}",
              f"({row['gbs'].get('contiguous', 0):.0f} GB/s)", flush=True)
        result["rows"].append(row)
        del sets, calls
        torch.cuda.empty_cache()
    print("errors:", result["errors"] or "none", "| skipped:", result["skipped"] or "none")
    write_json(result, args.name or ("paged_decode_defaults.json" if args.defaults_only else "paged_decode_sweep.json"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
