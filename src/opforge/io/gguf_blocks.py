"""ggml's quantized block formats as opforge ``QuantizedWeight`` parts, without requantizing.

Every format here stores, per group of 16 or 32 consecutive elements of a row, small integer
codes and a float scale (and a minimum or an offset), so each element is ``scale * code + offset``
with a per-group scale and offset. opforge's weight is ``(code - zero) * scale``: the same with
``zero = -offset / scale``, a non-integer zero point where the format has a minimum (Q4_1, Q5_1,
Q4_K, Q5_K); the kernels take zeros as float32 numbers, so nothing is rounded to a grid.

========  =====================================  =====================================
format    ggml element                           opforge weight (codes, group, scales)
========  =====================================  =====================================
Q8_0      d * q, q int8                          int8 g32, code q+128, symmetric, fp16
Q4_0      d * (q - 8), q 0..15                   int4 g32, symmetric, fp16
Q4_1      d * q + m                              int4 g32, zero -m/d, float32
Q5_0      d * (q - 16), q 0..31                  int8 g32, zero 16, float32
Q5_1      d * q + m, q 0..31                     int8 g32, zero -m/d, float32
Q4_K      d*sc * q - dmin*mn  (8 x 32 per 256)   int4 g32, zero dmin*mn/(d*sc), float32
Q5_K      as Q4_K with 5-bit q                   int8 g32, as Q4_K
Q6_K      d*sc * (q - 32)  (16 x 16 per 256)     int8 g16, zero 32, float32
========  =====================================  =====================================

Q8_0 and Q4_0 are bit-exact. Where the zero is a quotient (``-m/d``) it is rounded to float32,
so ``(code - zero) * scale`` differs from ggml's ``d*q + m`` by a few float32 ulps of the group's
values (measured on SmolLM2-135M's Q4_1 weights: below 3e-7 of the weight's largest magnitude).
A group whose scale is 0 (all its elements equal the offset) becomes code 0 with zero -1 and the
offset as its scale, which is exact too.

Example:
    >>> import torch
    >>> from opforge.io.gguf_blocks import decode_blocks
    >>> block = torch.zeros(1, 18, dtype=torch.uint8)      # one Q4_0 block: d = 1.0, every q = 9
    >>> block[0, :2] = torch.tensor([1.0], dtype=torch.float16).view(torch.uint8)
    >>> block[0, 2:] = 0x99
    >>> codes, scales, zeros, bits, group = decode_blocks("Q4_0", block, 32)
    >>> (codes[0, :3].tolist(), scales.tolist(), zeros, bits, group)
    ([9, 9, 9], [[1.0]], None, 4, 32)
"""
from __future__ import annotations

from typing import Callable, Optional

import torch

#: ggml's (elements per block, bytes per block) of the formats decoded here.
BLOCKS = {"Q8_0": (32, 34), "Q4_0": (32, 18), "Q4_1": (32, 20), "Q5_0": (32, 22), "Q5_1": (32, 24),
          "Q4_K": (256, 144), "Q5_K": (256, 176), "Q6_K": (256, 210)}

Parts = tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor], int, int]


def _f16(raw: torch.Tensor) -> torch.Tensor:
    """(..., 2) uint8 -> (...) float32 of the little-endian float16 they hold."""
    return raw.contiguous().view(torch.float16).squeeze(-1).to(torch.float32)


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """(..., B) bytes -> (..., 2B) codes: the B low nibbles, then the B high nibbles."""
    return torch.cat([qs & 0xF, qs >> 4], dim=-1)


def _bits_of(word_bytes: torch.Tensor, count: int) -> torch.Tensor:
    """(..., count/8) bytes -> (..., count) bits, little-endian: bit i of byte j is element 8j+i."""
    shifts = torch.arange(8, dtype=torch.uint8)
    return ((word_bytes.unsqueeze(-1) >> shifts) & 1).flatten(-2)[..., :count]


