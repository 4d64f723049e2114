"""The torch path for rotary_embedding and kv_cache_append: the fallback everywhere and, in
float64, the test oracle.

Rotary embedding rotates pairs of the first R = 2 * cos.shape[1] features of every head by the
angle of the token's position: ``(x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin)``, where the
pairs are ``(i, i + R/2)`` (rotate-half: Llama, Mistral, Qwen, GPT-NeoX) or ``(2i, 2i + 1)``
(interleaved: GPT-J), and features R..D-1 pass through. Computed in float32 (float64 for
float64 inputs), returned in the input's dtype.

A position outside the table ``[0, max_positions)`` gives zeros in the rotated features, as the
GPU kernels do (the public function refuses such positions on CPU tensors before getting here).
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
