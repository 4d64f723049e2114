"""``opforge bench --suite model``: a whole decoder, end to end (not an op table).

For each model shape (``1b``: Llama-3.2-1B; ``8b``: Llama-3-8B, opt-in; ``tiny``: for CPU smoke
runs) random bf16 weights are written as safetensors to a temporary directory and loaded through
``opforge.models.load`` (so through ``opforge.load_safetensors``), in bf16, int8 and int4, once per
precision (the KV cache sized for the largest point). Measured:

- decode tokens/s at batch 1, 8 and 32 with a 512- and a 4096-token context (generated tokens of
  all sequences per second of decode steps, CUDA graphs on; 64 new tokens at 512, 32 at 4096),
  and as % of the weight-bandwidth limit: ``copy bandwidth / bytes of weights a step reads``
  (bandwidth measured in the same run as a device-to-device copy, read + write bytes, as
  everywhere in opforge's reports); ``pct_of_limit_with_kv`` also counts the KV cache a step reads;
- prefill tokens/s at 1x2048 and 8x512;
- peak GPU memory per precision;
- peers in the same run, each only when importable (else reported as "not installed"), bf16:
  transformers eager with the dynamic and the static cache, transformers' static cache with its
  decode step under ``torch.compile(mode="reduce-overhead")`` (CUDA only; context 512), transformers
  + ``opforge.patch`` and transformers + Liger-Kernel's Llama patch. A peer that raises is
  reported with the first line of its exception; the run goes on.

A time budget (``--budget SECONDS``, alias of ``--max-seconds``) skips the points that would start
after it; they are listed under ``skipped`` in the JSON and at the end of the printed table. The
1b grid with five precisions took 140 s on an H100 with every peer, the 8b grid 185 s for opforge
alone and 372 s for bf16 with the peers (at fed7445, ``benchmarks/results/h100/2026-11-23-fed7445``). Our KV cache holds 32 x 4136 tokens in every point; the
split-KV decode sizes its slices by the tokens in the cache, not by that capacity.

``smollm2`` (opt-in) is the trained SmolLM2-135M-Instruct from its GGUF file instead of random
weights, with transformers on the same file as its peer: see ``opforge.bench.suites.model_gguf``.

Run: ``opforge bench --suite model [--shapes 1b,8b,smollm2] [--device cuda] [--budget 240] [--json model.json]``.
"""
from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from typing import Any, Iterable, Optional, Union

import torch

from opforge.bench.fmt import split_list

from .model_grid import Budget, Grid, _config, _decode, _first_line, _prefill, _row_line, _Run, grid, \
    median_seconds, sync
from .model_gguf import run_smollm2
from .model_peers import PEERS, _peer_points, _peer_set, _peers, _skip_all, transformers_decode_tokens_per_s, \
    transformers_generate_seconds

__all__ = ["Budget", "Grid", "PEERS", "PRECISIONS", "SHAPES", "grid", "median_seconds", "print_summary",
           "run_model_suite", "sync", "transformers_decode_tokens_per_s", "transformers_generate_seconds"]

SHAPES = ("tiny", "1b", "8b", "smollm2")


#: "int8"/"int4" quantize the decoder's linear layers and keep the output head dense (the default
#: of ``opforge.models.load``); "int8-head"/"int4-head" quantize the head too (``quantize_head``).
#: int4 weights take the device's layout (``opforge.preferred_layout``); "int4-rows" and
#: "int4-rows-head" keep the rows layout, the layout's peer on CUDA.
PRECISIONS = ("bf16", "int8", "int4", "int8-head", "int4-head", "int4-rows", "int4-rows-head")
#: What runs without ``--dtypes``.
DEFAULT_PRECISIONS = ("bf16", "int8", "int4")


def _our_points(g: Grid, device: torch.device) -> list[str]:
    return [_decode(b, c) for b, c in g.decode_points()] + [_prefill(b, s) for b, s in g.prefills] + \
        (["peak memory"] if device.type == "cuda" else [])


