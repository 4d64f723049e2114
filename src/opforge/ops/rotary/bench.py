"""``rotary_embedding`` as a benchmark op, and the ``rope`` suite.

An entry's shape is ``(B, Hq, Hkv, S, D)``: q is (B, Hq, S, D), k (B, Hkv, S, D), standard
normal; the cos/sin tables (float32, S x D/2) hold the angles of positions 0..S-1 at rope base
10000; the rotation is rotate-half over all of D. Bytes that must move, with ``s`` bytes per
element: read q and k, write both, ``2*B*(Hq+Hkv)*S*D*s``, plus the table rows and positions.

Suite (``opforge bench --suite rope``): prefill (1, 32, 8, 4096, 128) and decode
(64, 32, 8, 1, 128) in bf16 against the torch composite and torch.compile; >= 90% of copy.

Suite ``kv_append`` (``opforge bench --suite kv_append``): writing new tokens into a contiguous
KV cache, every sequence filled up to ``S_max - S`` so that the new tokens end the cache.

* ``kv_cache_append``: shape ``(B, Hkv, S, S_max, D)``; k and v (B, Hkv, S, D) written into
  caches (B, Hkv, S_max, D). Bytes: k and v read, their slots written, the lengths read.
  Peer: one advanced-index assignment per cache (no host sync).
* ``rotary_kv_cache_append``: shape ``(B, Hq, Hkv, S, S_max, D)``; q and k rotated at their
  cache positions, the rotated k and v written. Bytes: q read and written, k and v read and
  written once (the rotated k never goes through memory), the table rows. Peer: the torch
  rotary composite, then the index assignment.

Both return what they wrote (the rotated q, then the new slots of each cache, as views), which is
what the float64 oracle is compared with. Targets: >= 90% of copy (bf16) at decode
(64 sequences x 1 token) and prefill (1 x 4096 tokens), the shapes the rotary suite uses.

Example:
    >>> import torch
    >>> q, k, cos, sin, pos = _inputs((1, 2, 1, 3, 8), torch.float32, torch.device("cpu"), torch.Generator())
    >>> [tuple(t.shape) for t in (q, k, cos, sin, pos)]
    [(1, 2, 3, 8), (1, 1, 3, 8), (3, 4), (3, 4), (3,)]
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from opforge.bench.impls import compiled_impl, eager_impl, opforge_impl
from opforge.bench.pointwise import normal
from opforge.bench.spec import COMPILE, OPFORGE, TORCH, BuildContext, Inputs, OpSpec, Shape, Suite, SuiteEntry, \
    register_op, register_suite
from opforge.bench.targets import bandwidth_at_least

ROPE_BASE = 10000.0
PREFILL_SHAPE = (1, 32, 8, 4096, 128)
DECODE_SHAPE = (64, 32, 8, 1, 128)


def _inputs(shape: Shape, dtype: torch.dtype, device: torch.device, g: torch.Generator) -> Inputs:
    b, hq, hkv, s, d = shape
    q = normal((b, hq, s, d), dtype, device, g)
    k = normal((b, hkv, s, d), dtype, device, g)
    inv_freq = ROPE_BASE ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angles = torch.arange(s, dtype=torch.float64)[:, None] * inv_freq[None, :]
    cos, sin = angles.cos().float().to(device), angles.sin().float().to(device)
    return q, k, cos, sin, torch.arange(s, device=device)


def _bytes(shape: Shape, dtype: torch.dtype) -> int:
    b, hq, hkv, s, d = shape
    return 2 * b * (hq + hkv) * s * d * dtype.itemsize + 2 * s * (d // 2) * 4 + s * 8


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def ref_rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
               positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 oracle: rotate-half by the angles of each token's position."""
    c, s = cos[positions], sin[positions]
    return _rotate(q, c, s), _rotate(k, c, s)


