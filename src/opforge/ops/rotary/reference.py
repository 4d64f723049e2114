"""The torch path for rotary_embedding and kv_cache_append: the fallback everywhere and, in
float64, the test oracle.

Rotary embedding rotates pairs of the first R = 2 * cos.shape[1] features of every head by the
angle of the token's position: ``(x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin)``, where the
pairs are ``(i, i + R/2)`` (rotate-half: Llama, Mistral, Qwen, GPT-NeoX) or ``(2i, 2i + 1)``
(interleaved: GPT-J), and features R..D-1 pass through. Computed in float32 (float64 for
float64 inputs), returned in the input's dtype.

A position outside the table ``[0, max_positions)`` gives zeros in the rotated features, as the
GPU kernels do (the public function refuses such positions on CPU tensors before getting here).

The ``fast_*`` forms are the torch path for float32 and half CPU tensors, whose positions and
lengths the public functions have checked on the host: the table rows are indexed directly, the
rotation is computed in float32 (the tables' dtype) and rounded once, and the caches are
written by slice where every sequence has the same length (one indexed write otherwise).
"""
from __future__ import annotations

import torch


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _angles(table: torch.Tensor, positions: torch.Tensor, batch: int, dtype: torch.dtype) -> torch.Tensor:
    """table[positions] as (B, 1, S, R/2); out-of-range positions give zero rows (no OOB read)."""
    pos = positions.long()
    if pos.dim() == 1:
        pos = pos.expand(batch, -1)
    valid = (pos >= 0) & (pos < table.shape[0])
    rows = table.to(dtype)[pos.clamp(0, max(table.shape[0] - 1, 0))]
    return (rows * valid.unsqueeze(-1)).unsqueeze(1)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor,
           interleaved: bool = False) -> torch.Tensor:
    """Rotary embedding of one tensor x (B, H, S, D); returns a new tensor in x's dtype.

    Example:
        >>> import torch
        >>> x = torch.tensor([[[[1.0, 0.0]]]])                  # B=H=S=1, D=2
        >>> cos, sin = torch.tensor([[0.0]]), torch.tensor([[1.0]])  # one position, 90 degrees
        >>> rotate(x, cos, sin, torch.tensor([0])).flatten().tolist()
        [0.0, 1.0]
    """
    dt = _compute_dtype(x)
    half = cos.shape[1]
    r = 2 * half
    c = _angles(cos, positions, x.shape[0], dt)
    s = _angles(sin, positions, x.shape[0], dt)
    xr = x[..., :r].to(dt)
    if interleaved:
        x1, x2 = xr[..., 0::2], xr[..., 1::2]
    else:
        x1, x2 = xr[..., :half], xr[..., half:]
    o1 = x1 * c - x2 * s
    o2 = x2 * c + x1 * s
    rotated = torch.stack((o1, o2), dim=-1).flatten(-2) if interleaved else torch.cat((o1, o2), dim=-1)
    return torch.cat((rotated.to(x.dtype), x[..., r:]), dim=-1)


def rotary_embedding(q, k, cos, sin, positions, interleaved=False, inplace=False):
    """(q_out, k_out); with ``inplace`` the results are copied into q and k, which are returned."""
    q_out = rotate(q, cos, sin, positions, interleaved)
    k_out = rotate(k, cos, sin, positions, interleaved)
    if inplace:
        q.copy_(q_out)
        k.copy_(k_out)
        return q, k
    return q_out, k_out


