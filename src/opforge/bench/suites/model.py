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
1b grid is meant to take about 3 minutes on an H100 (an estimate, not yet measured: most of it the
compile peer's two compilations, which run last, and the 32x4096 prefills). Our KV cache holds
32 x 4136 tokens in every point (the split-KV decode sizes its splits by that capacity, not by
the context), where the previous grid's held 8 x 2056.

Run: ``opforge bench --suite model [--shapes 1b,8b] [--device cuda] [--budget 240] [--json model.json]``.
"""
from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional, Union

import torch

SHAPES = ("tiny", "1b", "8b")
PRECISIONS = ("bf16", "int8", "int4")
PEERS = ("eager", "compile", "patch", "liger")
"""Peer groups: transformers eager (dynamic and static cache), its static cache compiled, with
``opforge.patch``, with Liger-Kernel's Llama patch."""

COMPILE_NEED_S = 45.0
"""Seconds a compiled-peer point is assumed to need (compilation included): it starts only when
this much budget is left."""


COMPILE_BACKEND_OFF_CUDA: Optional[str] = None
"""Off CUDA the compiled peer is skipped, unless this names a torch.compile backend (tests: "eager")."""


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


def transformers_generate_seconds(hf: Any, ids: torch.Tensor, new_tokens: int, device: torch.device,
                                  warmup_tokens: int = 2, **generate_kwargs: Any) -> tuple[float, float]:
    """Wall seconds of greedy ``generate`` for 1 and for ``new_tokens`` new tokens (in that order)
    after one warm-up call with ``warmup_tokens`` (none when 0: one at the same batch size ran).
    Their difference is ``new_tokens - 1`` decode steps, the prefill cancelled out.

    Example:
        >>> class Echo:                                   # stands in for a transformers model
        ...     def generate(self, ids, **kwargs):
        ...         return ids
        >>> one, all_ = transformers_generate_seconds(Echo(), torch.zeros(1, 4, dtype=torch.long), 8,
        ...                                           torch.device("cpu"))
        >>> one >= 0 and all_ >= 0
        True
    """
    mask = torch.ones_like(ids)          # else generate takes token 0 (pad) in the prompt for padding

    def gen(k: int) -> Any:
        return hf.generate(ids, attention_mask=mask, max_new_tokens=k, do_sample=False, pad_token_id=0,
                           **generate_kwargs)
    with torch.no_grad():
        if warmup_tokens > 0:
            gen(warmup_tokens)
        t_one = median_seconds(lambda: gen(1), device, 1)
        t_all = median_seconds(lambda: gen(new_tokens), device, 1)
    return t_one, t_all


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
    t_one, t_all = transformers_generate_seconds(hf, ids, new_tokens, device, warmup_tokens, **generate_kwargs)
    return ids.shape[0] * (new_tokens - 1) / max(t_all - t_one, 1e-9)


@dataclass(frozen=True)
class Grid:
    """The points measured for one model shape.

    Example:
        >>> g = grid("1b")
        >>> g.batches, g.contexts, g.prefills, g.new_tokens(4096)
        ((1, 8, 32), (512, 4096), ((1, 2048), (8, 512)), 32)
    """

    batches: tuple[int, ...]
    contexts: tuple[int, ...]
    prefills: tuple[tuple[int, int], ...]          # (batch, prompt length)
    short_new: int                                 # new tokens per decode point at the shortest context
    long_new: int                                  # ... at longer contexts (the prefill dominates there)
    peer_new_cap: int = 32                         # transformers eager: ~30 ms a step on an H100 host
    compile_contexts: tuple[int, ...] = ()         # contexts of the compiled peer (a compile per shape)
    compile_batches: tuple[int, ...] = ()

    def new_tokens(self, context: int) -> int:
        return self.short_new if context == min(self.contexts) else self.long_new

    def peer_new_tokens(self, context: int) -> int:
        return min(self.new_tokens(context), self.peer_new_cap if context == min(self.contexts)
                   else self.peer_new_cap // 2)

    def decode_points(self) -> list[tuple[int, int]]:
        """(batch, context), batch-major: the CUDA graph of a batch size is captured once."""
        return [(b, c) for b in self.batches for c in self.contexts]

    @property
    def max_seq_len(self) -> int:
        return max([max(self.contexts) + self.long_new, min(self.contexts) + self.short_new]
                   + [s for _, s in self.prefills]) + 8

    @property
    def max_batch(self) -> int:
        return max(list(self.batches) + [b for b, _ in self.prefills])

    def to_json(self) -> dict[str, Any]:
        return {"batches": list(self.batches), "contexts": list(self.contexts),
                "prefills": [f"{b}x{s}" for b, s in self.prefills],
                "new_tokens": {str(c): self.new_tokens(c) for c in self.contexts},
                "peer_new_tokens": {str(c): self.peer_new_tokens(c) for c in self.contexts},
                "compile_points": [f"b{b} ctx{c}" for b in self.compile_batches for c in self.compile_contexts]}


def grid(shape: str) -> Grid:
    """The grid of ``shape``: the issue's for ``1b``/``8b``; a small one for ``tiny`` (CPU tests)."""
    if shape == "tiny":
        return Grid(batches=(1, 2), contexts=(24, 48), prefills=((1, 64), (2, 32)), short_new=8, long_new=6,
                    peer_new_cap=8, compile_contexts=(24,), compile_batches=(1,))
    return Grid(batches=(1, 8, 32), contexts=(512, 4096), prefills=((1, 2048), (8, 512)), short_new=64,
                long_new=32, compile_contexts=(512,), compile_batches=(1, 8))


def _decode(b: int, c: int) -> str:
    return f"decode b{b} ctx{c}"


def _prefill(b: int, s: int) -> str:
    return f"prefill {b}x{s}"


class Budget:
    """Wall seconds since the suite started, against an optional limit.

    Example:
        >>> Budget(None).allows(1e9), Budget(0).allows()
        (True, False)
    """

    def __init__(self, seconds: Optional[float]):
        self.seconds = seconds
        self.start = time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def allows(self, need_s: float = 0.0) -> bool:
        return self.seconds is None or self.elapsed() + need_s < self.seconds


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0][:200] if text else ''}".rstrip(": ")


