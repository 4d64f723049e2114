"""``opforge bench --suite model``: a whole decoder, end to end (not an op table).

For each model shape (``1b``: Llama-3.2-1B; ``8b``: Llama-3-8B, opt-in; ``tiny``: for CPU smoke
runs) random bf16 weights are written as safetensors to a temporary directory and loaded through
``opforge.models.load`` (so through ``opforge.load_safetensors``), in bf16, int8 and int4. Measured:

- decode tokens/s at batch 1 and 8 with a 512-token context (generated tokens of all sequences
  per second of decode steps, CUDA graphs on), and as % of the weight-bandwidth limit:
  ``copy bandwidth / bytes of weights a step reads`` (bandwidth measured in the same run as a
  device-to-device copy, read + write bytes, as everywhere in opforge's reports);
- prefill tokens/s at 1x2048;
- peak GPU memory per precision;
- peers, when ``transformers`` is importable: its eager model in bf16 with the dynamic and the
  static cache (decode at the same batch sizes and context, prefill 1x2048).

Run: ``opforge bench --suite model [--shapes 1b,8b] [--device cuda] [--json model.json]``.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from typing import Any, Callable, Optional

import torch

SHAPES = ("tiny", "1b", "8b")
PRECISIONS = ("bf16", "int8", "int4")


def _config(shape: str) -> dict[str, Any]:
    from opforge.models.testing import LLAMA_1B, LLAMA_8B, TINY_LLAMA
    if shape == "tiny":
        return dict(TINY_LLAMA, vocab_size=256, max_position_embeddings=4096)
    return {"1b": LLAMA_1B, "8b": LLAMA_8B}[shape]


def sync(device: torch.device) -> None:
    """Wait for ``device``'s queued work (a no-op off CUDA).

    Example:
        >>> sync(torch.device("cpu"))
    """
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_seconds(fn: Callable[[], Any], device: torch.device, repeats: int = 3) -> float:
    """Median wall seconds of ``fn()`` over ``repeats`` synchronized calls, after one warm-up call.

    Example:
        >>> median_seconds(lambda: sum(range(10)), torch.device("cpu")) >= 0
        True
    """
    fn()
    times = []
    for _ in range(repeats):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def transformers_decode_tokens_per_s(hf: Any, ids: torch.Tensor, new_tokens: int, device: torch.device,
                                     warmup_tokens: int = 2, **generate_kwargs: Any) -> float:
    """Greedy decode tokens/s (all sequences) of a transformers model: ``new_tokens`` generated
    minus one generated, over ``new_tokens - 1`` steps, so the prefill cancels out.

    Example:
        >>> class Echo:                                   # stands in for a transformers model
        ...     def generate(self, ids, **kwargs):
        ...         return ids
        >>> transformers_decode_tokens_per_s(Echo(), torch.zeros(1, 4, dtype=torch.long), 8, torch.device("cpu")) > 0
        True
    """
    mask = torch.ones_like(ids)          # else generate takes token 0 (pad) in the prompt for padding

    def gen(k: int) -> Any:
        return hf.generate(ids, attention_mask=mask, max_new_tokens=k, do_sample=False, pad_token_id=0,
                           **generate_kwargs)
    with torch.no_grad():
        gen(warmup_tokens)
        t_one = median_seconds(lambda: gen(1), device, 1)
        t_all = median_seconds(lambda: gen(new_tokens), device, 1)
    return ids.shape[0] * (new_tokens - 1) / max(t_all - t_one, 1e-9)


def _sizes(shape: str) -> tuple[int, int, int, tuple[int, ...]]:
    """(context, new tokens, prefill length, decode batches)."""
    return (24, 8, 64, (1, 2)) if shape == "tiny" else (512, 64, 2048, (1, 8))


def _ours(path: str, precision: str, device: torch.device, shape: str, bandwidth: float,
          record: Callable[..., None]) -> None:
    from opforge.models import load
    context, new, prefill_len, batches = _sizes(shape)
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    dtype = torch.bfloat16
    model = load(path, device=device, dtype=dtype, quantize=None if precision == "bf16" else precision,
                 max_seq_len=max(prefill_len, context + new) + 8, max_batch=max(batches),
                 group_size=32 if shape == "tiny" else 128)
    weight_bytes = model.weight_bytes()
    head = model.lm_head.numel() * model.lm_head.element_size()
    limit = bandwidth * 1e9 / weight_bytes
    g = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    for b in batches:
        prompts = torch.randint(0, vocab, (b, context), generator=g)
        model.generate(prompts, 4)                          # compile, capture this batch size
        runs = []
        for _ in range(3):
            model.generate(prompts, new)
            runs.append(model.last_stats.decode_tokens_per_s)
        tps = sorted(runs)[1]
        record("opforge", precision, f"decode b{b} ctx{context}", tps,
               pct_of_limit=100 * (tps / b) / limit, weight_bytes=weight_bytes, dense_lm_head_bytes=head)
    ids = torch.randint(0, vocab, (1, prefill_len), generator=g)
    lengths = torch.tensor([prefill_len])
    s = median_seconds(lambda: model.prefill(ids, lengths), device)
    record("opforge", precision, f"prefill 1x{prefill_len}", prefill_len / s)
    if device.type == "cuda":
        record("opforge", precision, "peak memory", None,
               peak_memory_gib=torch.cuda.max_memory_allocated(device) / 2**30)
    del model


def _transformers(path: str, device: torch.device, shape: str, bandwidth: float, weight_bytes: int,
                  record: Callable[..., None]) -> None:
    import transformers
    context, new, prefill_len, batches = _sizes(shape)
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).to(device).eval()
    hf.generation_config.eos_token_id = None
    hf.generation_config.disable_compile = True    # eager: generate would compile a static-cache forward on CUDA
    limit = bandwidth * 1e9 / weight_bytes
    g = torch.Generator().manual_seed(0)
    vocab = hf.config.vocab_size
    n = min(new, 32)
    for cache in ("dynamic", "static"):
        kw = {"cache_implementation": "static"} if cache == "static" else {}
        for b in batches:
            ids = torch.randint(0, vocab, (b, context), generator=g).to(device)
            try:
                tps = transformers_decode_tokens_per_s(hf, ids, n, device, **kw)
                record(f"transformers ({cache} cache)", "bf16", f"decode b{b} ctx{context}", tps,
                       pct_of_limit=100 * (tps / b) / limit)
            except Exception as exc:             # report a failing peer as a failure, keep going
                record(f"transformers ({cache} cache)", "bf16", f"decode b{b} ctx{context}", None,
                       error=f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}")
    x = torch.randint(0, vocab, (1, prefill_len), generator=g).to(device)
    with torch.no_grad():
        s = median_seconds(lambda: hf(x, use_cache=False), device)
    record("transformers (eager)", "bf16", f"prefill 1x{prefill_len}", prefill_len / s)
    del hf


def run_model_suite(shapes: Optional[list[str]] = None, device: Optional[str] = None,
                    precisions: Optional[list[str]] = None, peers: bool = True,
                    json_path: Optional[str] = None, out: Any = None) -> dict[str, Any]:
    """Run the model benchmark; prints a table, returns (and optionally writes) the results.

    Args:
        shapes: from ``SHAPES``; default ``["1b"]`` on CUDA, ``["tiny"]`` elsewhere.
        device: default CUDA when available, else CPU.
        precisions: subset of ``PRECISIONS`` (default all).
        peers: time transformers too, when importable.

    Example:
        >>> import io
        >>> from opforge.bench.suites.model import run_model_suite
        >>> r = run_model_suite(["tiny"], "cpu", ["bf16"], peers=False, out=io.StringIO())
        >>> [row["what"] for row in r["rows"]][:2]
        ['decode b1 ctx24', 'decode b2 ctx24']
    """
    import sys

    from opforge.runtime.device import measure_copy_bandwidth
    from opforge.models.testing import write_random_checkpoint
    out = out or sys.stdout
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    shapes = shapes or (["1b"] if dev.type == "cuda" else ["tiny"])
    unknown = [s for s in shapes if s not in SHAPES] + [p for p in precisions or [] if p not in PRECISIONS]
    if unknown:
        raise ValueError(f"model suite: unknown shape/precision {', '.join(unknown)}; shapes {', '.join(SHAPES)}, "
                         f"precisions {', '.join(PRECISIONS)}")
    precisions = precisions or list(PRECISIONS)
    bandwidth = measure_copy_bandwidth(dev, nbytes=(1 << 30) if dev.type == "cuda" else (1 << 22), repeats=10)
    result: dict[str, Any] = {"device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
                              "copy_bandwidth_gbs": bandwidth, "rows": []}

    for shape in shapes:
        def record(impl: str, precision: str, what: str, tokens_per_s: Optional[float], **extra: Any) -> None:
            row = {"shape": shape, "impl": impl, "precision": precision, "what": what,
                   "tokens_per_s": tokens_per_s, **extra}
            result["rows"].append(row)
            value = "-" if tokens_per_s is None else f"{tokens_per_s:10.1f} tok/s"
            notes = ", ".join(f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}" for k, v in extra.items()
                              if k not in ("weight_bytes", "dense_lm_head_bytes"))
            print(f"{shape:<5} {impl:<26} {precision:<5} {what:<18} {value:>16}  {notes}", file=out, flush=True)

        directory = tempfile.mkdtemp(prefix=f"opforge-bench-{shape}-")
        try:
            t0 = time.perf_counter()
            write_random_checkpoint(_config(shape), directory, dev if dev.type == "cuda" else "cpu")
            print(f"{shape}: random checkpoint written in {time.perf_counter() - t0:.1f} s; copy bandwidth "
                  f"{bandwidth:.0f} GB/s", file=out, flush=True)
            bf16_bytes = None
            for precision in precisions:
                try:
                    _ours(directory, precision, dev, shape, bandwidth, record)
                except Exception as exc:
                    record("opforge", precision, "load/run", None, error=f"{type(exc).__name__}: {exc}"[:300])
                if precision == "bf16":
                    rows = [r for r in result["rows"] if r.get("weight_bytes") and r["shape"] == shape]
                    bf16_bytes = rows[0]["weight_bytes"] if rows else None
            if peers and dev.type == "cuda":
                try:
                    import transformers  # noqa: F401
                except ImportError:
                    print("transformers not importable: peers skipped", file=out)
                else:
                    try:
                        _transformers(directory, dev, shape, bandwidth, bf16_bytes or 1, record)
                    except Exception as exc:
                        record("transformers", "bf16", "load/run", None, error=f"{type(exc).__name__}: {exc}"[:300])
        finally:
            shutil.rmtree(directory, ignore_errors=True)
    if json_path:
        with open(json_path, "w") as f:
            json.dump(result, f, indent=1, default=str)
        print(f"wrote {json_path}", file=out)
    return result


def main(args: Any) -> int:
    """Entry from ``opforge bench --suite model`` (``args`` from the bench parser: --shapes,
    --dtypes as precisions, --impls opforge to skip the peers, --device, --json)."""
    import sys

    from opforge.bench.cli import _split as split
    peers = not args.impls or "transformers" in split(args.impls)
    try:
        result = run_model_suite(split(args.shapes) or None, args.device, split(args.dtypes) or None,
                                 peers=peers, json_path=args.json)
    except ValueError as exc:
        print(f"opforge bench: error: {exc}", file=sys.stderr)
        return 2
    return 1 if any(r.get("error") and r["impl"] == "opforge" for r in result["rows"]) else 0
