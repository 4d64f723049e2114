"""Continuous batching: which tokens of which sequences the next model call computes.

Each step has a token budget. Running sequences come first, oldest first: those decoding (one
token pending) and then those in the middle of a prompt (a chunk of it, as far as the budget
goes), so a long prompt delays the others by at most one chunk. Waiting sequences are admitted
next, in arrival order, while the budget, ``max_num_seqs`` and free blocks allow; a prompt whose
start is in the prefix cache begins after the cached part. A prompt whose next uncached block is
one that a prefilling sequence computes now or later (the same tokens after the same prefix) waits
(admission stops there): once that block is computed it comes from the cache instead of being
computed twice (many requests sharing a long system prompt compute it once).

With ``max_prefill_tokens_while_decoding``, a step that carries decode tokens carries at most that
many prompt tokens (chunks of running prompts and admissions together), so the decoding sequences'
next token does not wait for a large prefill; a step without decode tokens takes the whole budget.

When a running sequence needs a block and none is free, the most recently admitted sequence is
preempted: its blocks are freed and it goes back to the head of the queue with its tokens so far
(prompt + generated), recomputed when it is admitted again. Its output is unaffected.

Example:
    >>> from opforge.serve.kv_cache import BlockManager
    >>> from opforge.serve.sampling import SamplingParams
    >>> s = Scheduler(BlockManager(16, 4), max_num_seqs=8, max_num_batched_tokens=6)
    >>> s.add(Sequence("a", [1, 2, 3, 4, 5], SamplingParams()))
    >>> s.add(Sequence("b", [6, 7, 8], SamplingParams()))
    >>> [(c.seq.request_id, c.start, c.count, c.samples) for c in s.schedule()]
    [('a', 0, 5, True), ('b', 0, 1, False)]
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Optional

from .kv_cache import BlockManager
from .sampling import SamplingParams

WAITING, RUNNING, FINISHED = "waiting", "running", "finished"


@dataclass(eq=False)
class Sequence:
    """One request's state: its tokens (prompt, then generated), how many are in the cache."""

    request_id: str
    prompt: list[int]
    params: SamplingParams
    tokens: list[int] = field(default_factory=list)   # prompt + generated
    computed: int = 0                                  # positions of ``tokens`` in the cache
    status: str = WAITING
    finish_reason: Optional[str] = None
    arrival: float = field(default_factory=time.perf_counter)
    first_token_time: Optional[float] = None
    preemptions: int = 0
    generator: Any = None                              # the request's random.Random when sampling
    detokenizer: Any = None
    text: str = ""                                     # released text (stop strings removed)
    held: str = ""                                     # decoded text not yet released (a stop may start in it)
    digests: list[bytes] = field(default_factory=list)  # names of its first full blocks (prefix caching)

    def __post_init__(self) -> None:
        if not self.tokens:
            self.tokens = list(self.prompt)

    @property
    def generated(self) -> int:
        return len(self.tokens) - len(self.prompt)

    @property
    def pending(self) -> int:
        """Tokens not yet in the cache (1 while decoding)."""
        return len(self.tokens) - self.computed


@dataclass
class Chunk:
    """``count`` tokens of ``seq`` from position ``start`` computed in this step; ``samples``: the
    chunk ends at the sequence's last token, so its logits give the next token."""

    seq: Sequence
    start: int
    count: int

    @property
    def samples(self) -> bool:
        return self.start + self.count == len(self.seq.tokens)