def _affine(codes: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Groups ``scale * code + offset`` (codes (N, G, group), scale and offset (N, G) float32) as
    ``(code - zero) * scale``; a group with scale 0 is constant: code 0, zero -1, scale = offset."""
    flat = scale == 0
    if not bool(flat.any()):
        return codes, scale, -offset / scale
    zero = torch.where(flat, torch.full_like(scale, -1.0), -offset / torch.where(flat, torch.ones_like(scale), scale))
    codes = codes.masked_fill(flat.unsqueeze(-1), 0)
    return codes, torch.where(flat, offset, scale), zero


def _q8_0(b: torch.Tensor) -> Parts:
    d = b[..., 0:2].contiguous().view(torch.float16).squeeze(-1)
    q = b[..., 2:] ^ 0x80                  # int8 q -> q + 128 as a byte
    return q, d, None, 8, 32


def _q4_0(b: torch.Tensor) -> Parts:
    d = b[..., 0:2].contiguous().view(torch.float16).squeeze(-1)
    return _nibbles(b[..., 2:]), d, None, 4, 32


def _q4_1(b: torch.Tensor) -> Parts:
    codes, scale, zero = _affine(_nibbles(b[..., 4:]), _f16(b[..., 0:2]), _f16(b[..., 2:4]))
    return codes, scale, zero, 4, 32


def _q5_low_high(qh: torch.Tensor, qs: torch.Tensor) -> torch.Tensor:
    return _nibbles(qs) | (_bits_of(qh, 32) << 4)


def _q5_0(b: torch.Tensor) -> Parts:
    codes = _q5_low_high(b[..., 2:6], b[..., 6:])
    d = _f16(b[..., 0:2])
    return codes, d, torch.full_like(d, 16.0), 8, 32


def _q5_1(b: torch.Tensor) -> Parts:
    codes, scale, zero = _affine(_q5_low_high(b[..., 4:8], b[..., 8:]), _f16(b[..., 0:2]), _f16(b[..., 2:4]))
    return codes, scale, zero, 8, 32


def _k_scales(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The 12 bytes of Q4_K/Q5_K sub-block scales -> (..., 8) scales and (..., 8) minimums, 6 bits
    each: sub-blocks 0..3 in the low 6 bits of bytes 0..3 (scales) and 4..7 (minimums);
    sub-blocks 4..7 as a low nibble in bytes 8..11 (scale: low, minimum: high) with the top 2 bits
    of bytes 0..3 (scales) and 4..7 (minimums) on top."""
    p = packed
    lo_sc, lo_mn = p[..., 0:4] & 63, p[..., 4:8] & 63
    hi_sc = (p[..., 8:12] & 0xF) | ((p[..., 0:4] >> 6) << 4)
    hi_mn = (p[..., 8:12] >> 4) | ((p[..., 4:8] >> 6) << 4)
    return torch.cat([lo_sc, hi_sc], dim=-1), torch.cat([lo_mn, hi_mn], dim=-1)


def _k_groups(b: torch.Tensor, codes: torch.Tensor, bits: int) -> Parts:
    """Q4_K/Q5_K: codes (N, S, 256) -> groups of 32 with scale d*sc and offset -dmin*mn."""
    d, dmin = _f16(b[..., 0:2]), _f16(b[..., 2:4])
    sc, mn = _k_scales(b[..., 4:16])
    n, s = codes.shape[:2]
    codes, scale, zero = _affine(codes.view(n, s * 8, 32), (d.unsqueeze(-1) * sc).view(n, s * 8),
                                 (-dmin.unsqueeze(-1) * mn).view(n, s * 8))
    return codes.view(n, s, 256), scale, zero, bits, 32


def _k_low_nibbles(qs: torch.Tensor) -> torch.Tensor:
    """128 bytes -> 256 4-bit codes: each 32-byte chunk gives 32 low nibbles, then 32 high ones."""
    chunks = qs.unflatten(-1, (4, 32))
    return torch.cat([chunks & 0xF, chunks >> 4], dim=-1).flatten(-2)


def _q4_k(b: torch.Tensor) -> Parts:
    return _k_groups(b, _k_low_nibbles(b[..., 16:144]), 4)


def _q5_k(b: torch.Tensor) -> Parts:
    low = _k_low_nibbles(b[..., 48:176])
    # bit 2c of byte l of qh is element l of sub-block 2c; bit 2c+1 is element l of sub-block 2c+1
    qh = b[..., 16:48]
    high = torch.stack([(qh >> j) & 1 for j in range(8)], dim=-2).flatten(-2)   # sub-block j, element l
    return _k_groups(b, low | (high << 4), 8)


def _q6_k(b: torch.Tensor) -> Parts:
    ql, qh = b[..., 0:128], b[..., 128:192]
    sc = b[..., 192:208].contiguous().view(torch.int8).to(torch.float32)
    d = _f16(b[..., 208:210])
    halves = []
    for h in range(2):            # 128 elements per half: 64 bytes of ql, 32 of qh
        lo, hi = ql[..., 64 * h:64 * h + 32], ql[..., 64 * h + 32:64 * h + 64]
        top = qh[..., 32 * h:32 * h + 32]
        halves += [(lo & 0xF) | ((top & 3) << 4), (hi & 0xF) | (((top >> 2) & 3) << 4),
                   (lo >> 4) | (((top >> 4) & 3) << 4), (hi >> 4) | (((top >> 6) & 3) << 4)]
    codes = torch.cat(halves, dim=-1)                   # (N, S, 256), codes 0..63
    n, s = codes.shape[:2]
    scale = (d.unsqueeze(-1) * sc).view(n, s * 16)
    codes, scale, zero = _affine(codes.view(n, s * 16, 16), scale, -32.0 * scale)
    return codes.view(n, s, 256), scale, zero, 8, 16


_DECODERS: dict[str, Callable[[torch.Tensor], Parts]] = {
    "Q8_0": _q8_0, "Q4_0": _q4_0, "Q4_1": _q4_1, "Q5_0": _q5_0, "Q5_1": _q5_1,
    "Q4_K": _q4_k, "Q5_K": _q5_k, "Q6_K": _q6_k}


def decode_blocks(kind: str, raw: torch.Tensor, k: int) -> Parts:
    """A (N, bytes per row) uint8 tensor of ``kind`` blocks -> ``(codes (N, K) uint8, scales (N, G),
    zeros (N, G) or None, bits, group)`` for ``QuantizedWeight.from_codes``.

    Example:
        >>> raw = torch.zeros(2, 34, dtype=torch.uint8)        # Q8_0, d = 0, every q = 0
        >>> codes, scales, zeros, bits, group = decode_blocks("Q8_0", raw, 32)
        >>> codes.shape, int(codes[0, 0]), bits, group
        (torch.Size([2, 32]), 128, 8, 32)
    """
    per_block, nbytes = BLOCKS[kind]
    n = raw.shape[0]
    blocks = raw.reshape(n, k // per_block, nbytes)
    codes, scales, zeros, bits, group = _DECODERS[kind](blocks)
    zeros = None if zeros is None else zeros.reshape(n, k // group)
    return codes.reshape(n, k), scales.reshape(n, k // group), zeros, bits, group
