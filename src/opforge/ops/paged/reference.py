"""The torch path for the paged-cache ops: the fallback everywhere and, in float64, the test oracle.

Two forms, as in the other families (docs/torch-path.md):

* the careful composites (``paged_attention``, ``paged_kv_cache_append``,
  ``paged_rotary_kv_cache_append``): scores and the softmax in float32 (float64 for float64
  inputs) with the row maximum subtracted; a query that sees no key gives zeros. Call them on
  ``.double()`` tensors for the oracle.
* ``fast_paged_attention`` / ``fast_paged_rotary_kv_cache_append``: the torch path for float32
  and half CPU tensors whose indices were checked (the public functions check them on CPU):
  PyTorch's SDPA with grouped heads over each sequence's gathered blocks, rotary through the
  rotary family's fast rotate-half, one indexed copy into the pools.

Both read exactly the slots a sequence owns: for sequence ``b`` the first ``cache_seqlens[b]``
positions, found through the first blocks of its ``block_tables`` row; no other slot of the pools,
and no table entry past those, reaches the output. They read the lengths and tables on the host,
so on a GPU the careful form synchronizes (the Triton kernels never do).
"""
from __future__ import annotations

from typing import Optional

import torch

from ..attention.reference import causal_mask, fast_attention
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


# ---- the fast forms (float32 and half CPU tensors, checked indices) --------------------------------

def _host_positions(cache_seqlens: torch.Tensor, counts: list[int], lens: list[int]) -> torch.Tensor:
    """Each packed token's cache position (T,) int64: ``cache_seqlens[b] + i``."""
    if all(n == 1 for n in counts):                                    # decode tokens only
        return cache_seqlens.long()
    return torch.cat([torch.arange(start, start + n) for start, n in zip(lens, counts)])