@dataclass
class _Run:
    """The results being collected, the printing and the budget (one per ``run_model_suite``)."""

    result: dict[str, Any]
    budget: Budget
    out: Any
    shape: str = ""
    printed: list[str] = field(default_factory=list)

    def record(self, impl: str, precision: str, what: str, tokens_per_s: Optional[float], **extra: Any) -> None:
        row = {"shape": self.shape, "impl": impl, "precision": precision, "what": what,
               "tokens_per_s": tokens_per_s, **extra}
        self.result["rows"].append(row)
        self.print(_row_line(row))

    def skip(self, impl: str, precision: str, what: str, reason: str = "budget") -> None:
        self.result["skipped"].append({"shape": self.shape, "impl": impl, "precision": precision, "what": what,
                                       "reason": reason})
        self.print(f"{self.shape:<5} {impl:<42} {precision:<5} {what:<18} {'skipped':>16}  {reason}")

    def start(self, impl: str, precision: str, what: str, need_s: float = 0.0) -> bool:
        """True if the point may start now; else it is listed as skipped."""
        if self.budget.allows(need_s):
            return True
        reason = f"budget ({self.budget.seconds:g} s; {self.budget.elapsed():.0f} s elapsed" + \
            (f", needs ~{need_s:.0f} s)" if need_s else ")")
        self.skip(impl, precision, what, reason)
        return False

    def peer(self, name: str, status: str) -> None:
        self.result["peers"][f"{self.shape} {name}"] = status
        if status != "ok":
            self.print(f"{self.shape:<5} {name:<42} {'':<5} {'':<18} {'-':>16}  {status}")

    def print(self, line: str) -> None:
        print(line, file=self.out, flush=True)


def _row_line(row: dict[str, Any]) -> str:
    tps = row.get("tokens_per_s")
    value = "-" if tps is None else f"{tps:10.1f} tok/s"
    notes = ", ".join(f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()
                      if k not in ("shape", "impl", "precision", "what", "tokens_per_s", "weight_bytes",
                                   "dense_lm_head_bytes", "kv_bytes_per_step", "batch", "context"))
    return f"{row['shape']:<5} {row['impl']:<42} {row['precision']:<5} {row['what']:<18} {value:>16}  {notes}"


# ---- opforge ---------------------------------------------------------------------------------------

def _our_points(g: Grid, device: torch.device) -> list[str]:
    return [_decode(b, c) for b, c in g.decode_points()] + [_prefill(b, s) for b, s in g.prefills] + \
        (["peak memory"] if device.type == "cuda" else [])


def _kv_bytes_per_token(model: Any) -> int:
    """Bytes of K and V of one token over all layers (what a decode step reads per cached token)."""
    k = model.k_cache[0]
    return 2 * len(model.k_cache) * k.shape[1] * k.shape[3] * k.element_size()


