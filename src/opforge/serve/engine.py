"""The serving engine: continuous batching of many requests over one model and a paged KV cache.

Each step the scheduler picks the decode tokens of the running requests and prefill chunks of
new ones (a token budget per step); one ``model.paged_step`` call computes them all; each request
then samples its next token with its own parameters; finished requests give their blocks back.
Decode-only steps replay CUDA graphs on CUDA; steps with prefill run eagerly (as everything does
on CPU and MPS).

The step loop runs in its own thread after ``start()``; ``add_request`` and ``abort`` may be
called from any thread. Without ``start()``, ``step()`` runs one step in the caller's thread
(what the offline ``LLM`` does).

Example:
    >>> from opforge.models.testing import tiny_decoder
    >>> from opforge.serve import Engine, SamplingParams
    >>> engine = Engine(tiny_decoder(), max_num_seqs=4, kv_blocks=16)
    >>> stream = engine.add_request("r1", [1, 2, 3], SamplingParams(max_tokens=3))
    >>> while engine.has_unfinished():
    ...     _ = engine.step()
    >>> [len(o.new_token_ids) for o in stream], engine.stats().blocks_used
    ([1, 1, 1], 0)
"""
from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Optional, Union

import torch

from .graphs import DecodeGraphs
from .mixed_graphs import MixedGraphs
from .kv_cache import SCRATCH_BLOCK, BlockManager
from .sampling import SamplingParams, argmax_rows, make_generator, release_text, sample_rows
from .scheduler import FINISHED, Chunk, Scheduler, Sequence
from .stream import EngineStats, RequestOutput, RequestStream
from .tokenizer import Detokenizer, encode
from .warmup import warm_up_steps

_FROM_MODEL = object()


@dataclass(eq=False)
class _Launched:
    """A queued model call: its chunks, the chunks that sample, and where their tokens appear."""

    chunks: list[Chunk]
    sampled: list[Chunk]
    logits: torch.Tensor
    greedy: Optional[torch.Tensor]          # device tokens when every sampled row decodes greedily
    decode_only: bool
    host: Optional[torch.Tensor] = None     # their copy on the host (pinned on CUDA)
    event: Any = None                       # recorded after that copy (CUDA)


class EngineStoppedError(RuntimeError):
    """The engine's step loop stopped (shut down, or a step raised: the cause is chained)."""


