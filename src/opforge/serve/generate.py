"""``generate``: a batch of prompts run to the end on an ``Engine`` of its own; new token ids out.

A thin client of the serving engine: a call runs on an ``Engine`` sized for its prompts (KV-cache
blocks for every prompt's ``prompt + max_new_tokens``, ``max_num_seqs`` = the batch, a token budget
that prefills every prompt in the first step, no prefix sharing, no tokenizer), queues one request
per prompt and steps the engine in the caller's thread until every request ends. So ``generate``
decodes with the engine's loop, its paged cache, its CUDA graphs and its sampling: there is one
decode loop in the project.

The engine stays with the model (``model.client_state``) and serves the next call if that call
fits it (as many prompts or fewer, as many cache blocks or fewer, the same ``graphs``); so repeated
calls capture their CUDA graphs once. A call that does not fit frees the held engine first, then
makes its own. ``GenerationStats.capture_s`` says how long a call spent capturing graphs (its decode
time excludes it) and ``reused`` whether it ran on the engine of an earlier call.

Example:
    >>> from opforge.models.testing import tiny_decoder
    >>> from opforge.serve import generate, last_stats
    >>> model = tiny_decoder()
    >>> out = generate(model, [[1, 2, 3], [4, 5]], 4)
    >>> [len(o) for o in out], last_stats(model).new_tokens
    ([4, 4], 6)
"""
from __future__ import annotations

import gc
import time
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence, Union

import torch

from .engine import Engine
from .sampling import SamplingParams


@dataclass
class GenerationStats:
    """Timings of the last ``generate`` call on a model (``last_stats(model)``).

    ``prefill_s``: from the call's start until every prompt has its first token; ``decode_s``: the
    rest, CUDA-graph capture (``capture_s``) excluded; ``new_tokens``: the tokens after each
    prompt's first.
    """

    prompt_tokens: int = 0
    new_tokens: int = 0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    graphs: bool = False
    capture_s: float = 0.0
    reused: bool = False

    @property
    def prefill_tokens_per_s(self) -> float:
        return self.prompt_tokens / self.prefill_s if self.prefill_s else 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        """Generated tokens (all sequences) per second of decode steps, capture excluded."""
        return self.new_tokens / self.decode_s if self.decode_s else 0.0


_STATS: "weakref.WeakKeyDictionary[Any, GenerationStats]" = weakref.WeakKeyDictionary()


def last_stats(model: Any) -> Optional[GenerationStats]:
    """The timings of the last ``generate`` call on ``model`` (None before the first).

    Example:
        >>> from opforge.models.testing import tiny_decoder
        >>> last_stats(tiny_decoder()) is None
        True
    """
    return _STATS.get(model)


def _as_batch(input_ids: Any) -> list[list[int]]:
    if isinstance(input_ids, torch.Tensor):
        ids = input_ids.tolist()
        return [ids] if input_ids.dim() == 1 else ids
    if input_ids and isinstance(input_ids[0], int):
        return [list(input_ids)]
    return [list(seq) for seq in input_ids]


def _check_request(prompts: list[list[int]], vocab_size: int, max_new_tokens: int, temperature: float,
                   top_k: Optional[int], top_p: Optional[float]) -> None:
    """Raise ``ValueError`` naming the argument for ids outside the vocabulary or sampling
    settings out of range (a negative id would read the embedding table from its end)."""
    for p in prompts:
        bad = [t for t in p if not 0 <= t < vocab_size]
        if bad:
            raise ValueError(f"input_ids: token id {bad[0]} is outside the vocabulary [0, {vocab_size})")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if not temperature >= 0:
        raise ValueError(f"temperature must be >= 0 (0 is greedy), got {temperature}")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k must be >= 1 or None, got {top_k}")
    if top_p is not None and not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1] or None, got {top_p}")


def _seeds(generator: Optional[torch.Generator], n: int) -> list[Optional[int]]:
    """One sampling seed per prompt, drawn from ``generator`` (None: each request seeds itself)."""
    if generator is None:
        return [None] * n
    return torch.randint(0, 2**62, (n,), generator=generator, device=generator.device).tolist()