def _ours(path: str, precision: str, device: torch.device, g: Grid, shape: str, bandwidth: float,
          run: _Run) -> None:
    from opforge.models import load
    from opforge.serve import generate, last_stats
    points = _our_points(g, device)
    if not run.start("opforge", precision, points[0]):
        for what in points[1:]:
            run.skip("opforge", precision, what)
        return
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    bits, _, layout = precision.removesuffix("-head").partition("-")
    model = load(path, device=device, dtype=torch.bfloat16, quantize=None if bits == "bf16" else bits,
                 quantize_head=precision.endswith("-head"), max_seq_len=g.max_seq_len, max_batch=g.max_batch,
                 group_size=32 if shape == "tiny" else 128, int4_layout=layout or None)
    weight_bytes = model.weight_bytes()
    head = model.lm_head.numel() * model.lm_head.element_size() if isinstance(model.lm_head, torch.Tensor) else 0
    kv_token = model.kv_bytes_per_token()
    limit = bandwidth * 1e9 / weight_bytes
    gen = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    captured: set[tuple[int, int]] = set()
    for b, c in g.decode_points():
        what = _decode(b, c)
        if not run.start("opforge", precision, what):
            continue
        new = g.new_tokens(c)
        try:
            prompts = torch.randint(0, vocab, (b, c), generator=gen)
            if (b, c) not in captured:              # warm up: compile this batch size's kernels and size
                                                    # the engine generate keeps (the timed calls reuse it)
                generate(model, prompts, new)
                captured.add((b, c))
            runs = []
            for _ in range(3):
                generate(model, prompts, new)
                runs.append(last_stats(model).decode_tokens_per_s)
            tps = sorted(runs)[1]
            kv = b * (c + new // 2) * kv_token      # mean cache a step reads
            run.record("opforge", precision, what, tps, pct_of_limit=100 * (tps / b) / limit,
                       pct_of_limit_with_kv=100 * (tps / b) * (weight_bytes + kv) / (bandwidth * 1e9),
                       weight_bytes=weight_bytes, dense_lm_head_bytes=head, kv_bytes_per_step=kv,
                       batch=b, context=c, new_tokens=new)
        except Exception as exc:                    # e.g. out of memory at 32x4096: report, go on
            run.record("opforge", precision, what, None, error=_first_line(exc))
    for b, s in g.prefills:
        what = _prefill(b, s)
        if not run.start("opforge", precision, what):
            continue
        try:
            ids = torch.randint(0, vocab, (b, s), generator=gen)
            lengths = torch.full((b,), s)
            secs = median_seconds(lambda: model.prefill(ids, lengths), device)
            run.record("opforge", precision, what, b * s / secs, batch=b, context=s)
        except Exception as exc:
            run.record("opforge", precision, what, None, error=_first_line(exc))
    if device.type == "cuda":
        run.record("opforge", precision, "peak memory", None,
                   peak_memory_gib=torch.cuda.max_memory_allocated(device) / 2**30,
                   kv_cache_gib=kv_token * g.max_batch * g.max_seq_len / 2**30,
                   max_batch=g.max_batch, max_seq_len=g.max_seq_len)
    del model


def print_summary(result: dict[str, Any], out: Any = None) -> None:
    """The run's table: every row, then the skipped points (``result`` from ``run_model_suite``).

    Example:
        >>> import io
        >>> buf = io.StringIO()
        >>> print_summary({"rows": [], "skipped": [{"shape": "1b", "impl": "opforge", "precision": "int4",
        ...                "what": "decode b32 ctx4096", "reason": "budget"}], "peers": {}}, buf)
        >>> "skipped: 1 point" in buf.getvalue()
        True
    """
    out = out or sys.stdout
    print("\n==== model suite ====", file=out)
    for row in result["rows"]:
        print(_row_line(row), file=out)
    for name, status in result.get("peers", {}).items():
        if status != "ok":
            print(f"peer {name}: {status}", file=out)
    skipped = result.get("skipped", [])
    if skipped:
        print(f"skipped: {len(skipped)} point{'s' if len(skipped) != 1 else ''}", file=out)
        for s in skipped:
            print(f"  {s['shape']:<5} {s['impl']:<42} {s['precision']:<5} {s['what']:<18} {s['reason']}", file=out)
    if "elapsed_s" in result:
        print(f"wall {result['elapsed_s']:.0f} s" + (f" (budget {result['budget_s']:g} s)"
                                                      if result.get("budget_s") is not None else ""), file=out)
    out.flush()


def run_model_suite(shapes: Optional[list[str]] = None, device: Optional[str] = None,
                    precisions: Optional[list[str]] = None, peers: Union[bool, Iterable[str]] = True,
                    json_path: Optional[str] = None, out: Any = None,
                    budget: Optional[float] = None) -> dict[str, Any]:
    """Run the model benchmark; prints a table, returns (and optionally writes) the results.

    Args:
        shapes: from ``SHAPES``; default ``["1b"]`` on CUDA, ``["tiny"]`` elsewhere.
        device: default CUDA when available, else CPU.
        precisions: subset of ``PRECISIONS`` (default ``DEFAULT_PRECISIONS``).
        peers: True for all of ``PEERS``, False for none, or some of their names; each runs only
            when importable (else "not installed" in ``result["peers"]``).
        budget: seconds; points that would start later are skipped and listed in ``result["skipped"]``.

    Example:
        >>> import io
        >>> from opforge.bench.suites.model import run_model_suite
        >>> r = run_model_suite(["tiny"], "cpu", ["bf16"], peers=False, out=io.StringIO())
        >>> [row["what"] for row in r["rows"]][:3]
        ['decode b1 ctx24', 'decode b1 ctx48', 'decode b2 ctx24']
        >>> r = run_model_suite(["tiny"], "cpu", ["bf16"], peers=False, out=io.StringIO(), budget=0)
        >>> len(r["rows"]), len(r["skipped"])
        (0, 6)
    """
    from opforge.models.testing import write_random_checkpoint
    from opforge.runtime.device import measure_copy_bandwidth
    out = out or sys.stdout
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    shapes = shapes or (["1b"] if dev.type == "cuda" else ["tiny"])
    unknown = [s for s in shapes if s not in SHAPES] + [p for p in precisions or [] if p not in PRECISIONS]
    if unknown:
        raise ValueError(f"model suite: unknown shape/precision {', '.join(unknown)}; shapes {', '.join(SHAPES)}, "
                         f"precisions {', '.join(PRECISIONS)}")
    if budget is not None and budget < 0:
        raise ValueError(f"model suite: budget must be >= 0 seconds, got {budget}")
    wanted = _peer_set(peers)
    precisions = precisions or list(DEFAULT_PRECISIONS)
    bandwidth = measure_copy_bandwidth(dev, nbytes=(1 << 30) if dev.type == "cuda" else (1 << 22), repeats=10)
    result: dict[str, Any] = {"device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
                              "copy_bandwidth_gbs": bandwidth, "rows": [], "skipped": [], "peers": {},
                              "budget_s": budget, "grid": {s: grid(s).to_json() for s in shapes if s != "smollm2"}}
    run = _Run(result, Budget(budget), out)

    for shape in shapes:
        run.shape = shape
        if shape == "smollm2":                      # the trained model from its GGUF file
            run_smollm2(dev, precisions, bool(wanted), run)
            continue
        g = grid(shape)
        if not run.budget.allows():                 # nothing more starts: list this shape's points, write nothing
            for precision in precisions:
                for what in _our_points(g, dev):
                    run.skip("opforge", precision, what)
            for peer in sorted(wanted):
                _skip_all(_peer_points(peer, g, dev), run, "budget")
            continue
        directory = tempfile.mkdtemp(prefix=f"opforge-bench-{shape}-")
        try:
            t0 = time.perf_counter()
            write_random_checkpoint(_config(shape), directory, dev if dev.type == "cuda" else "cpu")
            run.print(f"{shape}: random checkpoint written in {time.perf_counter() - t0:.1f} s; copy bandwidth "
                      f"{bandwidth:.0f} GB/s")
            bf16_bytes = None
            for precision in precisions:
                try:
                    _ours(directory, precision, dev, g, shape, bandwidth, run)
                except Exception as exc:
                    run.record("opforge", precision, "load/run", None, error=f"{type(exc).__name__}: {exc}"[:300])
                if precision == "bf16":
                    rows = [r for r in result["rows"] if r.get("weight_bytes") and r["shape"] == shape]
                    bf16_bytes = rows[0]["weight_bytes"] if rows else None
            if wanted:
                _peers(directory, dev, g, bandwidth, bf16_bytes or 1, wanted, run)
        finally:
            shutil.rmtree(directory, ignore_errors=True)
    result["elapsed_s"] = run.budget.elapsed()
    print_summary(result, out)
    if json_path:
        with open(json_path, "w") as f:
            json.dump(result, f, indent=1, default=str)
        print(f"wrote {json_path}", file=out)
    return result


def main(args: Any) -> int:
    """Entry from ``opforge bench --suite model`` (``args`` from the bench parser: --shapes,
    --dtypes as precisions, --impls to choose the peers (``opforge`` alone: none; ``transformers``:
    all; or some of eager, compile, patch, liger), --device, --json, --budget/--max-seconds)."""
    impls = split_list(args.impls)
    if not impls:
        peers: Union[bool, set[str]] = True
    elif "transformers" in impls:
        peers = True
    else:
        peers = {i for i in impls if i != "opforge"}
    try:
        result = run_model_suite(split_list(args.shapes) or None, args.device, split_list(args.dtypes) or None,
                                 peers=peers, json_path=args.json, budget=getattr(args, "max_seconds", None))
    except ValueError as exc:
        print(f"opforge bench: error: {exc}", file=sys.stderr)
        return 2
    return 1 if any(r.get("error") and r["impl"] == "opforge" for r in result["rows"]) else 0
