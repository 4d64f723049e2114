"""Checks of attention and decode_attention against the float64 oracle, used by ``opforge verify`` and tests."""
from __future__ import annotations

from typing import Any, Sequence

import torch

from ...testing import DTYPES, Case
from . import attention, decode_attention, reference


def random_heads(b: int, h: int, s: int, d: int, dtype: torch.dtype, device: Any, layout: str = "packed",
                 scale: float = 1.0) -> torch.Tensor:
    """Random (B, H, S, D) data (never zeros): ``packed``, or ``bshd`` (a (B, S, H, D) tensor viewed
    through ``.transpose(1, 2)``, read in place), or ``sliced`` (every other element of D: copied)."""
    if layout == "bshd":
        t = torch.randn(b, s, h, d, dtype=dtype, device=device).transpose(1, 2)
    elif layout == "sliced":
        t = torch.randn(b, h, s, 2 * d, dtype=dtype, device=device)[..., ::2]
    else:
        t = torch.randn(b, h, s, d, dtype=dtype, device=device)
    return t.mul_(scale) if scale != 1.0 else t


def prefill_case(b: int, hq: int, hkv: int, sq: int, sk: int, d: int, dtype: torch.dtype, causal: bool,
                 layout: str = "packed", logit_scale: float = 1.0) -> Case:
    """``attention`` on random q (B, Hq, Sq, D), k/v (B, Hkv, Sk, D); ``logit_scale`` multiplies q
    (100 gives logits far past exp's range without the running maximum)."""

    def make(device):
        q = random_heads(b, hq, sq, d, dtype, device, layout, logit_scale)
        return (q, random_heads(b, hkv, sk, d, dtype, device, layout),
                random_heads(b, hkv, sk, d, dtype, device, layout)), {"causal": causal}

    def oracle(args, kwargs):
        q, k, v = (t.double() for t in args)
        return reference.attention(q, k, v, **kwargs)

    label = f"{layout}{' causal' if causal else ''}{f' x{logit_scale:g}' if logit_scale != 1 else ''}"
    return Case("attention", (b, hq, hkv, sq, sk, d), dtype, label, make, attention, oracle)


def decode_case(b: int, hq: int, hkv: int, sq: int, s_max: int, d: int, dtype: torch.dtype,
                lengths: Sequence[int], layout: str = "packed") -> Case:
    """``decode_attention`` on random q and caches with the given per-sequence lengths (int32)."""

    def make(device):
        lens = torch.tensor(list(lengths), dtype=torch.int32, device=device)
        return (random_heads(b, hq, sq, d, dtype, device, layout), random_heads(b, hkv, s_max, d, dtype, device, layout),
                random_heads(b, hkv, s_max, d, dtype, device, layout), lens), {}

    def oracle(args, kwargs):
        q, kc, vc, lens = args
        return reference.decode_attention(q.double(), kc.double(), vc.double(), lens)

    label = f"{layout} lens={','.join(map(str, lengths))}"
    return Case("decode_attention", (b, hq, hkv, sq, s_max, d), dtype, label, make, decode_attention, oracle)


def verify_cases(device_type: str, quick: bool = False) -> list[Case]:
    """Shapes (B, Hq, Hkv, Sq, Sk or S_max, D) that reach every path: GQA, causal with Sq < Sk and
    Sq > Sk (empty rows), padded head dims, transposed views, huge logits, ragged cache lengths."""
    cases: list[Case] = []
    if device_type == "cpu":   # Triton's interpreter: a few small tiles
        prefill = [((1, 2, 1, 17, 33, 64), True), ((2, 4, 1, 33, 17, 80), True), ((1, 2, 2, 3, 70, 128), False)]
        decode = [((2, 8, 2, 1, 70, 64), (70, 1)), ((2, 4, 1, 4, 40, 96), (40, 9))]
    else:
        prefill = [((2, 16, 4, 1024, 1024, 128), True), ((1, 8, 8, 333, 1500, 64), False),
                   ((2, 8, 2, 600, 300, 96), True), ((1, 4, 1, 257, 257, 256), True), ((1, 8, 2, 100, 900, 80), True)]
        decode = [((4, 32, 8, 1, 8192, 128), (8192, 1, 3000, 77)), ((2, 8, 1, 4, 4096, 128), (4096, 17)),
                  ((3, 16, 16, 1, 2000, 64), (1999, 2000, 5))]
    if quick:
        prefill, decode = prefill[:2], decode[:1]
    for dtype in DTYPES:
        cases += [prefill_case(*shape, dtype, causal) for shape, causal in prefill]
        cases += [decode_case(*shape, dtype, lens) for shape, lens in decode]
    shape, _ = prefill[0]
    cases.append(prefill_case(*shape, torch.bfloat16, True, layout="bshd"))
    cases.append(prefill_case(*shape, torch.float32, False, logit_scale=100.0))
    shape, lens = decode[0]
    cases.append(decode_case(*shape, torch.float16, lens, layout="bshd"))
    return cases