def _ours(path: str, precision: str, device: torch.device, g: Grid, shape: str, bandwidth: float,
          run: _Run) -> None:
    from opforge.models import load
    points = _our_points(g, device)
    if not run.start("opforge", precision, points[0]):
        for what in points[1:]:
            run.skip("opforge", precision, what)
        return
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    model = load(path, device=device, dtype=torch.bfloat16, quantize=None if precision == "bf16" else precision,
                 max_seq_len=g.max_seq_len, max_batch=g.max_batch, group_size=32 if shape == "tiny" else 128)
    weight_bytes = model.weight_bytes()
    head = model.lm_head.numel() * model.lm_head.element_size()
    kv_token = _kv_bytes_per_token(model)
    limit = bandwidth * 1e9 / weight_bytes
    gen = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    captured: set[int] = set()
    for b, c in g.decode_points():
        what = _decode(b, c)
        if not run.start("opforge", precision, what):
            continue
        new = g.new_tokens(c)
        try:
            prompts = torch.randint(0, vocab, (b, c), generator=gen)
            if b not in captured:                   # compile, capture this batch size's graph
                model.generate(prompts, 4)
                captured.add(b)
            runs = []
            for _ in range(3):
                model.generate(prompts, new)
                runs.append(model.last_stats.decode_tokens_per_s)
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


# ---- peers -----------------------------------------------------------------------------------------

def _peer_points(peer: str, g: Grid, device: torch.device) -> list[tuple[str, str]]:
    """(impl, what) of each point of a peer group."""
    decode = [_decode(b, c) for b, c in g.decode_points()]
    prefill = [_prefill(b, s) for b, s in g.prefills]
    if peer == "compile":
        return [("transformers (static cache + compile)", _decode(b, c))
                for b in g.compile_batches for c in g.compile_contexts]
    label = {"eager": "transformers", "patch": "transformers+opforge.patch", "liger": "transformers+liger"}[peer]
    points = [(f"{label} ({cache} cache)", w) for cache in ("dynamic", "static") for w in decode]
    points += [("transformers (eager)" if peer == "eager" else label, w) for w in prefill]
    if device.type == "cuda":
        points.append(("transformers (eager)" if peer == "eager" else label, "peak memory"))
    return points


def _load_hf(path: str, device: torch.device) -> Any:
    import transformers
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).to(device).eval()
    hf.generation_config.eos_token_id = None
    hf.generation_config.disable_compile = True    # eager: generate would compile a static-cache forward on CUDA
    return hf


def _forget_static_cache(hf: Any) -> None:
    """Drop the static-cache length transformers keeps from earlier calls, so that a short-context
    point does not attend over (and allocate) the longest context measured before it."""
    for attr in ("_previous_max_cache_length", "_cache"):      # transformers 5.x, 4.x
        if attr in vars(hf):
            delattr(hf, attr)


def _compiled_graphs() -> int:
    """Graphs torch.compile has produced in this process (to tell a compiled run from a silent eager one)."""
    try:
        from torch._dynamo.utils import counters
        return int(counters["stats"]["unique_graphs"])
    except Exception:
        return -1


