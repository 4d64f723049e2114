"""Warm-up before serving: the model calls a step can make, run once over the scratch block.

The first model call of a kind compiles kernel variants (Triton), loads library kernels (CUDA
loads cuBLAS kernels lazily, per GEMM shape class) and, for decode steps, captures a CUDA graph.
Done while serving, that work stalls every running request for its duration and grows the
process's memory after the server said it was ready. ``warm_up_steps`` runs eager model calls at
1, 2, 4, ... up to the step's token budget, packed as full-length sequences, and one mixed call
(decode rows beside a prefill chunk); every one of them reads and writes only the scratch block,
which no sequence owns, so the cache's contents and the engine's state are untouched.

Example:
    >>> from opforge.models.testing import tiny_decoder
    >>> model = tiny_decoder()
    >>> pages = model.paged_cache(num_blocks=4, block_size=4)
    >>> warm_up_steps(model, pages, block_size=4, max_model_len=16, max_tokens=8)
    [1, 2, 4, 8, 'mixed']
"""
from __future__ import annotations

from typing import Any, Union

import torch

from .kv_cache import SCRATCH_BLOCK


def token_ladder(max_tokens: int) -> list[int]:
    """1, 2, 4, ... and ``max_tokens`` itself: the token counts the warm-up's calls carry.

    Example:
        >>> token_ladder(20)
        [1, 2, 4, 8, 16, 20]
    """
    counts, t = [], 1
    while t < max_tokens:
        counts.append(t)
        t *= 2
    return counts + [max_tokens]


def _call(model: Any, pages: Any, block_size: int, chunks: list[tuple[int, int]]) -> None:
    """One eager model call: ``chunks`` of (start position, token count), every table all scratch."""
    dev = model.device
    width = max(-(-(start + count) // block_size) for start, count in chunks)
    cu = [0]
    for _, count in chunks:
        cu.append(cu[-1] + count)
    i32 = dict(dtype=torch.int32, device=dev)
    tables = torch.full((len(chunks), width), SCRATCH_BLOCK, **i32)
    rows = torch.tensor(cu[1:], dtype=torch.long, device=dev) - 1
    model.paged_step(torch.zeros(cu[-1], dtype=torch.long, device=dev), pages, tables,
                     torch.tensor([s for s, _ in chunks], **i32), torch.tensor(cu, **i32),
                     max(c for _, c in chunks), rows)


def warm_up_steps(model: Any, pages: Any, block_size: int, max_model_len: int,
                  max_tokens: int) -> list[Union[int, str]]:
    """Run the warm-up's eager model calls; returns their token counts ("mixed" for the last).

    ``max_tokens``: the step's token budget. A call of T tokens packs sequences of at most
    ``max_model_len - 1`` tokens each; the mixed call puts three decode rows (one token at position
    ``block_size``) beside a prefill chunk of 2 * ``block_size`` + 1 tokens."""
    longest = max(1, max_model_len - 1)
    done: list[Union[int, str]] = []
    with torch.no_grad():
        for t in token_ladder(max_tokens):
            full, rest = divmod(t, longest)
            _call(model, pages, block_size, [(0, longest)] * full + ([(0, rest)] if rest else []))
            done.append(t)
        chunk = min(2 * block_size + 1, longest)
        decode_at = min(block_size, longest - 1)
        _call(model, pages, block_size, [(decode_at, 1)] * 3 + [(0, chunk)])
        done.append("mixed")
    return done