def torch_rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                 positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The torch composite a model runs: tables gathered, doubled and cast to q's dtype."""
    c = torch.cat((cos[positions], cos[positions]), dim=-1).to(q.dtype)
    s = torch.cat((sin[positions], sin[positions]), dim=-1).to(q.dtype)

    def rotate_half(x: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return q * c + rotate_half(q) * s, k * c + rotate_half(k) * s


ROTARY = register_op(OpSpec(
    name="rotary_embedding",
    make_inputs=_inputs,
    reference=ref_rotary,
    bytes_moved=_bytes,
    impls={OPFORGE: opforge_impl("rotary_embedding"), TORCH: eager_impl(torch_rotary),
           COMPILE: compiled_impl(torch_rotary)},
))

def tables(positions: int, d: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 cos and sin (positions, d/2) of rope base 10000.

    Example:
        >>> [tuple(t.shape) for t in tables(5, 8, torch.device("cpu"))]
        [(5, 4), (5, 4)]
    """
    inv_freq = ROPE_BASE ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angles = torch.arange(positions, dtype=torch.float64)[:, None] * inv_freq[None, :]
    return angles.cos().float().to(device), angles.sin().float().to(device)


def _append_inputs(shape: Shape, dtype: torch.dtype, device: torch.device, g: torch.Generator) -> Inputs:
    b, hkv, s, s_max, d = shape
    lens = torch.full((b,), s_max - s, dtype=torch.int32, device=device)
    return (normal((b, hkv, s_max, d), dtype, device, g), normal((b, hkv, s_max, d), dtype, device, g),
            normal((b, hkv, s, d), dtype, device, g), normal((b, hkv, s, d), dtype, device, g), lens)


def _append_bytes(shape: Shape, dtype: torch.dtype) -> int:
    b, hkv, s, s_max, d = shape
    return 4 * b * hkv * s * d * dtype.itemsize + b * 4


def _new_slots(k_cache: torch.Tensor, v_cache: torch.Tensor, s: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The last ``s`` positions of each cache (where the inputs put the new tokens), as views."""
    return k_cache[:, :, -s:], v_cache[:, :, -s:]


def index_append(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 lens: torch.Tensor) -> None:
    """The torch composite: rows ``(b, lens[b] + s)`` of both caches assigned by advanced indexing."""
    b, _, s, _ = k.shape
    pos = lens.long().view(b, 1) + torch.arange(s, device=k.device).view(1, s)
    rows = torch.arange(b, device=k.device).view(b, 1)
    k_cache[rows, :, pos] = k.permute(0, 2, 1, 3)
    v_cache[rows, :, pos] = v.permute(0, 2, 1, 3)


def _ref_append(k_cache, v_cache, k, v, lens):
    from opforge.ops.rotary import reference
    reference.kv_cache_append(k_cache, v_cache, k, v, lens)
    return _new_slots(k_cache, v_cache, k.shape[2])


def _opforge_append(ctx: BuildContext) -> Callable[..., Any]:
    import opforge

    def run(k_cache, v_cache, k, v, lens):
        opforge.kv_cache_append(k_cache, v_cache, k, v, lens, check=False)
        return _new_slots(k_cache, v_cache, k.shape[2])

    return run


def _torch_append(k_cache, v_cache, k, v, lens):
    index_append(k_cache, v_cache, k, v, lens)
    return _new_slots(k_cache, v_cache, k.shape[2])


def _fused_inputs(shape: Shape, dtype: torch.dtype, device: torch.device, g: torch.Generator) -> Inputs:
    b, hq, hkv, s, s_max, d = shape
    q = normal((b, hq, s, d), dtype, device, g)
    k_cache, v_cache, k, v, lens = _append_inputs((b, hkv, s, s_max, d), dtype, device, g)
    cos, sin = tables(s_max, d, device)
    return (q, k, v, k_cache, v_cache, lens, cos, sin)


def _fused_bytes(shape: Shape, dtype: torch.dtype) -> int:
    b, hq, hkv, s, s_max, d = shape
    return (2 * b * hq * s * d + 4 * b * hkv * s * d) * dtype.itemsize + 2 * b * s * (d // 2) * 4 + b * 4


def _cache_positions(lens: torch.Tensor, s: int) -> torch.Tensor:
    return lens.long().view(-1, 1) + torch.arange(s, device=lens.device).view(1, s)


def _ref_fused(q, k, v, k_cache, v_cache, lens, cos, sin):
    from opforge.ops.rotary import reference
    s = q.shape[2]
    q_out = reference.rotary_kv_cache_append(q, k, v, k_cache, v_cache, lens, cos, sin, _cache_positions(lens, s))
    return (q_out, *_new_slots(k_cache, v_cache, s))


def _opforge_fused(ctx: BuildContext) -> Callable[..., Any]:
    import opforge

    def run(q, k, v, k_cache, v_cache, lens, cos, sin):
        q_out = opforge.rotary_kv_cache_append(q, k, v, k_cache, v_cache, lens, cos, sin, check=False)
        return (q_out, *_new_slots(k_cache, v_cache, q.shape[2]))

    return run


def _torch_fused(q, k, v, k_cache, v_cache, lens, cos, sin):
    s = q.shape[2]
    pos = _cache_positions(lens, s)
    c, sn = cos[pos].unsqueeze(1), sin[pos].unsqueeze(1)      # (B, 1, S, D/2): each sequence its rows
    q_out, k_rot = torch_rotary(q, k, c, sn, slice(None))
    index_append(k_cache, v_cache, k_rot, v, lens)
    return (q_out, *_new_slots(k_cache, v_cache, s))


KV_CACHE_APPEND = register_op(OpSpec("kv_cache_append", _append_inputs, _ref_append, _append_bytes,
                                     {OPFORGE: _opforge_append, TORCH: eager_impl(_torch_append)}))
ROTARY_KV_CACHE_APPEND = register_op(OpSpec("rotary_kv_cache_append", _fused_inputs, _ref_fused, _fused_bytes,
                                            {OPFORGE: _opforge_fused, TORCH: eager_impl(_torch_fused)}))

ROPE_SUITE = register_suite(
    Suite(
        name="rope",
        description="rotary_embedding bf16, prefill 1x32/8x4096x128 and decode 64x32/8x1x128: share of copy",
        entries=[SuiteEntry("rotary_embedding", (PREFILL_SHAPE, DECODE_SHAPE), (torch.bfloat16,))],
        impls=(OPFORGE, TORCH, COMPILE),
        metric="gpu_us",
        targets=[bandwidth_at_least({"bf16": 90.0})],
    )
)

KV_APPEND_SUITE = register_suite(
    Suite(
        name="kv_append",
        description="kv_cache_append and rotary_kv_cache_append bf16, decode 64x1 and prefill 1x4096 tokens: "
                    "share of copy",
        entries=[SuiteEntry("kv_cache_append", ((64, 8, 1, 4096, 128), (1, 8, 4096, 8192, 128)), (torch.bfloat16,)),
                 SuiteEntry("rotary_kv_cache_append", ((64, 32, 8, 1, 4096, 128), (1, 32, 8, 4096, 8192, 128)),
                            (torch.bfloat16,))],
        impls=(OPFORGE, TORCH),
        metric="gpu_us",
        targets=[bandwidth_at_least({"bf16": 90.0})],
    )
)
