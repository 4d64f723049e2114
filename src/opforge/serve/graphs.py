"""CUDA graphs of decode-only steps (one new token per sequence) at padded batch sizes.

Batch sizes are padded up to 1, 2, 4, 8, 16, 32, 64, ... (the last one ``max_num_seqs``); each
size is captured once, the first time a step of that size runs. Padding rows decode into the
scratch block (block 0, never in a sequence's table) at position 0, so they touch nothing real.
The step's inputs live in static buffers that each step refills; a replay then costs one launch.
The graph also takes the greedy token of every row (used when the whole batch decodes greedily).

Example:
    >>> padded_sizes(48)
    [1, 2, 4, 8, 16, 32, 48]
"""
from __future__ import annotations

from typing import Any, Optional, Sequence, Union

import torch

from ..models.generate import argmax_rows
from .kv_cache import SCRATCH_BLOCK


def padded_sizes(max_num_seqs: int) -> list[int]:
    """The batch sizes decode steps are padded to."""
    sizes, b = [], 1
    while b < max_num_seqs:
        sizes.append(b)
        b *= 2
    return sizes + [max_num_seqs]


class DecodeGraphs:
    """Captured ``model.paged_step`` calls for decode steps (CUDA only)."""

    def __init__(self, model: Any, cache: Any, max_num_seqs: int, max_blocks_per_seq: int):
        self.model, self.cache = model, cache
        self.sizes = padded_sizes(max_num_seqs)
        n, dev = self.sizes[-1], model.device
        self.tokens = torch.zeros(n, dtype=torch.long, device=dev)
        self.tables = torch.full((n, max_blocks_per_seq), SCRATCH_BLOCK, dtype=torch.int32, device=dev)
        self.seqlens = torch.zeros(n, dtype=torch.int32, device=dev)
        self.cu_seqlens = torch.arange(n + 1, dtype=torch.int32, device=dev)
        self.rows = torch.arange(n, dtype=torch.long, device=dev)
        # two sets of pinned input buffers, used in turn: a step's copies may still be queued while
        # the next step's inputs are written (when steps overlap)
        self._host_tables = [torch.full((n, max_blocks_per_seq), SCRATCH_BLOCK, dtype=torch.int32, pin_memory=True)
                             for _ in range(2)]
        self._host_small = [torch.zeros(2, n, dtype=torch.long, pin_memory=True) for _ in range(2)]  # tokens, seqlens
        self._turn = 0
        self._graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor]] = {}
        self._pool = torch.cuda.graph_pool_handle()

    def size_for(self, batch: int) -> Optional[int]:
        """The padded size a decode step of ``batch`` sequences runs at (None: too many)."""
        return next((s for s in self.sizes if s >= batch), None)

    def run(self, tokens: Union[Sequence[int], torch.Tensor], tables: Sequence[Sequence[int]],
            starts: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits (B, V) float32 and greedy tokens (B,) of one decode step: ``tokens[b]`` (host
        ints, or a device tensor) at position ``starts[b]`` of the sequence whose blocks are
        ``tables[b]``. The outputs are the graph's own buffers: the next replay overwrites them."""
        b = len(tokens)
        n = self.size_for(b)
        width = max(len(row) for row in tables)
        # entries past a row's length are never read: only the used width is refreshed
        flat: list[int] = []
        for row in tables:
            flat += row
            flat += [SCRATCH_BLOCK] * (width - len(row))
        host, small = self._host_tables[self._turn], self._host_small[self._turn]
        self._turn ^= 1
        host[:b, :width] = torch.tensor(flat, dtype=torch.int32).view(b, width)
        host[b:n, :width] = SCRATCH_BLOCK
        small[:, b:n] = 0
        if not isinstance(tokens, torch.Tensor):
            small[0, :b] = torch.tensor(tokens)
        small[1, :b] = torch.tensor(starts)
        self.tables[:n].copy_(host[:n], non_blocking=True)          # whole rows: one contiguous copy
        if isinstance(tokens, torch.Tensor):
            self.tokens[:b].copy_(tokens)                           # padding rows keep earlier (valid) ids
        else:
            self.tokens[:n].copy_(small[0, :n], non_blocking=True)
        self.seqlens[:n].copy_(small[1, :n], non_blocking=True)
        if n not in self._graphs:
            self._graphs[n] = self._capture(n)
        graph, logits, greedy = self._graphs[n]
        graph.replay()
        return logits[:b], greedy[:b]

    def _step(self, n: int) -> torch.Tensor:
        return self.model.paged_step(self.tokens[:n], self.cache, self.tables[:n], self.seqlens[:n],
                                     self.cu_seqlens[:n + 1], 1, self.rows[:n])

    def _capture(self, n: int) -> tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor]:
        # warm up off the capture (compiles kernels); the inputs already hold this step's values, so
        # the cache writes of the warm-up are the ones the replay makes
        stream = torch.cuda.Stream(self.model.device)
        stream.wait_stream(torch.cuda.current_stream(self.model.device))
        with torch.cuda.stream(stream):
            for _ in range(2):
                argmax_rows(self._step(n))
        torch.cuda.current_stream(self.model.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            logits = self._step(n)
            greedy = argmax_rows(logits)
        return graph, logits, greedy