def _positive_int(name: str, value: Any, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


def kv_pool_blocks(model: Any, block_size: int, kv_memory_fraction: float, max_model_len: int,
                   max_num_seqs: int) -> int:
    """Blocks the KV cache gets by default: ``kv_memory_fraction`` of the device memory free now
    (CUDA; MPS: of the recommended working set left); on CPU enough for ``max_num_seqs`` full-length
    sequences, capped at that fraction of the memory available now."""
    per_block = model.kv_bytes_per_token() * block_size
    device = model.device
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        budget = free * kv_memory_fraction
    elif device.type == "mps":
        budget = (torch.mps.recommended_max_memory() - torch.mps.driver_allocated_memory()) * kv_memory_fraction
    else:
        wanted = max_num_seqs * -(-max_model_len // block_size) * per_block
        budget = min(wanted, os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES") * kv_memory_fraction)
    return int(budget // per_block)


class Engine:
    """Serve many requests at once on one loaded ``opforge.models`` model.

    Args:
        model: a model from ``opforge.models.load`` (its ``max_seq_len`` bounds ``max_model_len``).
        max_num_seqs: requests running at once at most.
        max_model_len: prompt + generated tokens at most per request (default: the model's
            ``max_seq_len``).
        block_size: positions per KV-cache block.
        kv_memory_fraction: share of the free device memory the KV cache takes (see
            ``kv_pool_blocks``); ignored with ``kv_blocks``.
        kv_blocks: the KV cache's blocks, explicitly.
        enable_prefix_caching: share the full blocks of equal prompt prefixes across requests.
        max_num_batched_tokens: tokens per step at most (decode tokens + prefill chunks); default
            ``max(8192, max_num_seqs)``: a step with prefill costs the host about the same
            whatever its tokens, so larger chunks keep the device busy (see docs/serving.md).
        max_prefill_tokens_while_decoding: prompt tokens at most in a step that also decodes
            (None: the step's budget); bounds how long a new prompt holds up running sequences'
            next tokens. Off by default: no clear gain measured (docs/server.md).
        cuda_graphs: on CUDA, replay decode-only steps from CUDA graphs (``graphs``), and after
            ``warm_up`` steps with prefill of up to 2048 tokens too (``mixed_graphs``).
        overlap: launch a greedy decode step's successor before reading its tokens (see
            ``step``), so the host's per-token work runs while the device computes. On by
            default: on an H100 (1B, bf16) it took batch-1 decoding from ~480 to ~830 tokens/s.
        tokenizer: a ``tokenizers.Tokenizer`` for string prompts, text and stop strings
            (default: the model's ``tokenizer`` attribute, if any).
    """

    def __init__(self, model: Any, *, max_num_seqs: int = 256, max_model_len: Optional[int] = None,
                 block_size: int = 16, kv_memory_fraction: float = 0.9, kv_blocks: Optional[int] = None,
                 enable_prefix_caching: bool = True, max_num_batched_tokens: Optional[int] = None,
                 max_prefill_tokens_while_decoding: Optional[int] = None,
                 cuda_graphs: bool = True, overlap: bool = True, tokenizer: Any = _FROM_MODEL):
        _positive_int("max_num_seqs", max_num_seqs)
        _positive_int("block_size", block_size)
        max_model_len = model.max_seq_len if max_model_len is None else _positive_int("max_model_len", max_model_len, 2)
        if max_model_len > model.max_seq_len:
            raise ValueError(f"max_model_len ({max_model_len}) exceeds the model's max_seq_len ({model.max_seq_len}): "
                             "load the model with a larger max_seq_len")
        if max_num_batched_tokens is None:
            max_num_batched_tokens = max(8192, max_num_seqs)
        _positive_int("max_num_batched_tokens", max_num_batched_tokens)
        if max_prefill_tokens_while_decoding is not None:
            _positive_int("max_prefill_tokens_while_decoding", max_prefill_tokens_while_decoding)
        if isinstance(kv_memory_fraction, bool) or not isinstance(kv_memory_fraction, (int, float)) \
                or not 0 < kv_memory_fraction <= 1:
            raise ValueError(f"kv_memory_fraction must be in (0, 1], got {kv_memory_fraction!r}")
        if kv_blocks is None:
            kv_blocks = kv_pool_blocks(model, block_size, kv_memory_fraction, max_model_len, max_num_seqs)
            if kv_blocks < 1:
                raise ValueError(f"kv_memory_fraction={kv_memory_fraction} leaves no memory for a KV-cache block")
        _positive_int("kv_blocks", kv_blocks)
        self.model, self.device = model, model.device
        self.max_model_len, self.block_size, self.max_num_seqs = max_model_len, block_size, max_num_seqs
        self.tokenizer = getattr(model, "tokenizer", None) if tokenizer is _FROM_MODEL else tokenizer
        self.eos_token_ids = frozenset(model.config.eos_token_ids)
        self.cache = BlockManager(kv_blocks + 1, block_size, enable_prefix_caching)    # + the scratch block
        self.pages = model.paged_cache(kv_blocks + 1, block_size)
        self.scheduler = Scheduler(self.cache, max_num_seqs, max_num_batched_tokens, max_prefill_tokens_while_decoding)
        self.max_blocks_per_seq = self.cache.blocks_for(max_model_len)
        self._graphs = DecodeGraphs(model, self.pages, max_num_seqs, self.max_blocks_per_seq) \
            if cuda_graphs and self.device.type == "cuda" else None
        self._mixed = MixedGraphs(model, self.pages, max_num_seqs, self.max_blocks_per_seq, max_num_batched_tokens,
                                  self._graphs._pool) if self._graphs is not None else None
        self._requests: dict[str, tuple[Sequence, RequestStream]] = {}
        self._lock = threading.RLock()
        self._wake = threading.Condition(self._lock)
        self._thread: Optional[threading.Thread] = None
        self._stopping = False
        self.error: Optional[BaseException] = None
        self._steps, self._step_time = 0, 0.0
        self.overlap = overlap
        self._inflight: Optional[_Launched] = None
        self.overlapped_steps = 0       # steps launched before their predecessor's tokens were read
        pinned = self.device.type == "cuda"
        self._host_tokens = [torch.zeros(max_num_seqs, dtype=torch.long, pin_memory=pinned) for _ in range(2)]
        self._flip = 0

    # ---- requests ------------------------------------------------------------------------------
    def _prompt_ids(self, prompt: Union[list[int], str]) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("prompt: a string prompt needs a tokenizer, and the model has none "
                                 "(pass token ids)")
            ids = encode(self.tokenizer, prompt)
        elif isinstance(prompt, (list, tuple)) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            ids = list(prompt)
        else:
            raise ValueError(f"prompt must be a string or a list of token ids, got {type(prompt).__name__}")
        if not ids:
            raise ValueError("prompt is empty: it needs at least one token")
        vocab = self.model.config.vocab_size
        bad = next((t for t in ids if not 0 <= t < vocab), None)
        if bad is not None:
            raise ValueError(f"prompt: token id {bad} is outside the vocabulary (0..{vocab - 1})")
        if len(ids) >= self.max_model_len:
            raise ValueError(f"prompt: {len(ids)} tokens, but max_model_len is {self.max_model_len} "
                             "(the prompt must leave room for one new token)")
        return ids

    def add_request(self, request_id: str, prompt: Union[list[int], str], params: SamplingParams) -> RequestStream:
        """Queue a request; returns its stream of ``RequestOutput``. Raises ``ValueError`` naming
        the field for bad input, with nothing changed."""
        if not isinstance(request_id, str) or not request_id:
            raise ValueError(f"request_id must be a non-empty string, got {request_id!r}")
        if not isinstance(params, SamplingParams):
            raise ValueError(f"params must be a SamplingParams, got {type(params).__name__}")
        if params.stop and self.tokenizer is None:
            raise ValueError("params.stop: stop strings need a tokenizer, and the model has none")
        ids = self._prompt_ids(prompt)
        longest = min(len(ids) + params.max_tokens, self.max_model_len)
        if self.cache.blocks_for(longest) > self.cache.usable_blocks:
            raise ValueError(f"prompt + max_tokens: {longest} positions need {self.cache.blocks_for(longest)} "
                             f"KV-cache blocks, the cache has {self.cache.usable_blocks} (kv_blocks)")
        seq = Sequence(request_id, ids, params)    # its generator is made by the step loop (no device work here)
        if self.tokenizer is not None:
            seq.detokenizer = Detokenizer(self.tokenizer, ids)
        stream = RequestStream(request_id, ids)
        with self._lock:
            if self.error is not None or self._stopping:
                raise EngineStoppedError("the engine has stopped") from self.error
            if request_id in self._requests:
                raise ValueError(f"request_id {request_id!r} is already in use")
            self._requests[request_id] = (seq, stream)
            self.scheduler.add(seq)
            self._wake.notify()
        return stream

    def abort(self, request_id: str) -> None:
        """End a request now ("abort") and free its blocks. ``KeyError`` for an unknown id."""
        with self._lock:
            if request_id not in self._requests:
                raise KeyError(f"request_id {request_id!r} is not a waiting or running request")
            seq, stream = self._requests[request_id]
            self._finish(seq, stream, "abort", [], "")

    def has_unfinished(self) -> bool:
        """Whether any request is waiting or running."""
        with self._lock:
            return bool(self._requests)

    def is_unfinished(self, request_id: str) -> bool:
        """Whether ``request_id`` is waiting or running."""
        with self._lock:
            return request_id in self._requests

    @property
    def graph_capture_s(self) -> float:
        """Seconds spent capturing CUDA graphs so far (0.0 without them)."""
        return 0.0 if self._graphs is None else self._graphs.capture_s

    def stats(self) -> EngineStats:
        """Counts of sequences and blocks, prefix-cache lookups, the last step's time."""
        with self._lock:
            c = self.cache
            return EngineStats(running=len(self.scheduler.running), waiting=len(self.scheduler.waiting),
                               blocks_total=c.usable_blocks, blocks_used=c.num_used, blocks_free=c.num_free,
                               blocks_cached=c.num_cached, prefix_cache_queries=c.queries,
                               prefix_cache_hits=c.hits, step_time_s=self._step_time, steps=self._steps)

    # ---- the step --------------------------------------------------------------------------------
    def step(self) -> int:
        """Run one step; returns the number of requests that got a token (0: nothing to do).

        With ``overlap``, a decode step whose batch can go on unchanged launches the next step
        (fed with its greedy tokens on the device) before the host reads its tokens, so the host's
        per-token work runs while the device computes; that next step's results come with the
        following call. Only the step loop's thread steps a started engine."""
        if self._thread is not None and threading.current_thread() is not self._thread:
            raise RuntimeError("the engine is started: its own thread runs the steps")
        t0 = time.perf_counter()
        launched = self._inflight
        self._inflight = None
        if launched is None:
            with self._lock:
                chunks = self.scheduler.schedule()
                if not chunks:
                    return 0
                plan = self._plan(chunks, [c.samples for c in chunks])
            launched = self._launch(plan)
        if self.overlap:
            with self._lock:
                following = self._speculate(launched)
                plan = None if following is None else self._plan(following, [True] * len(following), launched)
            if plan is not None:
                self._inflight = self._launch(plan)
                self.overlapped_steps += 1
        tokens = self._read(launched)
        with self._lock:
            for chunk in launched.chunks:
                if chunk.seq.status != FINISHED:      # not aborted or finished meanwhile
                    self.scheduler.computed(chunk)
            produced = 0
            for chunk, token in zip(launched.sampled, tokens):
                if chunk.seq.status != FINISHED:
                    self._append(chunk.seq, token)
                    produced += 1
            self._steps += 1
            self._step_time = time.perf_counter() - t0
        return produced

    def _speculate(self, prev: "_Launched") -> Optional[list[Chunk]]:
        """The next decode step of ``prev``'s sequences if it can be launched before ``prev``'s
        tokens are known: ``prev`` decoded greedily on the device, nobody waits for admission, no
        sequence ends by length at ``prev`` (one ending by a stop has its extra row ignored), and
        the pool has the blocks."""
        if prev.greedy is None or not prev.decode_only or self.scheduler.waiting:
            return None
        following = []
        for c in prev.chunks:
            seq, p = c.seq, c.seq.params
            if seq.status == FINISHED:
                continue
            if seq.generated + 1 >= p.max_tokens or c.start + 2 >= self.max_model_len:
                return None
            if seq.generated + 1 < p.min_tokens:
                return None
            following.append(Chunk(seq, c.start + 1, 1))
        if not following or not all(self.cache.grow(c.seq.request_id, c.start + 1) for c in following):
            return None
        return following

    def _plan(self, chunks: list[Chunk], samples: list[bool], prev: Optional["_Launched"] = None) -> dict[str, Any]:
        """The host-side inputs of a model call (read under the lock: tables change between
        steps). With ``prev``, each chunk's one token is ``prev``'s greedy token of its sequence,
        still on the device."""
        ids, cu, starts, tables, rows = [], [0], [], [], []
        for c, s in zip(chunks, samples):
            if prev is None:
                ids.extend(c.seq.tokens[c.start:c.start + c.count])
            cu.append(cu[-1] + c.count)
            starts.append(c.start)
            tables.append(self.cache.table(c.seq.request_id))     # only grown by this thread
            if s:
                rows.append(cu[-1] - 1)
        sampled = [c for c, s in zip(chunks, samples) if s]
        index = None
        if prev is not None:
            where = {id(c.seq): i for i, c in enumerate(prev.sampled)}
            index = [where[id(c.seq)] for c in chunks]
        return {"chunks": chunks, "sampled": sampled, "ids": ids, "cu": cu, "starts": starts, "tables": tables,
                "rows": rows, "prev": prev, "index": index, "decode_only": cu[-1] == len(chunks) == len(rows),
                "greedy": prev is not None or all(c.seq.params.greedy and not self._banned(c.seq) for c in sampled)}

    def _launch(self, plan: dict[str, Any]) -> "_Launched":
        """Queue the model call of a plan (outside the lock: adding and aborting go on meanwhile;
        blocks freed by an abort are reused only by later calls, which the device runs after)."""
        chunks, sampled, tables, starts, cu = plan["chunks"], plan["sampled"], plan["tables"], plan["starts"], plan["cu"]
        ids, rows, prev, index = plan["ids"], plan["rows"], plan["prev"], plan["index"]
        greedy_ok, decode_only = plan["greedy"], plan["decode_only"]
        dev = self.device
        with torch.no_grad():
            fed = None
            if prev is not None:
                if index == list(range(len(index))):
                    fed = prev.greedy[:len(index)]
                else:                      # a pinned index: its copy does not wait for the device
                    where_t = torch.tensor(index)
                    fed = prev.greedy[(where_t.pin_memory() if dev.type == "cuda" else where_t).to(dev, non_blocking=True)]
            if self._graphs is not None and decode_only and self._graphs.size_for(len(chunks)) is not None:
                logits, greedy = self._graphs.run(ids if fed is None else fed, tables, starts)
            elif fed is None and self._mixed is not None and self._mixed.ready(len(chunks), cu[-1]):
                logits, greedy = self._mixed.run(ids, tables, starts, cu, rows)
            else:
                width = max(len(t) for t in tables)
                flat: list[int] = []
                for row in tables:
                    flat += row
                    flat += [SCRATCH_BLOCK] * (width - len(row))
                i32 = dict(dtype=torch.int32, device=dev)
                tokens = torch.tensor(ids, dtype=torch.long, device=dev) if fed is None else fed
                logits = self.model.paged_step(tokens, self.pages,
                                               torch.tensor(flat, dtype=torch.int32).view(len(chunks), width).to(dev),
                                               torch.tensor(starts, **i32), torch.tensor(cu, **i32), max(
                                                   c.count for c in chunks),
                                               torch.tensor(rows, dtype=torch.long, device=dev),
                                               float_logits=False)
                greedy = argmax_rows(logits) if greedy_ok and sampled else None
            launched = _Launched(chunks, sampled, logits, greedy if greedy_ok else None, decode_only)
            if launched.greedy is not None:
                launched.host = self._host_tokens[self._flip][:len(sampled)]
                self._flip ^= 1
                launched.host.copy_(launched.greedy, non_blocking=dev.type == "cuda")
                if dev.type == "cuda":
                    launched.event = torch.cuda.Event()
                    launched.event.record()
        return launched

    def _read(self, launched: "_Launched") -> list[int]:
        """The sampled tokens of a launched step (waits for it)."""
        if not launched.sampled:
            return []
        if launched.host is not None:
            if launched.event is not None:
                launched.event.synchronize()
            return launched.host.tolist()
        sampled = launched.sampled
        for c in sampled:
            if c.seq.generator is None and not c.seq.params.greedy:
                c.seq.generator = make_generator(c.seq.params)
        with torch.no_grad():
            return sample_rows(launched.logits, [c.seq.params for c in sampled], [c.seq.generator for c in sampled],
                               [self._banned(c.seq) for c in sampled])

    def _banned(self, seq: Sequence) -> tuple[int, ...]:
        p = seq.params
        if seq.generated >= p.min_tokens:
            return ()
        return tuple(p.stop_token_ids) + (() if p.ignore_eos else tuple(sorted(self.eos_token_ids)))

    # ---- after the step: tokens, text, stops -----------------------------------------------------------
    def _append(self, seq: Sequence, token: int) -> None:
        seq.tokens.append(token)
        if seq.first_token_time is None:
            seq.first_token_time = time.perf_counter()
        p = seq.params
        reason, text = None, ""
        if token in p.stop_token_ids or (not p.ignore_eos and token in self.eos_token_ids):
            reason = "stop"
        elif seq.detokenizer is not None:
            text, matched = self._release(seq, seq.detokenizer.add(token))
            reason = "stop" if matched else None
        if reason is None and (seq.generated >= p.max_tokens or len(seq.tokens) >= self.max_model_len):
            reason = "length"
            if seq.detokenizer is not None:
                text += self._release(seq, seq.detokenizer.flush())[0] + seq.held
                seq.held = ""
        _, stream = self._requests[seq.request_id]
        if reason is None:
            stream.put(self._output(seq, [token], text, None))
        else:
            self._finish(seq, stream, reason, [token], text)

    @staticmethod
    def _release(seq: Sequence, delta: str) -> tuple[str, bool]:
        """Text of ``seq`` that can be released after ``delta``, and whether a stop string ended it."""
        out, seq.held, matched = release_text(seq.held, delta, seq.params.stop)
        seq.text += out
        return out, matched

    def _output(self, seq: Sequence, new: list[int], text: str, reason: Optional[str]) -> RequestOutput:
        ttft = None if seq.first_token_time is None else seq.first_token_time - seq.arrival
        return RequestOutput(seq.request_id, new, text, reason is not None, reason, len(seq.prompt),
                             seq.generated, ttft)

    def _finish(self, seq: Sequence, stream: RequestStream, reason: str, new: list[int], text: str) -> None:
        self.scheduler.remove(seq)
        seq.finish_reason = reason
        del self._requests[seq.request_id]
        stream.put(self._output(seq, new, text, reason))

    def warm_up(self) -> list[Union[int, str]]:
        """Before the first request: run the model calls a step can make over the scratch block
        (token counts 1, 2, 4, ... up to the step budget on CUDA, up to 16 elsewhere, and a mixed
        call) and, on CUDA, capture every decode graph size, so that no request waits on a kernel
        compile, a library load or a graph capture, and memory stays flat while serving. Returns
        what ran: the token counts, "mixed", then "graph N" per captured size. Not while started.

        Example:
            >>> from opforge.models.testing import tiny_decoder
            >>> Engine(tiny_decoder(), max_num_seqs=4, kv_blocks=16).warm_up()
            [1, 2, 4, 8, 16, 'mixed']
        """
        if self._thread is not None:
            raise RuntimeError("warm_up runs before start(): the started engine's thread owns the model")
        budget = self.scheduler.max_num_batched_tokens
        if self.device.type != "cuda":      # no compiles by shape there: a few small calls suffice
            budget = min(budget, 16)
        with self._lock:
            done = warm_up_steps(self.model, self.pages, self.block_size, self.max_model_len, budget)
            if self._graphs is not None:
                done += [f"graph {n}" for n in self._graphs.capture_all()]
                done += [f"graph {n}x{t}" for n, t in self._mixed.capture_all()]
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
        return done

    # ---- the step loop's thread ------------------------------------------------------------------
    def start(self) -> None:
        """Run the step loop in a background thread (until ``shutdown``)."""
        with self._lock:
            if self._thread is not None:
                raise RuntimeError("the engine is already started")
            self._thread = threading.Thread(target=self._loop, name="opforge-engine", daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        while True:
            with self._wake:
                while not self._stopping and not self.scheduler.has_work():
                    self._wake.wait()
                if self._stopping:
                    return
            try:
                self.step()
            except BaseException as exc:         # noqa: BLE001  (every stream must end)
                with self._lock:
                    self.error = exc
                    self._abort_all()
                return

    def _abort_all(self) -> None:
        for seq, stream in list(self._requests.values()):
            self._finish(seq, stream, "abort", [], "")

    def shutdown(self, timeout: Optional[float] = None) -> None:
        """Stop the step loop (after its current step) and end every open request with "abort"."""
        with self._lock:
            self._stopping = True
            self._wake.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
        with self._lock:
            self._abort_all()
