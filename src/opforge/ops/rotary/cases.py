"""Checks of rotary_embedding and kv_cache_append against the float64 oracle, used by ``opforge verify`` and tests."""
from __future__ import annotations

from typing import Any

import torch

from ...testing import DTYPES, Case
from ..attention.cases import random_heads
from . import kv_cache_append, reference, rotary_embedding


def rope_tables(max_positions: int, rotary_dim: int, device: Any, base: float = 10000.0) -> tuple:
    """float32 (cos, sin) tables of shape (max_positions, rotary_dim / 2), with the usual frequencies."""
    inv = base ** (-torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)
    angles = torch.arange(max_positions, dtype=torch.float64)[:, None] * inv[None, :]
    return angles.cos().float().to(device), angles.sin().float().to(device)


def _heads(b: int, h: int, s: int, d: int, dtype: torch.dtype, device: Any, layout: str) -> torch.Tensor:
    """A random (B, H, S, D) tensor: packed, or (``transposed``) a (B, S, H, D) buffer viewed as one."""
    return random_heads(b, h, s, d, dtype, device, "bshd" if layout == "transposed" else "packed")


def make_rotary_inputs(b: int, hq: int, hkv: int, s: int, d: int, r: int, dtype: torch.dtype, device: Any,
                       layout: str = "packed", positions: str = "2d", max_positions: int = 64) -> tuple:
    """Random q, k (packed, or ``transposed``: (B, S, H, D) buffers viewed as (B, H, S, D)), tables, positions."""
    q = _heads(b, hq, s, d, dtype, device, layout)
    k = _heads(b, hkv, s, d, dtype, device, layout)
    cos, sin = rope_tables(max_positions, r, device)
    shape = (b, s) if positions == "2d" else (s,)
    pos = torch.randint(0, max_positions, shape, device=device, dtype=torch.int64 if positions == "2d" else torch.int32)
    return q, k, cos, sin, pos


def rotary_oracle(args: tuple, kwargs: dict) -> tuple:
    q, k, cos, sin, pos = args
    inter = kwargs.get("interleaved", False)
    return (reference.rotate(q.double(), cos.double(), sin.double(), pos, inter),
            reference.rotate(k.double(), cos.double(), sin.double(), pos, inter))


def make_rotary_case(shape: tuple, dtype: torch.dtype, r: int = 0, interleaved: bool = False,
                     layout: str = "packed", positions: str = "2d") -> Case:
    """A rotary_embedding Case; ``shape`` is (B, Hq, Hkv, S, D); ``r`` = 0 means R = D."""
    b, hq, hkv, s, d = shape
    r = r or d

    def make(device):
        return make_rotary_inputs(b, hq, hkv, s, d, r, dtype, device, layout, positions), \
            ({"interleaved": True} if interleaved else {})

    label = " ".join(filter(None, [layout if layout != "packed" else "", f"R={r}" if r != d else "",
                                   "interleaved" if interleaved else "", "pos(S,)" if positions != "2d" else ""]))
    return Case("rotary_embedding", shape, dtype, label or "packed", make, rotary_embedding, rotary_oracle)


def _append_call(k_cache, v_cache, k, v, seqlens, k_cache0, v_cache0):
    kv_cache_append(k_cache, v_cache, k, v, seqlens)
    return k_cache, v_cache


def _append_oracle(args: tuple, kwargs: dict) -> tuple:
    _, _, k, v, seqlens, k0, v0 = args
    kc, vc = k0.double(), v0.double()
    reference.kv_cache_append(kc, vc, k.double(), v.double(), seqlens)
    return kc, vc


def make_append_case(shape: tuple, dtype: torch.dtype, layout: str = "packed") -> Case:
    """A kv_cache_append Case; ``shape`` is (B, H, S_new, S_max, D). The last sequence ends exactly at S_max.

    The call's arguments carry copies of the caches before the call (ignored by the call) so the
    oracle can rebuild the expected caches."""
    b, h, s_new, s_max, d = shape

    def make(device):
        kc = _heads(b, h, s_max, d, dtype, device, layout)
        k = _heads(b, h, s_new, d, dtype, device, layout)
        vc = torch.randn(b, h, s_max, d, dtype=dtype, device=device)
        v = torch.randn(b, h, s_new, d, dtype=dtype, device=device)
        lens = torch.randint(0, s_max - s_new + 1, (b,), dtype=torch.int32)
        lens[-1] = s_max - s_new
        return (kc, vc, k, v, lens.to(device), kc.clone(), vc.clone()), {}

    return Case("kv_cache_append", shape, dtype, layout, make, _append_call, _append_oracle)


