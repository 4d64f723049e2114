"""Random paged-cache problems, and checks of the paged ops against the float64 oracle (``opforge
verify`` and the tests).

A layout scatters every sequence's blocks across the pool in random order, lets sequence 1 share
sequence 0's first block where both have a full one (as prefix caching does), and fills every
slot no sequence owns (past a length, unused blocks, table entries past the used ones) with NaN:
a kernel that reads one shows it in its output.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

import torch

from ...testing import DTYPES, Case
from ..rotary.cases import rope_tables
from . import paged_attention, paged_kv_cache_append, paged_rotary_kv_cache_append, reference


@dataclass
class PagedLayout:
    """Host-side description of where each sequence's positions live."""

    block_tables: torch.Tensor     # (B, max_blocks) int32
    lengths: list[int]             # positions held by each sequence (after the step's tokens)
    new_tokens: list[int]          # the step's new tokens per sequence
    num_blocks: int
    block_size: int

    @property
    def cu_seqlens(self) -> torch.Tensor:
        cu = [0]
        for n in self.new_tokens:
            cu.append(cu[-1] + n)
        return torch.tensor(cu, dtype=torch.int32)

    @property
    def tokens(self) -> int:
        return sum(self.new_tokens)

    def owned_mask(self, lengths: Sequence[int]) -> torch.Tensor:
        """(num_blocks, block_size) bool: slots holding one of the first ``lengths[b]`` positions of some b."""
        owned = torch.zeros(self.num_blocks * self.block_size, dtype=torch.bool)
        for b, length in enumerate(lengths):
            pos = torch.arange(length)
            blocks = self.block_tables[b].long()[pos // self.block_size]
            owned[blocks * self.block_size + pos % self.block_size] = True
        return owned.view(self.num_blocks, self.block_size)


def make_layout(lengths: Sequence[int], new_tokens: Sequence[int], block_size: int, spare_blocks: int = 3,
                extra_columns: int = 1, share: bool = True) -> PagedLayout:
    """Blocks for sequences of ``lengths`` (new tokens included), shuffled over a pool with spare
    blocks; table entries past a sequence's used blocks point at a spare (NaN) block."""
    used = [-(-n // block_size) for n in lengths]
    shared = share and len(lengths) >= 2 and all(lengths[b] - new_tokens[b] >= block_size for b in (0, 1))
    total = sum(used) - (1 if shared else 0) + spare_blocks + 1
    order = torch.randperm(total).tolist()
    poison_block = order.pop()
    cols = max(max(used, default=0), 1) + extra_columns
    tables = torch.full((len(lengths), cols), poison_block, dtype=torch.int32)
    for b, n in enumerate(used):
        for j in range(n):
            tables[b, j] = tables[0, 0] if (shared and b == 1 and j == 0) else order.pop()
    return PagedLayout(tables, list(lengths), list(new_tokens), total, block_size)


def make_pools(layout: PagedLayout, filled: Sequence[int], kv_heads: int, head_dim: int, dtype: torch.dtype,
               device: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Random k/v pools whose slots outside the first ``filled[b]`` positions of each sequence are NaN."""
    shape = (layout.num_blocks, layout.block_size, kv_heads, head_dim)
    owned = layout.owned_mask(filled)[:, :, None, None].to(device)
    pools = []
    for _ in range(2):
        x = torch.randn(shape, dtype=dtype, device=device)
        pools.append(x.masked_fill(~owned, float("nan")))
    return pools[0], pools[1]


def _indices(layout: PagedLayout, lengths: Sequence[int], device: Any) -> tuple[torch.Tensor, ...]:
    return (layout.block_tables.to(device), torch.tensor(list(lengths), dtype=torch.int32, device=device),
            layout.cu_seqlens.to(device))


def attention_case(lengths: Sequence[int], new_tokens: Sequence[int], hq: int, hkv: int, d: int, block_size: int,
                   dtype: torch.dtype, max_query_len: Optional[int] = None, label: str = "") -> Case:
    """``paged_attention`` over a shuffled, NaN-poisoned layout; ``max_query_len`` defaults to the
    most new tokens of a sequence."""
    mq = max_query_len or max(max(new_tokens), 1)

    def make(device):
        layout = make_layout(lengths, new_tokens, block_size)
        kp, vp = make_pools(layout, lengths, hkv, d, dtype, device)
        q = torch.randn(layout.tokens, hq, d, dtype=dtype, device=device)
        return (q, kp, vp, *_indices(layout, lengths, device)), {"max_query_len": mq}

    def oracle(args, kwargs):
        q, kp, vp, tables, lens, cu = args
        return reference.paged_attention(q.double(), kp.double(), vp.double(), tables, lens, cu, d ** -0.5)

    shape = (len(lengths), hq, hkv, d, block_size)
    text = label or f"lens={','.join(map(str, lengths))} new={','.join(map(str, new_tokens))}"
    return Case("paged_attention", shape, dtype, text, make, paged_attention, oracle)


def _append_call(k_pages, v_pages, k, v, tables, lens, cu, k_pages0, v_pages0):
    paged_kv_cache_append(k_pages, v_pages, k, v, tables, lens, cu)
    return k_pages, v_pages


def _append_oracle(args: tuple, kwargs: dict) -> tuple:
    _, _, k, v, tables, lens, cu, k0, v0 = args
    ek, ev = k0.double(), v0.double()
    reference.paged_kv_cache_append(ek, ev, k.double(), v.double(), tables, lens, cu)
    return ek, ev


def append_case(lengths: Sequence[int], new_tokens: Sequence[int], hkv: int, d: int, block_size: int,
                dtype: torch.dtype, label: str = "") -> Case:
    """``paged_kv_cache_append`` of each sequence's new tokens after its filled positions, on random
    pools (every slot compared: the others must keep their values). The call's arguments carry
    copies of the pools before the call (ignored by the call) for the oracle."""

    def make(device):
        layout = make_layout(lengths, new_tokens, block_size)
        shape = (layout.num_blocks, block_size, hkv, d)
        kp, vp = torch.randn(shape, dtype=dtype, device=device), torch.randn(shape, dtype=dtype, device=device)
        t = layout.tokens
        k, v = torch.randn(t, hkv, d, dtype=dtype, device=device), torch.randn(t, hkv, d, dtype=dtype, device=device)
        before = [n - m for n, m in zip(lengths, new_tokens)]
        return (kp, vp, k, v, *_indices(layout, before, device), kp.clone(), vp.clone()), {}

    shape = (len(lengths), hkv, d, block_size)
    text = label or f"lens={','.join(map(str, lengths))} new={','.join(map(str, new_tokens))}"
    return Case("paged_kv_cache_append", shape, dtype, text, make, _append_call, _append_oracle)


def _rotary_append_call(q, k, v, k_pages, v_pages, tables, lens, cu, cos, sin, k_pages0, v_pages0):
    q_out = paged_rotary_kv_cache_append(q, k, v, k_pages, v_pages, tables, lens, cu, cos, sin)
    return q_out, k_pages, v_pages


def _rotary_append_oracle(args: tuple, kwargs: dict) -> tuple:
    q, k, v, _, _, tables, lens, cu, cos, sin, k0, v0 = args
    ek, ev = k0.double(), v0.double()
    q_out = reference.paged_rotary_kv_cache_append(q.double(), k.double(), v.double(), ek, ev, tables, lens, cu,
                                                   cos.double(), sin.double())
    return q_out, ek, ev


def rotary_append_case(lengths: Sequence[int], new_tokens: Sequence[int], hq: int, hkv: int, d: int,
                       block_size: int, dtype: torch.dtype, rotary_dim: int = 0) -> Case:
    """``paged_rotary_kv_cache_append`` at each token's cache position (``rotary_dim`` 0: R = D), on
    random pools (every slot compared), with copies of the pools before the call for the oracle."""
    r = rotary_dim or d

    def make(device):
        layout = make_layout(lengths, new_tokens, block_size)
        shape = (layout.num_blocks, block_size, hkv, d)
        kp, vp = torch.randn(shape, dtype=dtype, device=device), torch.randn(shape, dtype=dtype, device=device)
        t = layout.tokens
        q, k, v = (torch.randn(t, h, d, dtype=dtype, device=device) for h in (hq, hkv, hkv))
        before = [n - m for n, m in zip(lengths, new_tokens)]
        cos, sin = rope_tables(max(lengths) + 1, r, device)
        return (q, k, v, kp, vp, *_indices(layout, before, device), cos, sin, kp.clone(), vp.clone()), {}

    shape = (len(lengths), hq, hkv, d, block_size)
    text = f"lens={','.join(map(str, lengths))} new={','.join(map(str, new_tokens))}{f' R={r}' if r != d else ''}"
    return Case("paged_rotary_kv_cache_append", shape, dtype, text, make, _rotary_append_call,
                _rotary_append_oracle)


def verify_cases(device_type: str, quick: bool = False) -> list[Case]:
    """Mixed steps (decode tokens, short and long chunks), lengths ending mid-block and at a block's
    end, GQA, a few block sizes."""
    if device_type == "cpu":   # Triton's interpreter: small shapes
        mixed = ([33, 16, 5, 48], [1, 2, 5, 17])
        decode = ([40, 7, 16], [1, 1, 1])
        dims = (4, 2, 32)
    else:
        mixed = ([4100, 1024, 300, 2048], [1, 16, 300, 1024])
        decode = ([8192, 77, 1024, 3000], [1, 1, 1, 1])
        dims = (32, 8, 128)
    hq, hkv, d = dims
    cases: list[Case] = []
    for dtype in DTYPES:
        cases.append(attention_case(*decode, hq, hkv, d, 16, dtype))
        if not quick:
            cases.append(attention_case(*mixed, hq, hkv, d, 16, dtype))
        cases.append(append_case(*mixed, hkv, d, 16, dtype))
        cases.append(rotary_append_case(*mixed, hq, hkv, d, 16, dtype))
    cases.append(attention_case(*mixed, hq, hkv, d, 8, torch.bfloat16))
    cases.append(rotary_append_case(*mixed, hq, hkv, d, 8, torch.float32, rotary_dim=d // 2))
    return cases