def kv_cache_append(k_cache, v_cache, k, v, cache_seqlens) -> None:
    """Write k, v (B, H, S_new, D) into the caches at cache_seqlens[b] + s; positions outside
    ``[0, S_max)`` are skipped (the public function raises for them first when it checks).

    Example:
        >>> import torch
        >>> kc, vc = torch.zeros(1, 1, 4, 2), torch.zeros(1, 1, 4, 2)
        >>> kv_cache_append(kc, vc, torch.ones(1, 1, 2, 2), torch.ones(1, 1, 2, 2), torch.tensor([1]))
        >>> kc[0, 0, :, 0].tolist()
        [0.0, 1.0, 1.0, 0.0]
    """
    b, h, s_new, d = k.shape
    s_max = k_cache.shape[2]
    pos = cache_seqlens.long().view(b, 1) + torch.arange(s_new, device=k.device).view(1, s_new)  # (B, S_new)
    valid = (pos >= 0) & (pos < s_max)
    bi, si = valid.nonzero(as_tuple=True)
    pi = pos[bi, si]
    # advanced indices on dims 0 and 2 with a slice between: indexed shape (N, H, D)
    k_cache[bi, :, pi] = k[bi, :, si]
    v_cache[bi, :, pi] = v[bi, :, si]


def rotary_kv_cache_append(q, k, v, k_cache, v_cache, cache_seqlens, cos, sin, positions, interleaved=False,
                           inplace=False):
    """Rotate q and k, write the rotated k and v into the caches; returns the rotated q (q itself
    when ``inplace``). ``positions`` must be given (the public function derives it from
    ``cache_seqlens`` when the caller does not)."""
    q_out = rotate(q, cos, sin, positions, interleaved)
    kv_cache_append(k_cache, v_cache, rotate(k, cos, sin, positions, interleaved), v, cache_seqlens)
    if inplace:
        q.copy_(q_out)
        return q
    return q_out


def _fast_rotate_half(x: torch.Tensor, cos2: torch.Tensor, sin2: torch.Tensor) -> torch.Tensor:
    """Rotate-half over all D features in three ops: ``x * [c, c] + [x2, x1] * [-s, s]``, the
    same products and sums as ``rotate`` (a negation is exact)."""
    half = x.shape[-1] // 2
    swapped = torch.cat((x[..., half:], x[..., :half]), dim=-1)
    return torch.addcmul(x * cos2, swapped, sin2).to(x.dtype)


