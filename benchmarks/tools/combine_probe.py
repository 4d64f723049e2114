"""The K-split combine kernel: every split's partial loaded at once (the product's form) against a
loop over the splits (the form it replaced, kept here for the comparison), inside whole int4
``linear`` calls at batched-decode rows.

1. Check: at the nine 1B/8B projection shapes (planes layout, bf16 x) and M = 1, 2, 8, 16, 32, 64,
   both forms' outputs are bitwise equal and within bf16's tolerance of the float64 oracle.
2. Time, where the call launches the combine kernel: a CUDA graph of L calls over L weights (>= 160
   MB, L2-cold), time per call, the two forms interleaved (three rounds each, medians).
3. ``--cli ARGS``: run ``opforge ARGS`` (e.g. ``bench --suite model ...``) with the looped form in
   place, for the same suite at HEAD beside it.

    PYTHONPATH=src python3 benchmarks/tools/combine_probe.py                  # H100: about a minute
    PYTHONPATH=src python3 benchmarks/tools/combine_probe.py --cpu-smoke      # the logic, interpreter
    PYTHONPATH=src python3 benchmarks/tools/combine_probe.py --cli bench --suite model ...
"""
from __future__ import annotations

import contextlib
import os
import statistics
import sys
from typing import Any, Iterator

if "--cpu-smoke" in sys.argv:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch
import triton
import triton.language as tl

import opforge
from opforge.ops.quant import kernel_parts, planes, triton_kernels
from opforge.runtime.triton import pdl
from opforge.runtime.triton.launch import TritonLauncher
from opforge.testing import TOLERANCE, rel_error

sys.path.insert(0, os.path.dirname(__file__))
from int4_candidate import SHAPES_1B, SHAPES_8B, copies_for, graph_us, oracle, probe_parser, write_json  # noqa: E402

ROWS = (1, 2, 8, 16, 32, 64)


@triton.jit
def _looped_combine_kernel(ws_ptr, b_ptr, out_ptr, MN, N, SPLIT: tl.constexpr, HAS_BIAS: tl.constexpr,
                           BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    """The replaced form: one split's partial per loop step."""
    pdl.wait_for_previous(PDL)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < MN
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in range(SPLIT):
        acc += tl.load(ws_ptr + s * MN + offs, mask=mask, other=0.0)
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs % N, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + offs, acc.to(out_ptr.dtype.element_ty), mask=mask)


_looped = TritonLauncher(_looped_combine_kernel)
COMBINES = {"n": 0}


def _looped_launch(ws, bias, out, split: int, has_bias: bool, dependent: bool) -> None:
    mn = out.numel()
    COMBINES["n"] += 1
    _looped((triton.cdiv(mn, 1024),), (ws, bias, out, mn, out.shape[-1], split, has_bias, 1024, dependent),
            num_warps=4)


def _counted_launch(ws, bias, out, split: int, has_bias: bool, dependent: bool) -> None:
    COMBINES["n"] += 1
    kernel_parts.launch_combine(ws, bias, out, split, has_bias, dependent)


@contextlib.contextmanager
def combine_form(looped: bool) -> Iterator[None]:
    """The int4 launch paths call the looped form (``looped``) or the product's, counted."""
    saved = planes.launch_combine, triton_kernels.launch_combine
    form = _looped_launch if looped else _counted_launch
    planes.launch_combine = triton_kernels.launch_combine = form
    try:
        yield
    finally:
        planes.launch_combine, triton_kernels.launch_combine = saved


def shape_rows(n: int, k: int, label: str, rows: tuple, device: str, smoke: bool, out: list, errors: list) -> None:
    g = torch.Generator(device=device).manual_seed(n + k)
    w = torch.randn((n, k), generator=g, device=device) * 0.02
    weights = [opforge.repack(opforge.quantize_weight(w + 1e-3 * i, 4, 128), "planes")
               for i in range(copies_for(n * k // 2, smoke))]
    for m in rows:
        x = torch.randn((m, k), generator=g, device=device).to(torch.bfloat16)
        COMBINES["n"] = 0
        with combine_form(looped=False):
            new = opforge.linear(x, weights[0])
        if COMBINES["n"] == 0:
            continue
        with combine_form(looped=True):
            old = opforge.linear(x, weights[0])
        err = rel_error(new, oracle(x, weights[0]))
        row: dict[str, Any] = {"shape": label, "m": m, "rel_err": err, "bitwise_equal": bool(torch.equal(new, old))}
        if not row["bitwise_equal"] or err >= TOLERANCE[torch.bfloat16]:
            errors.append(row)
        if not smoke:
            times: dict[str, list] = {"new": [], "looped": []}
            for _ in range(3):
                for name, looped in (("new", False), ("looped", True)):
                    with combine_form(looped):
                        times[name].append(graph_us([lambda wq=wq: opforge.linear(x, wq) for wq in weights]))
            row.update({name: statistics.median(v) for name, v in times.items()})
        out.append(row)
        print(row, flush=True)


def main() -> int:
    args = probe_parser("the looped combine").parse_args()
    if args.cli:
        from opforge.cli import main as cli_main
        with combine_form(looped=True):
            return cli_main(args.cli)
    smoke = args.cpu_smoke or not torch.cuda.is_available()
    device = "cpu" if smoke else "cuda"
    shapes = [(96, 2048, "smoke")] if smoke else SHAPES_1B + SHAPES_8B
    rows: list = []
    errors: list = []
    with opforge.backend("triton") if smoke else contextlib.nullcontext():   # the CPU runs the torch path by default
        for n, k, label in shapes:
            shape_rows(n, k, label, (1, 16) if smoke else ROWS, device, smoke, rows, errors)
    write_json({"device": "cpu smoke" if smoke else torch.cuda.get_device_name(), "rows": rows, "errors": errors},
               "combine_probe.json", args.out)
    print("errors:", errors or "none")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
