"""Generation: prefill, then one decode step per token (replayed from a CUDA graph on CUDA)."""
from __future__ import annotations

import functools
import time
import weakref
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence, Union

import torch


@dataclass
class GenerationStats:
    """Timings of the last ``generate`` call of a model (``model.last_stats``, ``last_stats(model)``)."""

    prompt_tokens: int = 0
    new_tokens: int = 0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    graphs: bool = False
    capture_s: float = 0.0

    @property
    def prefill_tokens_per_s(self) -> float:
        return self.prompt_tokens / self.prefill_s if self.prefill_s else 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        """Generated tokens (all sequences) per second of decode steps, capture excluded."""
        return self.new_tokens / self.decode_s if self.decode_s else 0.0


_GRAPHS: "weakref.WeakKeyDictionary[Any, dict[tuple, _GraphStep]]" = weakref.WeakKeyDictionary()
_STATS: "weakref.WeakKeyDictionary[Any, GenerationStats]" = weakref.WeakKeyDictionary()


def last_stats(model: Any) -> Optional[GenerationStats]:
    """The timings of ``model``'s last ``generate`` call (None before the first)."""
    return _STATS.get(model)


def graph_step(model: Any, batch: int, greedy: bool) -> "_GraphStep":
    """The captured decode step of ``model`` for ``batch`` sequences (captured on first use, kept
    as long as the model lives)."""
    graphs = _GRAPHS.setdefault(model, {})
    if (batch, greedy) not in graphs:
        graphs[(batch, greedy)] = _GraphStep(model, batch, greedy=greedy)
    return graphs[(batch, greedy)]


def release_graphs(model: Any) -> None:
    """Drop ``model``'s captured decode steps (and the memory they hold)."""
    _GRAPHS.pop(model, None)


class _GraphStep:
    """One captured decode step for batch size B: static token input, logits output. ``greedy``
    also captures what follows the step in greedy decoding (argmax, the lengths' increment, the
    new tokens fed back as the next input), so a token costs one replay and no other launch."""

    def __init__(self, model: Any, batch: int, greedy: bool = False):
        self.tokens = torch.zeros(batch, dtype=torch.long, device=model.device)
        self.seqlens = model.cache_seqlens[:batch]
        self.greedy = greedy
        stream = torch.cuda.Stream(model.device)
        stream.wait_stream(torch.cuda.current_stream(model.device))
        with torch.cuda.stream(stream):           # warm up (compiles kernels, sets up cuBLAS) off the capture
            for _ in range(2):
                argmax_rows(model.decode_step(self.tokens, self.seqlens, float_logits=not greedy))
        torch.cuda.current_stream(model.device).wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            # greedy: logits stay in the model's dtype (argmax needs no float copy)
            self.logits = model.decode_step(self.tokens, self.seqlens, float_logits=not greedy)
            if greedy:
                self.next = argmax_rows(self.logits)
                self.seqlens.add_(1)
                self.tokens.copy_(self.next)

    def __call__(self, tokens: torch.Tensor) -> torch.Tensor:
        self.tokens.copy_(tokens)
        self.graph.replay()
        return self.logits

    def advance(self) -> torch.Tensor:
        """Greedy graphs: one step from the tokens already in place; returns the new tokens (a
        static tensor the next replay overwrites) with the lengths advanced."""
        self.graph.replay()
        return self.next


@functools.lru_cache(maxsize=None)
def _argmax_chunk(v: int) -> Optional[int]:
    """The largest divisor of ``v`` in 256..2048 (a chunk of ``argmax_rows``' first stage), or None."""
    for chunk in range(2048, 255, -1):
        if v % chunk == 0 and v // chunk >= 8:
            return chunk
    return None