def _fast_rotate(x: torch.Tensor, cos_rows: torch.Tensor, sin_rows: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """x (B, H, S, D) rotated by the angles' rows (B, 1, S, R/2), float32 math, x's dtype out."""
    half = cos_rows.shape[-1]
    r = 2 * half
    xr = x[..., :r]
    if interleaved:
        x1, x2 = xr[..., 0::2], xr[..., 1::2]
    else:
        x1, x2 = xr[..., :half], xr[..., half:]
    o1 = x1 * cos_rows - x2 * sin_rows
    o2 = x2 * cos_rows + x1 * sin_rows
    if interleaved:
        rotated = torch.stack((o1, o2), dim=-1).flatten(-2)
    else:
        rotated = torch.cat((o1, o2), dim=-1)
    if r == x.shape[-1]:
        return rotated.to(x.dtype)
    return torch.cat((rotated.to(x.dtype), x[..., r:]), dim=-1)


def _rows(table: torch.Tensor, positions: torch.Tensor, batch: int) -> torch.Tensor:
    """table[positions] as (B, 1, S, R/2) for checked positions (B, S) or (S,) (int32 or int64)."""
    rows = table.index_select(0, positions.reshape(-1)).view(positions.shape + table.shape[1:])
    if rows.dim() == 2:
        rows = rows.expand(batch, -1, -1)
    return rows.unsqueeze(1)


def fast_rotary_embedding(q, k, cos, sin, positions, interleaved=False, inplace=False):
    """``rotary_embedding`` for positions known to lie in the tables.

    Example:
        >>> import torch
        >>> q, k = torch.randn(1, 4, 3, 8), torch.randn(1, 2, 3, 8)
        >>> cos, sin, pos = torch.rand(16, 4), torch.rand(16, 4), torch.tensor([2, 3, 9])
        >>> all(torch.allclose(a, b, atol=1e-6) for a, b in zip(fast_rotary_embedding(q, k, cos, sin, pos),
        ...                                             rotary_embedding(q, k, cos, sin, pos)))
        True
    """
    c, s = _rows(cos, positions, q.shape[0]), _rows(sin, positions, q.shape[0])
    q_out, k_out = _fast_rotate(q, c, s, interleaved), _fast_rotate(k, c, s, interleaved)
    if inplace:
        q.copy_(q_out)
        k.copy_(k_out)
        return q, k
    return q_out, k_out


def fast_kv_cache_append(k_cache, v_cache, k, v, cache_seqlens, lengths=None) -> None:
    """``kv_cache_append`` for lengths (a CPU tensor; ``lengths``: its values when already read)
    whose new positions fit the caches.

    Example:
        >>> import torch
        >>> kc, vc = torch.zeros(2, 1, 4, 2), torch.zeros(2, 1, 4, 2)
        >>> fast_kv_cache_append(kc, vc, torch.ones(2, 1, 1, 2), torch.ones(2, 1, 1, 2), torch.tensor([1, 3]))
        >>> kc[:, 0, :, 0].tolist()
        [[0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0]]
    """
    if lengths is None:
        lengths = cache_seqlens.tolist()
    if not lengths:
        return
    s_new = k.shape[2]
    start = lengths[0]
    if all(n == start for n in lengths):
        k_cache[:, :, start:start + s_new].copy_(k)
        v_cache[:, :, start:start + s_new].copy_(v)
        return
    b = k.shape[0]
    pos = cache_seqlens.long().view(b, 1) + torch.arange(s_new).view(1, s_new)     # (B, S_new)
    rows = torch.arange(b).view(b, 1).expand(b, s_new)
    # advanced indices on dims 0 and 2 with a slice between: indexed shape (B, S_new, H, D)
    k_cache[rows, :, pos] = k.transpose(1, 2)
    v_cache[rows, :, pos] = v.transpose(1, 2)


def fast_rotary_kv_cache_append(q, k, v, k_cache, v_cache, cache_seqlens, cos, sin, positions=None,
                                interleaved=False, inplace=False):
    """``rotary_kv_cache_append`` for checked positions and lengths (CPU tensors); ``positions``
    None means ``cache_seqlens[b] + s``.

    Example:
        >>> import torch
        >>> q, k, v = torch.randn(1, 4, 1, 8), torch.randn(1, 2, 1, 8), torch.randn(1, 2, 1, 8)
        >>> kc, vc = torch.zeros(1, 2, 6, 8), torch.zeros(1, 2, 6, 8)
        >>> cos, sin, lens = torch.rand(16, 4), torch.rand(16, 4), torch.tensor([3])
        >>> q2 = fast_rotary_kv_cache_append(q, k, v, kc, vc, lens, cos, sin)
        >>> torch.allclose(q2, rotate(q, cos, sin, lens.view(1, 1)), atol=1e-6) and torch.equal(vc[:, :, 3:4], v)
        True
    """
    lengths = cache_seqlens.tolist()
    if positions is None and lengths and all(n == lengths[0] for n in lengths):
        # one length for the batch (decode of one sequence): the rows are a slice of the tables,
        # (S, R/2), broadcast over batch and heads
        c, s = cos[lengths[0]:lengths[0] + q.shape[2]], sin[lengths[0]:lengths[0] + q.shape[2]]
    else:
        if positions is None:
            positions = cache_seqlens.view(-1, 1) + torch.arange(q.shape[2], dtype=cache_seqlens.dtype).view(1, -1)
        c, s = _rows(cos, positions, q.shape[0]), _rows(sin, positions, q.shape[0])
    if not interleaved and 2 * c.shape[-1] == q.shape[-1]:   # Llama & co: both tensors in 3 ops each
        c, s = torch.cat((c, c), dim=-1), torch.cat((-s, s), dim=-1)
        q_out, k_out = _fast_rotate_half(q, c, s), _fast_rotate_half(k, c, s)
    else:
        q_out, k_out = _fast_rotate(q, c, s, interleaved), _fast_rotate(k, c, s, interleaved)
    fast_kv_cache_append(k_cache, v_cache, k_out, v, cache_seqlens, lengths)
    if inplace:
        q.copy_(q_out)
        return q
    return q_out