def _measure_hf(hf: Any, points: list[tuple[str, str]], g: Grid, device: torch.device, limit: float,
                run: _Run, need_s: float = 0.0, **generate_kwargs: Any) -> None:
    """Time ``points`` of one transformers model; each failure is recorded and the rest goes on."""
    gen = torch.Generator().manual_seed(0)
    vocab = hf.config.vocab_size
    warmed: set[tuple[str, int]] = set()
    compiled_seen = False         # the first compiled point checks that torch.compile produced a graph
    for impl, what in points:
        if not run.start(impl, "bf16", what, need_s):
            continue
        try:
            if what == "peak memory":
                run.record(impl, "bf16", what, None, peak_memory_gib=torch.cuda.max_memory_allocated(device) / 2**30)
                continue
            if what.startswith("prefill"):
                b, n = (int(x) for x in what.split()[-1].split("x"))
                x = torch.randint(0, vocab, (b, n), generator=gen).to(device)
                with torch.no_grad():
                    secs = median_seconds(lambda: hf(x, use_cache=False), device)
                run.record(impl, "bf16", what, b * n / secs, batch=b, context=n)
                continue
            b, c = int(what.split()[1][1:]), int(what.split()[2][3:])
            new = g.peer_new_tokens(c)
            kw = dict(generate_kwargs)
            if "static" in impl:
                kw.setdefault("cache_implementation", "static")
                if "compile" not in impl:
                    _forget_static_cache(hf)
            graphs_before = _compiled_graphs()
            ids = torch.randint(0, vocab, (b, c), generator=gen).to(device)
            # the first point of a cache type and batch size warms up (the compiled peer: with all
            # its tokens, so that the static cache keeps its size and nothing recompiles after)
            warm = 0 if (impl, b) in warmed else (new if "compile" in impl else 2)
            t_one, t_all = transformers_generate_seconds(hf, ids, new, device, warmup_tokens=warm, **kw)
            warmed.add((impl, b))
            if t_all - t_one < 0.05 * t_all:       # the decode steps drown in the prefill's noise
                raise RuntimeError(f"not measurable: generate of {new} tokens took {t_all:.3f} s, of 1 token "
                                   f"{t_one:.3f} s")
            if "compile" in impl and not compiled_seen and 0 <= graphs_before == _compiled_graphs():
                raise RuntimeError("transformers did not compile the decode step (its auto-compile criteria "
                                   "were not met)")
            compiled_seen = compiled_seen or "compile" in impl
            tps = b * (new - 1) / (t_all - t_one)
            run.record(impl, "bf16", what, tps, pct_of_limit=100 * (tps / b) / limit, batch=b, context=c,
                       new_tokens=new)
        except Exception as exc:                    # report a failing peer as a failure, keep going
            run.record(impl, "bf16", what, None, error=_first_line(exc))


def _skip_all(points: list[tuple[str, str]], run: _Run, reason: str) -> None:
    for impl, what in points:
        run.skip(impl, "bf16", what, reason)


def _peer_eager_and_patch(path: str, device: torch.device, g: Grid, limit: float, wanted: set[str],
                          run: _Run) -> None:
    """transformers eager, then ``opforge.patch`` on the same instance (one load for both)."""
    import opforge
    eager, patch = _peer_points("eager", g, device), _peer_points("patch", g, device)
    todo = ([eager] if "eager" in wanted else []) + ([patch] if "patch" in wanted else [])
    if not todo:
        return
    (impl, what), rest = todo[0][0], todo[0][1:] + [p for points in todo[1:] for p in points]
    if not run.start(impl, "bf16", what):
        _skip_all(rest, run, "budget")
        return
    hf = _load_hf(path, device)
    try:
        if "eager" in wanted:
            run.peer("transformers eager", "ok")
            _measure_hf(hf, eager, g, device, limit, run)
        if "patch" in wanted:
            report = opforge.patch(hf)
            run.result.setdefault("patch_report", {})[run.shape] = str(report)
            run.peer("transformers+opforge.patch", "ok")
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            _measure_hf(hf, patch, g, device, limit, run)
    finally:
        del hf


def _peer_compile(path: str, device: torch.device, g: Grid, limit: float, run: _Run) -> None:
    points = _peer_points("compile", g, device)
    cpu_backend = COMPILE_BACKEND_OFF_CUDA
    if device.type != "cuda" and cpu_backend is None:  # transformers compiles generate's step on accelerators only
        run.peer("transformers static cache + compile", "skipped: needs CUDA")
        _skip_all(points, run, "needs CUDA")
        return
    try:
        from transformers import CompileConfig
    except ImportError as exc:
        run.peer("transformers static cache + compile", f"failed: {_first_line(exc)}")
        for impl, what in points:
            run.record(impl, "bf16", what, None, error=_first_line(exc))
        return
    if not run.start(points[0][0], "bf16", points[0][1], COMPILE_NEED_S):
        _skip_all(points[1:], run, "budget")
        return
    hf = _load_hf(path, device)
    try:
        run.peer("transformers static cache + compile", "ok")
        if device.type == "cuda":
            config = CompileConfig(mode="reduce-overhead")
        else:                                       # a CPU test of this code path
            config = CompileConfig(backend=cpu_backend, mode=None)
            config._compile_all_devices = True
        _measure_hf(hf, points, g, device, limit, run, need_s=COMPILE_NEED_S if device.type == "cuda" else 0.0,
                    disable_compile=False, compile_config=config)
    finally:
        del hf
        torch._dynamo.reset()                       # drops the compiled graphs and their CUDA-graph pools


