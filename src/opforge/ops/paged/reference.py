"""The torch path for the paged-cache ops: the fallback everywhere and, in float64, the test oracle.

It reads exactly the slots a sequence owns: for sequence ``b`` the first ``cache_seqlens[b]``
positions, found through the first blocks of its ``block_tables`` row; no other slot of the pools,
and no table entry past those, is ever indexed. It reads the lengths and tables on the host, so
on a GPU it synchronizes (the Triton kernels never do). Scores and the softmax run in float32
(float64 for float64 inputs) with the row maximum subtracted; a query that sees no key gives zeros.
"""
from __future__ import annotations

from typing import Optional

import torch

from ..rotary import reference as rotary_reference


def _compute_dtype(t: torch.Tensor) -> torch.dtype:
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def token_slots(block_tables: torch.Tensor, cache_seqlens: torch.Tensor, cu_seqlens: torch.Tensor,
                tokens: int, block_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """For every packed token t: (sequence b, cache position ``cache_seqlens[b] + t - cu_seqlens[b]``,
    flat slot ``block * block_size + position % block_size`` or -1 where the position is outside the
    table row or its block id is negative). Device ops only.

    Example:
        >>> import torch
        >>> tables = torch.tensor([[3, 1], [0, 2]])
        >>> b, pos, slot = token_slots(tables, torch.tensor([3, 0]), torch.tensor([0, 2, 3]), 3, 2)
        >>> b.tolist(), pos.tolist(), slot.tolist()
        ([0, 0, 1], [3, 4, 0], [3, -1, 0])
    """
    device = block_tables.device
    t = torch.arange(tokens, device=device)
    cu = cu_seqlens.long()
    b = (torch.searchsorted(cu[1:], t, right=True)).clamp(max=max(block_tables.shape[0] - 1, 0))
    pos = cache_seqlens.long()[b] + t - cu[b]
    col = torch.div(pos, block_size, rounding_mode="floor")
    inside = (pos >= 0) & (col < block_tables.shape[1])
    block = block_tables.long()[b, col.clamp(0, max(block_tables.shape[1] - 1, 0))]
    slot = torch.where(inside & (block >= 0), block * block_size + pos % block_size, torch.full_like(pos, -1))
    return b, pos, slot


def paged_kv_cache_append(k_pages: torch.Tensor, v_pages: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                          block_tables: torch.Tensor, cache_seqlens: torch.Tensor, cu_seqlens: torch.Tensor) -> None:
    """Write token t of sequence b at position ``cache_seqlens[b] + i`` of b's blocks; tokens whose
    position or block falls outside the table or the pool are skipped (the public function raises
    for them first when it checks).

    Example:
        >>> import torch
        >>> kp, vp = torch.zeros(3, 2, 1, 1), torch.zeros(3, 2, 1, 1)
        >>> x = torch.tensor([1.0, 2.0, 3.0]).view(3, 1, 1)
        >>> paged_kv_cache_append(kp, vp, x, x, torch.tensor([[2, 0]]), torch.tensor([1]), torch.tensor([0, 3]))
        >>> kp.flatten().tolist()
        [2.0, 3.0, 0.0, 0.0, 0.0, 1.0]
    """
    nb, bs = k_pages.shape[:2]
    _, _, slot = token_slots(block_tables, cache_seqlens, cu_seqlens, k.shape[0], bs)
    ok = (slot >= 0) & (slot < nb * bs)
    rows = ok.nonzero().flatten()
    dst = slot[rows]
    k_pages.view(nb * bs, *k_pages.shape[2:])[dst] = k[rows]
    v_pages.view(nb * bs, *v_pages.shape[2:])[dst] = v[rows]


def paged_rotary_kv_cache_append(q, k, v, k_pages, v_pages, block_tables, cache_seqlens, cu_seqlens, cos, sin,
                                 positions: Optional[torch.Tensor] = None, interleaved: bool = False,
                                 inplace: bool = False) -> torch.Tensor:
    """Rotate q and k (positions default to each token's cache position), append the rotated k and v;
    returns the rotated q (q itself when ``inplace``)."""
    if positions is None:
        _, positions, _ = token_slots(block_tables, cache_seqlens, cu_seqlens, k.shape[0], k_pages.shape[1])

    def rotate(x):   # (T, H, D) as rotary's (1, H, T, D) with per-token positions (T,)
        return rotary_reference.rotate(x.transpose(0, 1).unsqueeze(0), cos, sin, positions,
                                       interleaved)[0].transpose(0, 1)

    q_out = rotate(q)
    paged_kv_cache_append(k_pages, v_pages, rotate(k), v, block_tables, cache_seqlens, cu_seqlens)
    if inplace:
        q.copy_(q_out)
        return q
    return q_out.contiguous()


def gather_sequence(pages: torch.Tensor, table_row: torch.Tensor, length: int) -> torch.Tensor:
    """The first ``length`` positions of one sequence, (length, Hkv, D): exactly its slots, no other.

    Example:
        >>> import torch
        >>> pages = torch.arange(6.0).view(3, 2, 1, 1)          # blocks [0, 1], [2, 3], [4, 5]
        >>> gather_sequence(pages, torch.tensor([2, 0]), 3).flatten().tolist()
        [4.0, 5.0, 0.0]
    """
    nb, bs = pages.shape[:2]
    used = -(-length // bs)
    blocks = table_row[:used].long()
    slots = (blocks[:, None] * bs + torch.arange(bs, device=pages.device)[None, :]).flatten()[:length]
    return pages.reshape(nb * bs, *pages.shape[2:]).index_select(0, slots)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """Causal attention of n queries (n, Hq, D), the last n of L positions, over keys (L, Hkv, D):
    query i sees keys ``j <= L - n + i``; a query that sees none gives zeros.

    Example:
        >>> import torch
        >>> q, k = torch.zeros(1, 2, 2), torch.zeros(3, 1, 2)
        >>> v = torch.tensor([1.0, 2.0, 6.0]).view(3, 1, 1).expand(3, 1, 2)
        >>> attend(q, k, v, 1.0)[0, :, 0].tolist()   # the mean of the three values, both heads
        [3.0, 3.0]
    """
    ct = _compute_dtype(q)
    n, hq, _ = q.shape
    length = k.shape[0]
    if length == 0 or n == 0:
        return torch.zeros(n, hq, v.shape[-1], dtype=q.dtype, device=q.device)
    group = hq // k.shape[1]
    kf = k.to(ct).repeat_interleave(group, dim=1).transpose(0, 1)     # (Hq, L, D)
    vf = v.to(ct).repeat_interleave(group, dim=1).transpose(0, 1)
    s = torch.matmul(q.to(ct).transpose(0, 1), kf.transpose(1, 2)) * scale   # (Hq, n, L)
    i = torch.arange(n, device=q.device)[:, None]
    j = torch.arange(length, device=q.device)[None, :]
    s = s.masked_fill(~(j <= i + (length - n)), float("-inf"))
    m = s.amax(dim=-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    p = torch.exp(s - m)
    total = p.sum(dim=-1, keepdim=True)
    out = torch.matmul(p, vf) / torch.where(total > 0, total, torch.ones_like(total))
    return out.transpose(0, 1).to(q.dtype)


def paged_attention(q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor, block_tables: torch.Tensor,
                    cache_seqlens: torch.Tensor, cu_seqlens: torch.Tensor, scale: float) -> torch.Tensor:
    """Each sequence's queries over its own positions, one sequence at a time (host loop; lengths
    clamped to the table row's capacity, as the kernels do)."""
    out = torch.zeros(q.shape[:2] + v_pages.shape[3:], dtype=q.dtype, device=q.device)
    capacity = block_tables.shape[1] * k_pages.shape[1]
    lens = cache_seqlens.to("cpu", torch.int64).clamp(0, capacity).tolist()
    cu = cu_seqlens.to("cpu", torch.int64).tolist()
    for b, length in enumerate(lens):
        lo, hi = cu[b], cu[b + 1]
        if hi <= lo:
            continue
        k = gather_sequence(k_pages, block_tables[b], length)
        v = gather_sequence(v_pages, block_tables[b], length)
        out[lo:hi] = attend(q[lo:hi], k, v, scale)
    return out
