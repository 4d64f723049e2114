"""Helpers for benchmark entries of row-wise and pointwise ops (softmax, activations).

Inputs are random (never zeros), standard normal unless scaled; the bytes that must move are
``streams`` tensors of the entry's shape (inputs read plus outputs written).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from opforge.bench.impls import compiled_impl, eager_impl, opforge_impl
from opforge.bench.spec import COMPILE, LIGER, OPFORGE, TORCH, Absent, BuildContext, Inputs, OpSpec, Outputs, \
    Shape, numel


def normal(shape: Shape, dtype: torch.dtype, device: torch.device, g: torch.Generator,
           scale: float = 1.0) -> torch.Tensor:
    """A standard normal tensor times ``scale``, drawn in float32 and cast to ``dtype``.

    Example:
        >>> import torch
        >>> normal((2, 3), torch.float16, torch.device("cpu"), torch.Generator().manual_seed(0)).dtype
        torch.float16
    """
    t = torch.randn(shape, generator=g, device=device, dtype=torch.float32)
    if scale != 1.0:
        t.mul_(scale)
    return t.to(dtype)


def streams_bytes(streams: int) -> Callable[[Shape, torch.dtype], int]:
    """Bytes moved by ``streams`` tensors of the entry's shape.

    Example:
        >>> import torch
        >>> streams_bytes(3)((16, 64), torch.bfloat16)
        6144
    """
    def count(shape: Shape, dtype: torch.dtype) -> int:
        return streams * numel(shape) * dtype.itemsize

    return count


def liger_absent(reason: str) -> Callable[[BuildContext], Callable[..., Any]]:
    """A Liger-Kernel builder for an op Liger lacks: building it raises ``Absent(reason)``."""
    def build(ctx: BuildContext) -> Callable[..., Any]:
        raise Absent(reason)

    return build


def feed_first(inputs: Inputs, outputs: Outputs) -> Inputs:
    """Chaining: the output replaces the first input of the next call."""
    return (outputs[0],) + tuple(inputs[1:])


def pointwise_spec(name: str, make: Callable[..., Inputs], streams: int, ref: Callable[..., Any],
                   eager: Callable[..., Any], liger: Callable[[BuildContext], Callable[..., Any]]) -> OpSpec:
    """The benchmark op of ``opforge.<name>``: opforge, torch eager, torch.compile and Liger peers.

    Example:
        >>> import torch
        >>> spec = pointwise_spec("relu", lambda *a: (), 2, torch.relu, torch.relu, liger_absent("none"))
        >>> spec.name, spec.bytes_moved((4, 8), torch.float32)
        ('relu', 256)
    """
    return OpSpec(
        name=name,
        make_inputs=make,
        reference=ref,
        bytes_moved=streams_bytes(streams),
        impls={OPFORGE: opforge_impl(name), TORCH: eager_impl(eager), COMPILE: compiled_impl(eager), LIGER: liger},
        feed=feed_first,
    )
