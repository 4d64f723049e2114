"""CUDA graphs of steps that carry prefill chunks, at padded token and sequence counts.

An eager step costs the host ~9 ms for the 1B shape on an H100 whatever its tokens (about 150
launches and their argument handling, measured), which a decode graph step (~3 ms) does not pay:
a step that admits a short prompt beside running decodes stalled every stream for that long.
The paged kernels read every length on the device and size their grids from shapes alone, so such
a step can be replayed too. Its tokens are padded up to 32, 64, ... ``max_tokens`` and its
sequences up to 2, 4, 8, ... ``max_num_seqs + 1``; the padding tokens form one extra sequence
whose table is the padding slot's (all scratch block) and whose positions start at 0, and the
sequences after it get no tokens. ``max_query_len`` is the padded token count, so every chunk's
query tiles are in the grid (tiles past a sequence's own count return at once). Logits are
computed for one row per padded sequence: the sampled rows first, then row 0 again.

The engine replays only the sizes its warm-up captured. Off CUDA the same padded step runs eagerly
(what the tests check against the unpadded step).

Example:
    >>> token_sizes(300)
    [32, 64, 128, 256, 300]
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import torch

from .sampling import argmax_rows
from .block_tables import SlotTables
from .graphs import capture_graph, padded_sizes

#: Steps of more tokens run eagerly: at 2048 tokens the 1B step's GPU time (~9 ms) already covers
#: its host time, and each token size adds one graph per sequence size.
MAX_GRAPH_TOKENS = 2048
MIN_GRAPH_TOKENS = 32           # the paged kernels' mixed form needs max_query_len > 16


def token_sizes(max_tokens: int) -> list[int]:
    """The token counts steps with prefill are padded to (none below ``MIN_GRAPH_TOKENS``)."""
    sizes, t = [], MIN_GRAPH_TOKENS
    while t < max_tokens:
        sizes.append(t)
        t *= 2
    return sizes + [max_tokens] if max_tokens >= MIN_GRAPH_TOKENS else []


class MixedGraphs:
    """``model.paged_step`` over padded prefill steps, captured per (sequences, tokens) on CUDA."""

    def __init__(self, model: Any, cache: Any, max_num_seqs: int, max_blocks_per_seq: int,
                 max_tokens: int, pool: Any = None):
        self.model, self.cache = model, cache
        self.seq_sizes = [s for s in padded_sizes(max_num_seqs + 1) if s >= 2]
        self.token_sizes = token_sizes(min(max_tokens, MAX_GRAPH_TOKENS))
        dev = model.device
        self.capture = dev.type == "cuda"
        n, t = self.seq_sizes[-1], self.token_sizes[-1] if self.token_sizes else 0
        self.n, self.t = n, t
        self.slot_tables = SlotTables(n, max_blocks_per_seq, dev)
        self._entries = n * 4
        # tokens, starts, slots, cu_seqlens, rows, then k new table entries (k indices, k values)
        width = t + 3 * n + 1 + n + 2 * self._entries
        self.inputs = torch.zeros(width, dtype=torch.long, device=dev)
        o = self._offsets = [0, t, t + n, t + 2 * n, t + 3 * n + 1, t + 4 * n + 1]
        self.tokens, self.starts, self.slots = self.inputs[:o[1]], self.inputs[o[1]:o[2]], self.inputs[o[2]:o[3]]
        self.cu, self.rows = self.inputs[o[3]:o[4]], self.inputs[o[4]:o[5]]
        self._host = [torch.zeros(width, dtype=torch.long, pin_memory=self.capture) for _ in range(2)]
        self._turn = 0
        self._graphs: dict[tuple[int, int], Any] = {}
        # every graph writes its outputs here (a graph's own outputs would stay allocated, one set
        # per size: ~1 GB of bf16 logits for the 1B shape's 63 sizes)
        self.logits = torch.empty((n, model.config.vocab_size), dtype=model.dtype, device=dev)
        self.greedy = torch.empty(n, dtype=torch.long, device=dev)
        self._pool = pool if pool is not None or not self.capture else torch.cuda.graph_pool_handle()

    def size_for(self, seqs: int, tokens: int) -> Optional[tuple[int, int]]:
        """The padded (sequences, tokens) a step runs at (None: it runs eagerly)."""
        n = next((s for s in self.seq_sizes if s >= seqs + 1), None)
        t = next((s for s in self.token_sizes if s >= tokens), None)
        return None if n is None or t is None else (n, t)

    def ready(self, seqs: int, tokens: int) -> bool:
        """Whether a step of ``seqs`` sequences and ``tokens`` tokens replays a captured graph. The
        engine replays only what ``capture_all`` (its warm-up) captured: a capture mid-serving would
        stall every stream for three runs of the step, and a one-off prefill (``generate``) would
        pay that for nothing."""
        size = self.size_for(seqs, tokens)
        return size is not None and size in self._graphs

    def run(self, ids: Sequence[int], tables: Sequence[list[int]], starts: Sequence[int], cu: Sequence[int],
            rows: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits (R, V) in the model's dtype and greedy tokens (R,) of one step: sequence ``b`` (blocks
        ``tables[b]``, the ``BlockManager``'s own list) gets ``ids[cu[b]:cu[b + 1]]`` at positions
        from ``starts[b]``; ``rows`` are the R packed rows that sample. The outputs are the graph's
        own buffers: the next replay overwrites them."""
        b, real = len(tables), cu[-1]
        n, t = self.size_for(b, real)
        slots, index, values = self.slot_tables.update(tables)
        host = self._host[self._turn]
        self._turn ^= 1
        o = self._offsets
        k = self.slot_tables.stage(host, o[5], self._entries, index, values)
        host[:real] = torch.tensor(ids)
        host[real:t] = 0
        host[o[1]:o[1] + b] = torch.tensor(starts)
        host[o[1] + b:o[1] + n] = 0
        host[o[2]:o[2] + b] = torch.tensor(slots)
        host[o[2] + b:o[2] + n] = self.slot_tables.padding
        host[o[3]:o[3] + b + 1] = torch.tensor(cu)
        host[o[3] + b + 1:o[3] + n + 1] = t             # the padding sequence takes the rest
        host[o[4]:o[4] + len(rows)] = torch.tensor(rows)
        host[o[4] + len(rows):o[4] + n] = 0
        self.inputs.copy_(host, non_blocking=True)                                      # one copy
        self.slot_tables.apply_staged(self.inputs, o[5], k)
        if not self.capture:
            logits = self._step(n, t)
            return logits[:len(rows)], argmax_rows(logits)[:len(rows)]
        if (n, t) not in self._graphs:
            self._graphs[n, t] = self._capture(n, t)
        self._graphs[n, t].replay()
        return self.logits[:len(rows)], self.greedy[:len(rows)]

    def capture_all(self) -> list[tuple[int, int]]:
        """Capture every (sequences, tokens) size not captured yet, all tokens the padding
        sequence's (they touch only the scratch block); returns the sizes captured."""
        captured = []
        if not self.capture:
            return captured
        for n in self.seq_sizes:
            for t in self.token_sizes:
                if (n, t) not in self._graphs:
                    self.tokens[:t].zero_()
                    self.starts[:n].zero_()
                    self.slots[:n].fill_(self.slot_tables.padding)
                    self.cu[0] = 0
                    self.cu[1:n + 1] = t
                    self.rows[:n].zero_()
                    self._graphs[n, t] = self._capture(n, t)
                    captured.append((n, t))
        return captured

    def _step(self, n: int, t: int) -> torch.Tensor:
        tables = self.slot_tables.tables.index_select(0, self.slots[:n])
        return self.model.paged_step(self.tokens[:t], self.cache, tables, self.starts[:n].int(),
                                     self.cu[:n + 1].int(), t, self.rows[:n], float_logits=False)

    def _capture(self, n: int, t: int) -> Any:
        def step() -> None:
            logits = self._step(n, t)
            self.logits[:n].copy_(logits)
            self.greedy[:n].copy_(argmax_rows(logits))

        return capture_graph(step, self.model.device, self._pool)[0]
