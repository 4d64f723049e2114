"""The torch path for apply_delay / revert_delay: the fallback everywhere and the test oracle.

Both are one gather along time: ``out[b, t, c] = codes[b, t - s * d_c, c]`` with ``s = 1`` to
apply the delay pattern and ``s = -1`` to revert it; a source time below 0 gives ``fill_before``
(the BOS id when applying) and one at or past T gives ``fill_after`` (the pad id).
"""
from __future__ import annotations

from typing import Optional

import torch


def shift(codes: torch.Tensor, delays: torch.Tensor, sign: int, fill_before: int, fill_after: int,
          out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``out[b, t, c] = codes[b, t - sign * delays[c], c]``, filled outside ``[0, T)``.

    Example:
        >>> import torch
        >>> codes = torch.arange(4).view(1, 4, 1)
        >>> shift(codes, torch.tensor([1]), 1, -1, -2).flatten().tolist()
        [-1, 0, 1, 2]
    """
    b, t, c = codes.shape
    src = torch.arange(t, device=codes.device).view(t, 1) - sign * delays.to(codes.device, torch.int64).view(1, c)
    idx = src.clamp(0, max(t - 1, 0)).unsqueeze(0).expand(b, t, c)
    gathered = torch.gather(codes, 1, idx)
    result = torch.where(src < 0, fill_before, torch.where(src >= t, fill_after, gathered)).to(codes.dtype)
    if out is None:
        return result
    out.copy_(result)
    return out


def apply_delay(codes, delays, bos_id, pad_id, out=None):
    """Apply the delay pattern: codebook c is shifted later by delays[c], BOS in front."""
    return shift(codes, delays, 1, bos_id, pad_id, out)


def revert_delay(codes, delays, pad_id, out=None):
    """Undo apply_delay: codebook c is shifted earlier by delays[c], pad at the end."""
    return shift(codes, delays, -1, pad_id, pad_id, out)
