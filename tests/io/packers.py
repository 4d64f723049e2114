"""Test-side writers of GPTQ and AWQ tensors, built from the formats' descriptions (a word of
32 bits holds 32 // bits codes, slot i at bits [bits*i, bits*i + bits)), independent of opforge's
unpacker."""
from __future__ import annotations

import torch

AWQ_SLOT_COLUMNS = (0, 2, 4, 6, 1, 3, 5, 7)  # AWQ: slot i of a word holds column AWQ_SLOT_COLUMNS[i]


def _to_int32(words: torch.Tensor) -> torch.Tensor:
    """Unsigned 32-bit values held in int64 -> the int32 with the same bits."""
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def pack_rows(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """(R, C) codes -> (R * bits / 32, C) words; code of row r in word r // per, slot r % per."""
    per = 32 // bits
    rows, cols = codes.shape
    words = torch.zeros(rows // per, cols, dtype=torch.int64)
    for r in range(rows):
        words[r // per] |= codes[r].to(torch.int64) << (bits * (r % per))
    return _to_int32(words)


def pack_cols(codes: torch.Tensor, bits: int, slot_columns=None) -> torch.Tensor:
    """(R, C) codes -> (R, C * bits / 32) words; slot i of word w holds column
    w * per + slot_columns[i] (slot_columns None: column w * per + i)."""
    per = 32 // bits
    rows, cols = codes.shape
    slot_columns = slot_columns or tuple(range(per))
    words = torch.zeros(rows, cols // per, dtype=torch.int64)
    for w in range(cols // per):
        for slot in range(per):
            words[:, w] |= codes[:, w * per + slot_columns[slot]].to(torch.int64) << (bits * slot)
    return _to_int32(words)


def gptq_tensors(codes_nk: torch.Tensor, zeros_ng: torch.Tensor, scales_ng: torch.Tensor, bits: int,
                 v1: bool = True, g_idx: bool = True) -> dict:
    """GPTQ tensors for the weight (code - zero) * scale of (N, K) codes and (N, G) zeros/scales.
    v1 stores zero - 1 (all zeros must then be >= 1)."""
    n, k = codes_nk.shape
    groups = scales_ng.shape[1]
    stored = zeros_ng - 1 if v1 else zeros_ng
    assert stored.min() >= 0
    d = {"qweight": pack_rows(codes_nk.t().contiguous(), bits),
         "qzeros": pack_cols(stored.t().contiguous(), bits),
         "scales": scales_ng.t().contiguous()}
    if g_idx:
        d["g_idx"] = (torch.arange(k) // (k // groups)).to(torch.int32)
    return d


def awq_tensors(codes_nk: torch.Tensor, zeros_ng: torch.Tensor, scales_ng: torch.Tensor) -> dict:
    """AWQ (GEMM layout, 4-bit) tensors for (N, K) codes and (N, G) zeros/scales."""
    return {"qweight": pack_cols(codes_nk.t().contiguous(), 4, AWQ_SLOT_COLUMNS),
            "qzeros": pack_cols(zeros_ng.t().contiguous(), 4, AWQ_SLOT_COLUMNS),
            "scales": scales_ng.t().contiguous()}