def _liger_patch() -> Optional[Callable[[Any], None]]:
    """Liger-Kernel's Llama patch applied to one model instance, or None when not installed."""
    try:
        import liger_kernel.transformers as liger
    except ImportError:
        return None
    apply = liger.apply_liger_kernel_to_llama

    def patch(model: Any) -> None:
        try:      # inference: no loss kernels (they replace the causal-LM forward)
            apply(rope=True, rms_norm=True, swiglu=True, cross_entropy=False, fused_linear_cross_entropy=False,
                  model=model)
        except TypeError:
            apply(model=model)
    return patch


def _peer_liger(path: str, device: torch.device, g: Grid, limit: float, run: _Run) -> None:
    points = _peer_points("liger", g, device)
    try:
        patch = _liger_patch()
    except Exception as exc:                        # installed, but without the Llama patch
        run.peer("transformers+liger", f"failed: {_first_line(exc)}")
        return
    if patch is None:
        run.peer("transformers+liger", "not installed")
        return
    if not run.start(points[0][0], "bf16", points[0][1]):
        _skip_all(points[1:], run, "budget")
        return
    from transformers.models.llama import modeling_llama
    saved = dict(vars(modeling_llama))              # Liger also patches this module: put it back afterwards
    hf = None
    try:
        hf = _load_hf(path, device)
        patch(hf)
        run.peer("transformers+liger", "ok")
        _measure_hf(hf, points, g, device, limit, run)
    except Exception as exc:
        run.peer("transformers+liger", f"failed: {_first_line(exc)}")
        run.record("transformers+liger", "bf16", "load/patch", None, error=_first_line(exc))
    finally:
        del hf
        for name in [n for n in vars(modeling_llama) if n not in saved]:
            delattr(modeling_llama, name)
        for name, value in saved.items():
            if getattr(modeling_llama, name, None) is not value:
                setattr(modeling_llama, name, value)


def _peers(path: str, device: torch.device, g: Grid, bandwidth: float, weight_bytes: int, wanted: set[str],
           run: _Run) -> None:
    try:
        import transformers  # noqa: F401
    except ImportError:
        for name in sorted(wanted):
            run.peer(f"transformers {name}", "not installed")
        return
    limit = bandwidth * 1e9 / weight_bytes
    steps: list[tuple[str, Callable[[], None]]] = [
        ("eager/patch", lambda: _peer_eager_and_patch(path, device, g, limit, wanted, run)),
        ("liger", lambda: _peer_liger(path, device, g, limit, run) if "liger" in wanted else None),
        # last: the longest (a compilation per point), so a budget cuts it first
        ("compile", lambda: _peer_compile(path, device, g, limit, run) if "compile" in wanted else None),
    ]
    for name, step in steps:
        try:
            step()
        except Exception as exc:
            run.record(f"transformers ({name})", "bf16", "load/run", None, error=_first_line(exc))
        if device.type == "cuda":
            torch.cuda.empty_cache()


# ---- the suite -------------------------------------------------------------------------------------

def _peer_set(peers: Union[bool, Iterable[str]]) -> set[str]:
    if peers is True:
        return set(PEERS)
    if peers is False or peers is None:
        return set()
    wanted = set(peers)
    unknown = wanted - set(PEERS)
    if unknown:
        raise ValueError(f"model suite: unknown peer(s) {', '.join(sorted(unknown))}; known: {', '.join(PEERS)}")
    return wanted


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
        precisions: subset of ``PRECISIONS`` (default all).
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
    precisions = precisions or list(PRECISIONS)
    bandwidth = measure_copy_bandwidth(dev, nbytes=(1 << 30) if dev.type == "cuda" else (1 << 22), repeats=10)
    result: dict[str, Any] = {"device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
                              "copy_bandwidth_gbs": bandwidth, "rows": [], "skipped": [], "peers": {},
                              "budget_s": budget, "grid": {s: grid(s).to_json() for s in shapes}}
    run = _Run(result, Budget(budget), out)

    for shape in shapes:
        run.shape = shape
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
    from opforge.bench.cli import _split as split
    impls = split(args.impls)
    if not impls:
        peers: Union[bool, set[str]] = True
    elif "transformers" in impls:
        peers = True
    else:
        peers = {i for i in impls if i != "opforge"}
    try:
        result = run_model_suite(split(args.shapes) or None, args.device, split(args.dtypes) or None,
                                 peers=peers, json_path=args.json, budget=getattr(args, "max_seconds", None))
    except ValueError as exc:
        print(f"opforge bench: error: {exc}", file=sys.stderr)
        return 2
    return 1 if any(r.get("error") and r["impl"] == "opforge" for r in result["rows"]) else 0
