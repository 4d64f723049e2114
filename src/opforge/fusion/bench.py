"""The fused pointwise chain ``gelu(x + b) * 0.5 + r`` as a benchmark op, and the ``fusion`` suite.

``opforge.fuse`` turns the chain into one generated kernel; its peers are the same function in
torch eager (four kernels) and under ``torch.compile``. Inputs are random: ``x`` and ``r``
standard normal of the entry's shape, the bias ``b`` of its last dimension. Bytes that must
move, with ``E`` elements, ``N`` columns and ``s`` bytes per element: read x, r, b and write y,
``(3*E + N)*s``.

Suite (``opforge bench --suite fusion``): 16384x4096 bf16, >= 90% of copy bandwidth, within 3% of
the fastest peer, and a first call (trace, code generation, Triton compile) >= 10x shorter than
torch.compile's; run it in a fresh process with empty caches for cold first calls
(``TRITON_CACHE_DIR=$(mktemp -d) TORCHINDUCTOR_CACHE_DIR=$(mktemp -d) opforge bench --suite fusion``).

Example:
    >>> import torch
    >>> x, b, r = torch.ones(2, 4), torch.zeros(4), torch.zeros(2, 4)
    >>> float(FUSED(x, b, r)[0, 0]) == float(torch_chain(x, b, r)[0, 0])
    True
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from opforge.bench.impls import compiled_impl, eager_impl
from opforge.bench.pointwise import feed_first, normal
from opforge.bench.spec import COMPILE, OPFORGE, TORCH, Inputs, OpSpec, Shape, Suite, SuiteEntry, numel, \
    register_op, register_suite
from opforge.bench.targets import bandwidth_at_least, first_call_shorter, near_fastest_peer

from .fused import fuse

SCALE = 0.5
CHAIN_SHAPES = ((16384, 4096),)


def torch_chain(x: torch.Tensor, b: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """The chain in torch: exact GELU of ``x + b``, scaled, plus the residual ``r``."""
    return F.gelu(x + b) * SCALE + r


#: The same function as one generated kernel.
FUSED = fuse(torch_chain, name="bias_gelu_residual")


def ref_chain(x: torch.Tensor, b: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """float64 oracle: exact GELU through erfc (no cancellation for very negative values)."""
    h = x + b
    return 0.5 * h * torch.special.erfc(h * -(0.5 ** 0.5)) * SCALE + r


def _inputs(shape: Shape, dtype: torch.dtype, device: torch.device, g: torch.Generator) -> Inputs:
    return (normal(shape, dtype, device, g), normal(shape[-1:], dtype, device, g), normal(shape, dtype, device, g))


def _bytes(shape: Shape, dtype: torch.dtype) -> int:
    return (3 * numel(shape) + shape[-1]) * dtype.itemsize


CHAIN = register_op(OpSpec(
    name="bias_gelu_residual",
    make_inputs=_inputs,
    reference=ref_chain,
    bytes_moved=_bytes,
    impls={OPFORGE: eager_impl(FUSED), TORCH: eager_impl(torch_chain), COMPILE: compiled_impl(torch_chain)},
    feed=feed_first,
))

FUSION_SUITE = register_suite(
    Suite(
        name="fusion",
        description="opforge.fuse of gelu(x + b) * 0.5 + r at 16384x4096 bf16: share of copy",
        entries=[SuiteEntry("bias_gelu_residual", CHAIN_SHAPES, (torch.bfloat16,))],
        impls=(OPFORGE, TORCH, COMPILE),
        metric="gpu_us",
        targets=[bandwidth_at_least({"bf16": 90.0}), near_fastest_peer(0.03, "gpu_us"),
                 first_call_shorter(COMPILE, 10.0)],
    )
)
