"""CUDA graphs of decode-only steps (one new token per sequence) at padded batch sizes.

Batch sizes are padded up to 1, 2, 4, 8, 16, 32, 64, ... (the last one ``max_num_seqs``); each
size is captured once: all of them by ``capture_all`` (the engine's warm-up), else the first time
a step of that size runs. Padding rows decode into the
scratch block (block 0, never in a sequence's table) at position 0, so they touch nothing real.
The step's inputs live in static buffers that each step refills (one pinned buffer, copied in one
piece or two); the block tables stay on the device and get only their new entries.
The graph also takes the greedy token of every row (used when the whole batch decodes greedily).
Logits stay in the model's dtype: the argmax of bf16 logits is the argmax of their exact float32
copies, and sampling converts the rows it draws from (``sampling.sample_rows``); the float32
copy of a (B, 128256) row block and an argmax over twice the bytes cost every step otherwise.

Example:
    >>> padded_sizes(48)
    [1, 2, 4, 8, 16, 32, 48]
"""
from __future__ import annotations

import time
from typing import Any, Callable, Optional, Sequence, TypeVar, Union

import torch

from .block_tables import SlotTables
from .sampling import argmax_rows

T = TypeVar("T")


def padded_sizes(max_num_seqs: int) -> list[int]:
    """The batch sizes decode steps are padded to."""
    sizes, b = [], 1
    while b < max_num_seqs:
        sizes.append(b)
        b *= 2
    return sizes + [max_num_seqs]


class DecodeGraphs:
    """Captured ``model.paged_step`` calls for decode steps (CUDA only).

    The block tables stay on the device (``SlotTables``): a step sends its tokens, positions and
    slots and the blocks added since the last step, in one pinned buffer and one copy; the graph
    gathers its tables from the slots."""

    def __init__(self, model: Any, cache: Any, max_num_seqs: int, max_blocks_per_seq: int):
        self.model, self.cache = model, cache
        self.sizes = padded_sizes(max_num_seqs)
        n, dev = self.sizes[-1], model.device
        self.n = n
        self.slot_tables = SlotTables(n, max_blocks_per_seq, dev)
        # tokens, positions, slots, then k new table entries: k flat indices, then their k values
        self._entries = n * 4
        self.inputs = torch.zeros(3 * n + 2 * self._entries, dtype=torch.long, device=dev)
        self.tokens, self.seqlens_long, self.slots = self.inputs[:n], self.inputs[n:2 * n], self.inputs[2 * n:3 * n]
        self.cu_seqlens = torch.arange(n + 1, dtype=torch.int32, device=dev)
        self.rows = torch.arange(n, dtype=torch.long, device=dev)
        # two pinned input buffers, used in turn: a step's copy may still be queued while the next
        # step's inputs are written (when steps overlap)
        self._host = [torch.zeros(3 * n + 2 * self._entries, dtype=torch.long, pin_memory=True) for _ in range(2)]
        self._turn = 0
        self._graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor]] = {}
        self._pool = torch.cuda.graph_pool_handle()
        self.capture_s = 0.0            # seconds spent capturing so far (warm-up steps included)

    def size_for(self, batch: int) -> Optional[int]:
        """The padded size a decode step of ``batch`` sequences runs at (None: too many)."""
        return next((s for s in self.sizes if s >= batch), None)

    def run(self, tokens: Union[Sequence[int], torch.Tensor], tables: Sequence[list[int]],
            starts: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits (B, V) in the model's dtype and greedy tokens (B,) of one decode step: ``tokens[b]`` (host
        ints, or a device tensor) at position ``starts[b]`` of the sequence whose blocks are
        ``tables[b]`` (the ``BlockManager``'s own list: its identity names the slot). The outputs
        are the graph's own buffers: the next replay overwrites them."""
        b = len(tables)
        n = self.size_for(b)
        slots, index, values = self.slot_tables.update(tables)
        host = self._host[self._turn]
        self._turn ^= 1
        n3 = 3 * self.n
        k = self.slot_tables.stage(host, n3, self._entries, index, values)
        fed = isinstance(tokens, torch.Tensor)
        if not fed:
            host[:b] = torch.tensor(tokens)
        host[b:n] = 0
        host[self.n:self.n + b] = torch.tensor(starts)
        host[self.n + b:self.n + n] = 0
        host[2 * self.n:2 * self.n + b] = torch.tensor(slots)
        host[2 * self.n + b:2 * self.n + n] = self.slot_tables.padding
        first = self.n if fed else 0                    # fed: padding rows keep earlier (valid) ids
        self.inputs[first:n3 + 2 * k].copy_(host[first:n3 + 2 * k], non_blocking=True)    # one copy
        if fed:
            self.tokens[:b].copy_(tokens)
        self.slot_tables.apply_staged(self.inputs, n3, k)
        if n not in self._graphs:
            self._graphs[n] = self._capture(n)
        graph, logits, greedy = self._graphs[n]
        graph.replay()
        return logits[:b], greedy[:b]

    def capture_all(self) -> list[int]:
        """Capture every padded size not captured yet, all rows padding (they touch only the scratch
        block); returns the sizes captured."""
        captured = []
        for n in self.sizes:
            if n not in self._graphs:
                self.tokens[:n].zero_()
                self.seqlens_long[:n].zero_()
                self.slots[:n].fill_(self.slot_tables.padding)
                self._graphs[n] = self._capture(n)
                captured.append(n)
        return captured

    def _step(self, n: int) -> torch.Tensor:
        tables = self.slot_tables.tables.index_select(0, self.slots[:n])
        return self.model.paged_step(self.tokens[:n], self.cache, tables, self.seqlens_long[:n].int(),
                                     self.cu_seqlens[:n + 1], 1, self.rows[:n], float_logits=False)

    def _capture(self, n: int) -> tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor]:
        torch.cuda.synchronize(self.model.device)     # (capture_s times the capture alone)
        t0 = time.perf_counter()

        def step() -> tuple[torch.Tensor, torch.Tensor]:
            logits = self._step(n)
            return logits, argmax_rows(logits)

        graph, (logits, greedy) = capture_graph(step, self.model.device, self._pool)
        torch.cuda.synchronize(self.model.device)
        self.capture_s += time.perf_counter() - t0
        return graph, logits, greedy


def capture_graph(step: Callable[[], T], device: torch.device, pool: Any) -> tuple[torch.cuda.CUDAGraph, T]:
    """A CUDA graph of one ``step()`` call (in the memory ``pool``), and what that call returned.

    ``step`` runs twice on a side stream first: that compiles its kernels off the capture. Its
    inputs already hold the values the replays will see, so the cache writes of those two runs
    are the ones a replay makes."""
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        for _ in range(2):
            step()
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        out = step()
    return graph, out