def fast_paged_rotary_kv_cache_append(q, k, v, k_pages, v_pages, block_tables, cache_seqlens, cu_seqlens, cos, sin,
                                      positions: Optional[torch.Tensor] = None, interleaved: bool = False,
                                      inplace: bool = False) -> torch.Tensor:
    """``paged_rotary_kv_cache_append`` for checked CPU indices: rotation rows gathered once for
    q and k, rotated k and v written into the pools with one ``index_copy_`` each.

    Example:
        >>> import torch
        >>> q, k, v = torch.randn(3, 4, 8), torch.randn(3, 2, 8), torch.randn(3, 2, 8)
        >>> tables, lens, cu = torch.tensor([[2], [0]]), torch.tensor([3, 0]), torch.tensor([0, 1, 3])
        >>> cos, sin = torch.rand(16, 4), torch.rand(16, 4)
        >>> kp, vp = torch.zeros(4, 4, 2, 8), torch.zeros(4, 4, 2, 8)
        >>> ek, ev = kp.clone(), vp.clone()
        >>> got = fast_paged_rotary_kv_cache_append(q, k, v, kp, vp, tables, lens, cu, cos, sin)
        >>> want = paged_rotary_kv_cache_append(q, k, v, ek, ev, tables, lens, cu, cos, sin)
        >>> torch.allclose(got, want, atol=1e-6) and torch.allclose(kp, ek, atol=1e-6) and torch.equal(vp, ev)
        True
    """
    nb, bs = k_pages.shape[:2]
    lens = cache_seqlens.tolist()
    cu = cu_seqlens.tolist()
    counts = [cu[b + 1] - cu[b] for b in range(len(lens))]
    one = len(lens) == 1 and counts[0] > 0          # one sequence: its positions are one run
    if one and positions is None:                   # the rotation rows are a slice of the tables
        c, s = cos[lens[0]:lens[0] + counts[0]].unsqueeze(1), sin[lens[0]:lens[0] + counts[0]].unsqueeze(1)
    else:
        pos = _host_positions(cache_seqlens, counts, lens) if positions is None else positions.long()
        c, s = cos.index_select(0, pos).unsqueeze(1), sin.index_select(0, pos).unsqueeze(1)   # (T, 1, R/2)
    if not interleaved and 2 * c.shape[-1] == q.shape[-1]:              # rotate-half over all features
        c, s = torch.cat((c, c), dim=-1), torch.cat((-s, s), dim=-1)
        q_out, k_out = rotary_reference._fast_rotate_half(q, c, s), rotary_reference._fast_rotate_half(k, c, s)
    else:
        q_out = rotary_reference._fast_rotate(q, c, s, interleaved)
        k_out = rotary_reference._fast_rotate(k, c, s, interleaved)
    k_flat, v_flat = k_pages.view(nb * bs, *k_pages.shape[2:]), v_pages.view(nb * bs, *v_pages.shape[2:])
    if one and counts[0] == 1:                      # one decode token: one slot
        slot = int(block_tables[0, lens[0] // bs]) * bs + lens[0] % bs
        k_flat[slot].copy_(k_out[0])
        v_flat[slot].copy_(v[0])
    elif k.shape[0]:
        where = _host_positions(cache_seqlens, counts, lens)            # cache positions (T,)
        seq = torch.repeat_interleave(torch.arange(len(lens)), torch.tensor(counts, dtype=torch.long),
                                      output_size=len(where)) if len(where) != len(lens) else torch.arange(len(lens))
        slots = block_tables.long()[seq, torch.div(where, bs, rounding_mode="floor")] * bs + where % bs
        k_flat.index_copy_(0, slots, k_out)
        v_flat.index_copy_(0, slots, v)
    if inplace:
        q.copy_(q_out)
        return q
    return q_out


def fast_paged_attention(q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor, block_tables: torch.Tensor,
                         cache_seqlens: torch.Tensor, cu_seqlens: torch.Tensor, scale: float) -> torch.Tensor:
    """``paged_attention`` for checked CPU indices: per sequence its blocks gathered (one
    ``index_select`` each for k and v, only the blocks its length uses), then SDPA with grouped
    heads over its first ``cache_seqlens[b]`` positions (the careful form where a query sees no key).

    Example:
        >>> import torch
        >>> kp, vp = torch.randn(6, 4, 2, 16), torch.randn(6, 4, 2, 16)
        >>> tables, lens = torch.tensor([[5, 1], [2, 0]]), torch.tensor([6, 3])
        >>> cu, q = torch.tensor([0, 1, 4]), torch.randn(4, 8, 16)
        >>> got = fast_paged_attention(q, kp, vp, tables, lens, cu, 0.25)
        >>> torch.allclose(got, paged_attention(q, kp, vp, tables, lens, cu, 0.25), atol=1e-5)
        True
    """
    nb, bs = k_pages.shape[:2]
    capacity = block_tables.shape[1] * bs
    lens = [min(max(n, 0), capacity) for n in cache_seqlens.tolist()]
    cu = cu_seqlens.tolist()
    single = len(lens) == 1
    out = None if single else torch.empty(q.shape[:2] + v_pages.shape[3:], dtype=q.dtype)
    for b, length in enumerate(lens):
        lo, hi = cu[b], cu[b + 1]
        n = hi - lo
        if n <= 0:
            continue
        if length < n:                   # some query sees no key: zeros there (the careful form)
            got = attend(q[lo:hi], gather_sequence(k_pages, block_tables[b], length),
                         gather_sequence(v_pages, block_tables[b], length), scale)
        else:
            blocks = block_tables[b, :-(-length // bs)].long()
            k = k_pages.index_select(0, blocks).flatten(0, 1)[:length]          # (L, Hkv, D)
            v = v_pages.index_select(0, blocks).flatten(0, 1)[:length]
            got = fast_attention(q[lo:hi].transpose(0, 1)[None], k.transpose(0, 1)[None],
                                 v.transpose(0, 1)[None], n > 1, scale)[0].transpose(0, 1)
        if single:
            return got
        out[lo:hi] = got
    return out if out is not None else torch.zeros(q.shape[:2] + v_pages.shape[3:], dtype=q.dtype)