class Scheduler:
    """Waiting and running sequences and the plan of each step (see the module's docstring)."""

    def __init__(self, cache: BlockManager, max_num_seqs: int, max_num_batched_tokens: int,
                 max_prefill_tokens_while_decoding: Optional[int] = None):
        self.cache = cache
        self.max_num_seqs, self.max_num_batched_tokens = max_num_seqs, max_num_batched_tokens
        self.max_prefill_tokens_while_decoding = max_prefill_tokens_while_decoding
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []              # admission order
        self.preemptions = 0

    def add(self, seq: Sequence) -> None:
        seq.status = WAITING
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def remove(self, seq: Sequence) -> None:
        """Take ``seq`` out (finished or aborted) and free its blocks at once."""
        if seq.status == RUNNING:
            self.running.remove(seq)
        elif seq.status == WAITING:
            self.waiting.remove(seq)
        if seq.request_id in self.cache:
            self.cache.free(seq.request_id)
        seq.status = FINISHED

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.cache.free(seq.request_id)
        seq.computed = 0
        seq.status = WAITING
        seq.preemptions += 1
        self.preemptions += 1
        self.waiting.appendleft(seq)

    def schedule(self) -> list[Chunk]:
        """The chunks of the next step (empty when there is nothing to do)."""
        budget = self.max_num_batched_tokens
        plan: dict[Sequence, Chunk] = {}
        preempted = False
        decodes = prompt = 0                      # decode rows and prompt tokens in the plan
        decoding = [s for s in self.running if s.pending == 1]
        prefilling = [s for s in self.running if s.pending > 1]
        for seq in decoding + prefilling:
            if seq.status != RUNNING or budget == 0:
                continue
            decode = seq.pending == 1
            count = 1 if decode else min(seq.pending, self._prompt_room(budget, prompt, decodes))
            if count == 0:
                continue
            while not self.cache.grow(seq.request_id, seq.computed + count):
                victim = self.running[-1]
                if victim in plan:
                    chunk = plan.pop(victim)
                    budget += chunk.count
                    if victim.pending == 1:
                        decodes -= 1
                    else:
                        prompt -= chunk.count
                self._preempt(victim)
                preempted = True
                if victim is seq:
                    break
            if seq.status == RUNNING:
                plan[seq] = Chunk(seq, seq.computed, count)
                budget -= count
                if decode:
                    decodes += 1
                else:
                    prompt += count
        pending: Optional[set[bytes]] = None      # blocks that prefilling sequences will name
        while self.waiting and len(self.running) < self.max_num_seqs and not preempted:
            room = self._prompt_room(budget, prompt, decodes)
            if room == 0:
                break
            seq = self.waiting[0]
            queries, hits = self.cache.queries, self.cache.hits
            seq.computed = self.cache.allocate(seq.request_id, seq.tokens, seq.digests)
            count = min(seq.pending, room)
            if self.cache.enable_prefix_caching:
                if pending is None:
                    pending = set()
                    for s in prefilling:
                        if s.status == RUNNING:
                            pending.update(self._digests(s)[self.cache.named(s.request_id):])
                mine = self._digests(seq)
                block = seq.computed // self.cache.block_size
                if block < len(mine) and mine[block] in pending:
                    self.cache.free(seq.request_id)    # wait for that block: undo the lookup
                    self.cache.queries, self.cache.hits = queries, hits
                    seq.computed = 0
                    break
                pending.update(mine[block:])
            if not self.cache.grow(seq.request_id, seq.computed + count):
                self.cache.free(seq.request_id)        # not now: undo the lookup, keep the order
                self.cache.queries, self.cache.hits = queries, hits
                seq.computed = 0
                break
            self.waiting.popleft()
            seq.status = RUNNING
            self.running.append(seq)
            plan[seq] = Chunk(seq, seq.computed, count)
            budget -= count
            prompt += count
        return list(plan.values())

    def _prompt_room(self, budget: int, prompt: int, decodes: int) -> int:
        """Prompt tokens a step may still take: its budget, and with decode rows planned, what
        ``max_prefill_tokens_while_decoding`` leaves after the ``prompt`` tokens already planned."""
        bound = self.max_prefill_tokens_while_decoding
        if bound is None or decodes == 0:
            return budget
        return max(0, min(budget, bound - prompt))

    def _digests(self, seq: Sequence) -> list[bytes]:
        """Names of ``seq``'s full blocks (all tokens but the last), each computed once."""
        return self.cache.extend_digests(seq.tokens, seq.digests, (len(seq.tokens) - 1) // self.cache.block_size)

    def computed(self, chunk: Chunk) -> None:
        """Record that the step computed ``chunk``; name its full blocks for the prefix cache."""
        seq = chunk.seq
        seq.computed = chunk.start + chunk.count
        self.cache.commit(seq.request_id, seq.tokens, seq.computed, seq.digests)