def argmax_rows(logits: torch.Tensor) -> torch.Tensor:
    """``logits.argmax(-1)`` for (B, V) logits, the same index (the first maximum), in two stages
    for wide rows: the maxima of chunks of the row, then the first chunk holding the largest.
    Why: one row of 128256 logits is a single-output reduction, and torch's ``argmax`` ran it in
    27.5 us on an H100 (session 7, ``benchmarks/gpu_generate_profile.py``), 2% of a 1B decode step.

    Example:
        >>> import torch
        >>> x = torch.randn(2, 5120)
        >>> torch.equal(argmax_rows(x), x.argmax(-1))
        True
    """
    b, v = logits.shape
    chunk = _argmax_chunk(v)
    if chunk is None:
        return logits.argmax(-1)
    best, where = logits.view(b, v // chunk, chunk).max(-1)        # first maximum of each chunk
    first = best.argmax(-1, keepdim=True)                          # first chunk holding the row's maximum
    return (first * chunk + where.gather(-1, first))[:, 0]


def _as_batch(input_ids: Any) -> list[list[int]]:
    if isinstance(input_ids, torch.Tensor):
        ids = input_ids.tolist()
        return [ids] if input_ids.dim() == 1 else ids
    if input_ids and isinstance(input_ids[0], int):
        return [list(input_ids)]
    return [list(seq) for seq in input_ids]


def sample(logits: torch.Tensor, temperature: float, top_k: Optional[int], top_p: Optional[float],
           generator: Optional[torch.Generator]) -> torch.Tensor:
    """Next tokens (B,) from logits (B, V): greedy at temperature 0, else top-k/top-p sampling.

    Example:
        >>> import torch
        >>> from opforge.models.generate import sample
        >>> sample(torch.tensor([[0.0, 3.0, 1.0]]), 0.0, None, None, None).tolist()
        [1]
    """
    if temperature <= 0:
        return argmax_rows(logits)
    logits = logits.float() / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        before = sorted_logits.softmax(-1).cumsum(-1) - sorted_logits.softmax(-1)   # mass ahead of each token
        sorted_logits = sorted_logits.masked_fill(before >= top_p, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
    return torch.multinomial(logits.softmax(-1), 1, generator=generator)[:, 0]


def generate(model: Any, input_ids: Union[torch.Tensor, Sequence[int], Sequence[Sequence[int]]],
             max_new_tokens: int, *, temperature: float = 0.0, top_k: Optional[int] = None,
             top_p: Optional[float] = None, stop_ids: Sequence[int] = (),
             stream: Optional[Callable[[int, int], None]] = None, generator: Optional[torch.Generator] = None,
             graphs: bool = True, readback: int = 1) -> list[list[int]]:
    """Generate up to ``max_new_tokens`` per prompt; returns the new tokens of each prompt.

    Args:
        model: an ``opforge.models.Decoder``; it uses the model's static KV cache.
        input_ids: one prompt (list of ints or 1-D tensor), a batch of prompts of any lengths
            (list of lists, right-padded internally), or a (B, S) tensor.
        temperature: 0 is greedy; otherwise softmax sampling with ``top_k``/``top_p`` filtering.
        stop_ids: a sequence ends after producing one of these (it is included in its output).
        stream: called ``stream(b, token)`` for each token as soon as it is produced.
        generator: a ``torch.Generator`` on the model's device, for reproducible sampling.
        graphs: on CUDA, capture the decode step once per batch size and replay it.
        readback: decode steps launched between the host's reads of the new tokens. 1 (the
            default): each step's tokens are read while the next step runs. ``n > 1``: the new
            tokens stay on the device and are read once per ``n`` steps; on MPS each step is
            committed as its own command buffer, so the GPU runs queued steps while the host
            encodes the next ones (unmeasured: this project has no Apple GPU). ``stream`` then
            gets tokens in bursts of ``n``, and up to ``n - 1`` steps run past the last stop.

    Example:
        >>> from opforge.models.testing import tiny_decoder
        >>> model = tiny_decoder()
        >>> out = model.generate([[1, 2, 3], [4, 5]], 4)
        >>> [len(o) for o in out]
        [4, 4]
    """
    if isinstance(readback, bool) or not isinstance(readback, int) or readback < 1:
        raise ValueError(f"readback must be an int >= 1, got {readback!r}")
    prompts = _as_batch(input_ids)
    b = len(prompts)
    if b == 0 or min(len(p) for p in prompts) == 0:
        raise ValueError("input_ids: every prompt needs at least one token")
    longest = max(len(p) for p in prompts)
    if longest + max_new_tokens > model.max_seq_len:
        raise ValueError(f"prompt ({longest}) + max_new_tokens ({max_new_tokens}) exceeds max_seq_len "
                         f"({model.max_seq_len})")
    ids = torch.zeros(b, longest, dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, :len(p)] = torch.tensor(p)
    lengths = torch.tensor([len(p) for p in prompts], dtype=torch.int32)
    use_graphs = graphs and model.device.type == "cuda"
    stats = GenerationStats(prompt_tokens=int(lengths.sum()), graphs=use_graphs)
    _STATS[model] = stats
    stops = set(int(s) for s in stop_ids)
    out: list[list[int]] = [[] for _ in range(b)]
    done = [False] * b

    def sync() -> None:   # the stats time GPU work: wait for it (CUDA and MPS run asynchronously)
        if model.device.type == "cuda":
            torch.cuda.synchronize(model.device)
        elif model.device.type == "mps":
            torch.mps.synchronize()

    def emit(tokens: torch.Tensor) -> None:
        for i, t in enumerate(tokens.tolist()):
            if not done[i]:
                out[i].append(t)
                if stream is not None:
                    stream(i, t)
                done[i] = t in stops or len(out[i]) >= max_new_tokens

    with torch.no_grad():
        sync()
        t0 = time.perf_counter()
        logits = model.prefill(ids, lengths)
        tokens = sample(logits, temperature, top_k, top_p, generator)
        emit(tokens)
        stats.prefill_s = time.perf_counter() - t0
        seqlens = model.cache_seqlens[:b]
        step: Callable[[torch.Tensor], torch.Tensor] = lambda t: model.decode_step(t, seqlens)   # noqa: E731
        greedy_graph: Optional[_GraphStep] = None
        greedy = temperature <= 0
        if use_graphs and not all(done):
            t1 = time.perf_counter()
            step = graph_step(model, b, greedy)
            if step.greedy:
                greedy_graph = step
                greedy_graph.tokens.copy_(tokens)
            sync()
            stats.capture_s = time.perf_counter() - t1

        def advance(tokens: torch.Tensor) -> torch.Tensor:
            """Launch one decode step; its new tokens, on the device."""
            if greedy_graph is not None:
                return greedy_graph.advance()
            logits = step(tokens)
            seqlens.add_(1)
            return sample(logits, temperature, top_k, top_p, generator)

        t2 = time.perf_counter()
        if readback > 1:
            _decode_in_chunks(model.device, advance, tokens, emit, done, max_new_tokens, readback)
        else:
            on_gpu = model.device.type == "cuda"
            buffers = [torch.empty(b, dtype=torch.long, pin_memory=on_gpu) for _ in range(2)]
            queue: deque = deque()          # launched steps whose tokens the host has not read yet
            steps = 1                       # tokens produced per sequence so far (the prefill's)
            while True:
                # Step k+1 is launched before the host reads step k's tokens, so the GPU does not wait
                # on the host's stop/stream bookkeeping. A step launched after a sequence stopped is
                # ignored by emit; it stays inside the cache (prompt + max_new_tokens <= max_seq_len).
                if steps < max_new_tokens and not all(done):
                    tokens = advance(tokens)
                    buffer = buffers[steps % 2]
                    buffer.copy_(tokens, non_blocking=on_gpu)
                    copied = torch.cuda.Event() if on_gpu else None
                    if copied is not None:
                        copied.record()
                    queue.append((buffer, copied))
                    steps += 1
                    if len(queue) < 2:
                        continue
                if not queue:
                    break
                buffer, copied = queue.popleft()
                if copied is not None:
                    copied.synchronize()
                emit(buffer)
        sync()
        stats.decode_s = time.perf_counter() - t2
        stats.new_tokens = sum(len(o) for o in out) - b
    return out


def _commit(device: torch.device) -> Any:
    """Send the work queued so far to the GPU without waiting for it; returns what must stay alive
    until that work is done. On MPS, recording an event commits the stream's command buffer (the
    event is kept until the chunk's read, so the pool does not hand it out while it is pending);
    CUDA launches run as they are queued; the CPU has no queue."""
    if device.type == "mps":
        event = torch.mps.event.Event()
        event.record()
        return event
    return None


def _decode_in_chunks(device: torch.device, advance: Callable[[torch.Tensor], torch.Tensor], tokens: torch.Tensor,
                      emit: Callable[[torch.Tensor], None], done: list[bool], max_new_tokens: int,
                      readback: int) -> None:
    """``generate``'s decode loop with ``readback`` > 1: up to ``readback`` steps are launched
    (each committed on its own), their tokens gathered on the device, then read with one copy.
    Chunks stop at ``max_new_tokens``; tokens of steps after a sequence stopped are ignored by
    ``emit``, and those steps stay inside the cache (prompt + max_new_tokens <= max_seq_len)."""
    history = torch.empty(len(done), readback, dtype=torch.long, device=device)
    produced = 1                                      # the prefill's token
    while produced < max_new_tokens and not all(done):
        n = min(readback, max_new_tokens - produced)
        pending = []
        for i in range(n):
            tokens = advance(tokens)
            history[:, i].copy_(tokens)
            pending.append(_commit(device))
        produced += n
        chunk = history[:, :n].cpu()                  # the one wait per chunk
        pending.clear()
        for i in range(n):
            emit(chunk[:, i])
