"""``rotary_embedding`` as a benchmark op, and the ``rope`` suite.

An entry's shape is ``(B, Hq, Hkv, S, D)``: q is (B, Hq, S, D), k (B, Hkv, S, D), standard
normal; the cos/sin tables (float32, S x D/2) hold the angles of positions 0..S-1 at rope base
10000; the rotation is rotate-half over all of D. Bytes that must move, with ``s`` bytes per
element: read q and k, write both, ``2*B*(Hq+Hkv)*S*D*s``, plus the table rows and positions.

Suite (``opforge bench --suite rope``): prefill (1, 32, 8, 4096, 128) and decode
(64, 32, 8, 1, 128) in bf16 against the torch composite and torch.compile; >= 90% of copy.

Example:
    >>> import torch
    >>> q, k, cos, sin, pos = _inputs((1, 2, 1, 3, 8), torch.float32, torch.device("cpu"), torch.Generator())
    >>> [tuple(t.shape) for t in (q, k, cos, sin, pos)]
    [(1, 2, 3, 8), (1, 1, 3, 8), (3, 4), (3, 4), (3,)]
"""

from __future__ import annotations

import torch

from opforge.bench.impls import compiled_impl, eager_impl, opforge_impl
from opforge.bench.pointwise import normal
from opforge.bench.spec import COMPILE, OPFORGE, TORCH, Inputs, OpSpec, Shape, Suite, SuiteEntry, register_op, \
    register_suite
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