def _sync(device: torch.device) -> None:
    """Wait for the device's queued work (the stats time it; CUDA and MPS run asynchronously)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


_BLOCK_SIZE = 16     # KV-cache block of generate's engines


@dataclass
class _HeldEngine:
    """The engine ``generate`` keeps on a model, and whether it was asked for CUDA graphs (on a
    CPU the engine has none either way, so the request is what a later call must match)."""

    engine: Engine
    graphs: bool

    def fits(self, batch: int, blocks: int, prompt_tokens: int, graphs: bool) -> bool:
        """Whether an idle held engine can run a call of these sizes."""
        e = self.engine
        return (batch <= e.max_num_seqs and blocks <= e.cache.usable_blocks
                and prompt_tokens <= e.scheduler.max_num_batched_tokens and graphs == self.graphs
                and not e.has_unfinished())


def _engine_for(model: Any, batch: int, blocks: int, prompt_tokens: int, graphs: bool) -> tuple[Engine, bool]:
    """The model's held engine if this call fits it (and it is idle), else a new one; and whether
    it was reused. The old engine is freed before the new one takes its memory."""
    held = model.client_state
    if isinstance(held, _HeldEngine):
        if held.fits(batch, blocks, prompt_tokens, graphs):
            return held.engine, True
        model.client_state = held = None
        gc.collect()                    # the engine and the model reference each other
        if model.device.type == "cuda":
            torch.cuda.empty_cache()
    # one step prefills every prompt (as a batch), so the decode steps that follow are all timed
    engine = Engine(model, max_num_seqs=batch, block_size=_BLOCK_SIZE, kv_blocks=blocks, enable_prefix_caching=False,
                    max_num_batched_tokens=max(8192, prompt_tokens), cuda_graphs=graphs, tokenizer=None)
    model.client_state = _HeldEngine(engine, graphs)
    return engine, False


def generate(model: Any, input_ids: Union[torch.Tensor, Sequence[int], Sequence[Sequence[int]]],
             max_new_tokens: int, *, temperature: float = 0.0, top_k: Optional[int] = None,
             top_p: Optional[float] = None, stop_ids: Sequence[int] = (),
             stream: Optional[Callable[[int, int], None]] = None, generator: Optional[torch.Generator] = None,
             graphs: bool = True, readback: int = 1) -> list[list[int]]:
    """Generate up to ``max_new_tokens`` per prompt; returns the new tokens of each prompt.

    Args:
        model: an ``opforge.models.Decoder`` (``prompt + max_new_tokens`` <= its ``max_seq_len``).
        input_ids: one prompt (list of ints or 1-D tensor), a batch of prompts of any lengths
            (list of lists), or a (B, S) tensor.
        temperature: 0 is greedy; otherwise softmax sampling with ``top_k``/``top_p`` filtering.
        stop_ids: a sequence ends after producing one of these (it is included in its output);
            the model's end-of-sequence tokens end nothing unless listed here.
        stream: called ``stream(b, token)`` for each token as soon as the host has it.
        generator: a ``torch.Generator`` (on the model's device) that seeds each prompt's
            sampling, for reproducible results.
        graphs: on CUDA, replay decode steps from CUDA graphs (the engine's ``cuda_graphs``).
        readback: kept for existing callers, an int >= 1; every value runs the same: the engine
            launches a greedy decode step's successor before the host reads its tokens.

    Example:
        >>> from opforge.models.testing import tiny_decoder
        >>> out = generate(tiny_decoder(), [[1, 2, 3], [4, 5]], 4)
        >>> [len(o) for o in out]
        [4, 4]
    """
    if isinstance(readback, bool) or not isinstance(readback, int) or readback < 1:
        raise ValueError(f"readback must be an int >= 1, got {readback!r}")
    prompts = _as_batch(input_ids)
    b = len(prompts)
    if b == 0 or min(len(p) for p in prompts) == 0:
        raise ValueError("input_ids: every prompt needs at least one token")
    _check_request(prompts, model.config.vocab_size, max_new_tokens, temperature, top_k, top_p)
    longest = max(len(p) for p in prompts)
    if longest + max_new_tokens > model.max_seq_len:
        raise ValueError(f"prompt ({longest}) + max_new_tokens ({max_new_tokens}) exceeds max_seq_len "
                         f"({model.max_seq_len})")
    stops = tuple(int(s) for s in stop_ids)
    params = [SamplingParams(max_tokens=max_new_tokens, temperature=float(temperature), top_k=top_k, top_p=top_p,
                             seed=seed, stop_token_ids=stops, ignore_eos=True)
              for seed in _seeds(generator if temperature > 0 else None, b)]
    blocks = sum(-(-(len(p) + max_new_tokens) // _BLOCK_SIZE) for p in prompts)
    prompt_tokens = sum(len(p) for p in prompts)
    engine, reused = _engine_for(model, b, blocks, prompt_tokens, graphs)
    stats = GenerationStats(prompt_tokens=prompt_tokens, graphs=graphs and model.device.type == "cuda", reused=reused)
    capture_before = engine.graph_capture_s
    _STATS[model] = stats
    out: list[list[int]] = [[] for _ in range(b)]

    def deliver(i: int, output: Any) -> None:
        for token in output.new_token_ids:
            out[i].append(token)
            if stream is not None:
                stream(i, token)

    with torch.no_grad():
        _sync(model.device)
        t0 = time.perf_counter()
        streams = [engine.add_request(str(i), p, sp) for i, (p, sp) in enumerate(zip(prompts, params))]
        outputs = [iter(s) for s in streams]
        seen: list[Optional[float]] = [None] * b
        t_decode, captured = None, capture_before
        while engine.has_unfinished():
            engine.step()
            for i, s in enumerate(streams):
                if s.last_token_at != seen[i]:            # one step puts at most one output per request
                    seen[i] = s.last_token_at
                    deliver(i, next(outputs[i]))
            if t_decode is None and all(out):
                t_decode = time.perf_counter()
                stats.prefill_s = t_decode - t0
                captured = engine.graph_capture_s
        for i, o in enumerate(outputs):                    # what is left: the requests have ended
            for rest in o:
                deliver(i, rest)
        _sync(model.device)
        end = time.perf_counter()
    if t_decode is None:
        stats.prefill_s = end - t0
    else:
        stats.decode_s = end - t_decode - (engine.graph_capture_s - captured)
    stats.capture_s = engine.graph_capture_s - capture_before
    stats.new_tokens = sum(len(o) for o in out) - b
    return out
