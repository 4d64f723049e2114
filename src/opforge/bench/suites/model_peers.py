"""The model suite's peers (``opforge bench --suite model``; see ``opforge.bench.suites.model``):
transformers eager with the dynamic and the static cache, its static cache under
``torch.compile(mode="reduce-overhead")``, transformers + ``opforge.patch`` and transformers +
Liger-Kernel, each only when importable; a peer that raises is recorded with its error.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable, Optional, Union

import torch

from .model_grid import Grid, _decode, _first_line, _prefill, _Run, median_seconds

PEERS = ("eager", "compile", "patch", "liger")
"""Peer groups: transformers eager (dynamic and static cache), its static cache compiled, with
``opforge.patch``, with Liger-Kernel's Llama patch."""


COMPILE_NEED_S = 45.0
"""Seconds a compiled-peer point is assumed to need (compilation included): it starts only when
this much budget is left."""


COMPILE_BACKEND_OFF_CUDA: Optional[str] = None
"""Off CUDA the compiled peer is skipped, unless this names a torch.compile backend (tests: "eager")."""


#: ``new_tokens - 1`` decode steps must add this share of a generate call's time to be told from noise.
MEASURABLE_SHARE = 0.05


def _measurable(t_one: float, t_all: float) -> bool:
    return t_all - t_one >= MEASURABLE_SHARE * t_all


def transformers_generate_seconds(hf: Any, ids: torch.Tensor, new_tokens: int, device: torch.device,
                                  warmup_tokens: int = 2, **generate_kwargs: Any) -> tuple[float, float]:
    """Wall seconds of greedy ``generate`` for 1 and for ``new_tokens`` new tokens (in that order)
    after one warm-up call with ``warmup_tokens`` (none when 0: one at the same batch size ran).
    Their difference is ``new_tokens - 1`` decode steps, the prefill cancelled out. One timed call
    each (a large model's generate is long); where that difference drowns in noise (a small model,
    a busy host), medians of five calls each.

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
        if not _measurable(t_one, t_all):
            t_one = median_seconds(lambda: gen(1), device, 5)
            t_all = median_seconds(lambda: gen(new_tokens), device, 5)
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
            if not _measurable(t_one, t_all):       # the decode steps drown in the prefill's noise
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