def verify_cases(device_type: str, quick: bool = False) -> list[Case]:
    """Decode and prefill shapes, both conventions, partial rotary, transposed views, both position shapes."""
    if device_type == "cpu":
        rot = [(2, 4, 2, 3, 16), (1, 3, 1, 5, 64)]
        app = [(2, 2, 1, 8, 16), (1, 3, 4, 9, 64)]
    else:
        rot = [(64, 32, 8, 1, 128), (1, 32, 8, 4096, 128), (4, 12, 12, 100, 64)]
        app = [(64, 8, 1, 4096, 128), (1, 8, 4096, 8192, 128)]
    if quick:
        rot, app = rot[:1], app[:1]
    cases = [make_rotary_case(s, dt) for s in rot for dt in DTYPES]
    cases += [make_rotary_case(rot[0], torch.float16, interleaved=True),
              make_rotary_case(rot[0], torch.bfloat16, r=rot[0][-1] // 2, layout="transposed"),
              make_rotary_case(rot[0], torch.float32, r=rot[0][-1] // 4, interleaved=True, positions="1d")]
    cases += [make_append_case(s, dt) for s in app for dt in DTYPES]
    cases.append(make_append_case(app[0], torch.float16, layout="transposed"))
    return cases + fused_verify_cases(device_type, quick)


def _fused_call(q, k, v, k_cache, v_cache, seqlens, cos, sin, k_cache0, v_cache0, **kwargs):
    from . import rotary_kv_cache_append
    q_rot = rotary_kv_cache_append(q, k, v, k_cache, v_cache, seqlens, cos, sin, **kwargs)
    return q_rot, k_cache, v_cache


def _fused_oracle(args: tuple, kwargs: dict) -> tuple:
    q, k, v, _, _, seqlens, cos, sin, k0, v0 = args
    pos = kwargs.get("positions")
    if pos is None:
        pos = seqlens.long().view(-1, 1) + torch.arange(q.shape[2], device=q.device).view(1, -1)
    kc, vc = k0.double(), v0.double()
    q_rot = reference.rotary_kv_cache_append(q.double(), k.double(), v.double(), kc, vc, seqlens, cos.double(),
                                             sin.double(), pos, kwargs.get("interleaved", False))
    return q_rot, kc, vc


def make_fused_case(shape: tuple, dtype: torch.dtype, r: int = 0, interleaved: bool = False,
                    layout: str = "packed", positions: bool = False) -> Case:
    """A rotary_kv_cache_append Case; ``shape`` is (B, Hq, Hkv, S, S_max, D). The last sequence ends at S_max.

    ``positions``: pass explicit positions (else they come from the cache lengths)."""
    b, hq, hkv, s, s_max, d = shape
    r = r or d

    def make(device):
        q, k, cos, sin, pos = make_rotary_inputs(b, hq, hkv, s, d, r, dtype, device, layout, "2d",
                                                 max_positions=s_max + 8)
        v = torch.randn(b, hkv, s, d, dtype=dtype, device=device)
        kc = torch.randn(b, hkv, s_max, d, dtype=dtype, device=device)
        vc = _heads(b, hkv, s_max, d, dtype, device, layout)
        lens = torch.randint(0, s_max - s + 1, (b,), dtype=torch.int32)
        lens[-1] = s_max - s
        kwargs = {"interleaved": True} if interleaved else {}
        if positions:
            kwargs["positions"] = pos
        return (q, k, v, kc, vc, lens.to(device), cos, sin, kc.clone(), vc.clone()), kwargs

    label = " ".join(filter(None, [layout if layout != "packed" else "", f"R={r}" if r != d else "",
                                   "interleaved" if interleaved else "", "positions" if positions else ""]))
    return Case("rotary_kv_cache_append", shape, dtype, label or "packed", make, _fused_call, _fused_oracle)


def fused_verify_cases(device_type: str, quick: bool = False) -> list[Case]:
    shapes = [(2, 4, 2, 1, 8, 16), (1, 3, 1, 4, 9, 32)] if device_type == "cpu" else \
        [(64, 32, 8, 1, 4096, 128), (1, 32, 8, 1024, 4096, 128)]
    if quick:
        shapes = shapes[:1]
    return [make_fused_case(s, dt) for s in shapes for dt in DTYPES] + \
        [make_fused_case(shapes[0], torch.bfloat16, r=shapes[0][-1] // 2, interleaved=True, layout="transposed",
                         positions=True)]
