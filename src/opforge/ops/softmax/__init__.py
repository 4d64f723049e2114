"""Softmax and log_softmax along one dimension.

Every call validates its arguments, asks the registry for a variant (Triton on CUDA/ROCm,
Metal on MPS, the torch path elsewhere), runs it and, inside ``opforge.trace()``, records it.
"""
from __future__ import annotations

import torch

from ...runtime import alloc, dispatch, plans
from ...runtime.compile_support import compiled
from . import fakes, reference
from .problem import OPS, PLANS, SoftmaxCall, prepare, signature


def _torch_launch(call: SoftmaxCall) -> torch.Tensor:
    p = call.problem
    if call.signature is not None and p.device_type == "cpu" and p.dtype != torch.float64:
        # On a CPU tensor the torch path is the native one: a call of the same signature goes
        # straight to PyTorch's function.
        PLANS.offer(call.signature, reference.fast_function(p.op), "torch")
    return call.finish(reference.run(p.op, call.x.tensor.view(call.shape), -1))


def _register() -> None:
    dispatch.register_family(OPS, dispatch.kernel_tables(__name__), _torch_launch,
                             "torch composite ops, float32 accumulation (float64 for float64 inputs)", _problem_builder)


def _problem_builder(op: str):
    def build(x, dim=-1):
        return prepare(op, x, dim).problem

    return build


def _run(op: str, x: torch.Tensor, dim: int) -> torch.Tensor:
    sig = None
    if plans.enabled():
        sig = signature(op, x, dim)
        plan = PLANS.get(sig)
        if plan is not None:
            try:
                out = plan(x)
            except torch.OutOfMemoryError:  # the general path retries after freeing, or names the op
                out = None
            if out is not None:
                return out
    call = prepare(op, x, dim)
    call.signature = sig
    if call.problem.rows == 0 or call.problem.n == 0:
        return call.finish(alloc.empty(call.shape, x.dtype, x.device))
    return dispatch.run(op, call, x)


@compiled("softmax", fakes.softmax)
def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Softmax along ``dim``: ``exp(x - max) / sum(exp(x - max))``, as ``torch.softmax``.

    Args:
        x: float32, float16 or bfloat16 tensor of any shape (float64 runs on the torch path).
            Rows may be strided (``big[:, :N]``) and are read in place; a non-contiguous last
            dimension is copied first (the trace says so).
        dim: the dimension to normalize. Any dimension but the last is moved last by a copy
            (the trace says so); the result is then a view of a packed tensor whose last
            dimension is ``dim``, with x's shape.

    Returns:
        A tensor of x's shape and dtype. Accumulation is in float32; the row maximum is
        subtracted first, so huge logits do not overflow. ``-inf`` entries give 0; a row that is
        all ``-inf`` gives NaN, as in torch. Any N runs: long rows are walked with an online
        maximum and sum, and a few very long rows are split across the GPU.

    Example:
        >>> import torch, opforge
        >>> x = torch.randn(4, 1000)
        >>> y = opforge.softmax(x)
        >>> torch.allclose(y, torch.softmax(x, dim=-1), atol=1e-6)
        True
    """
    return _run("softmax", x, dim)


@compiled("log_softmax", fakes.log_softmax)
def log_softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Log-softmax along ``dim``: ``(x - max) - log(sum(exp(x - max)))``, as ``torch.log_softmax``.

    Same dtypes, shapes, strides and ``dim`` handling as ``softmax``; ``-inf`` entries give
    ``-inf``, an all ``-inf`` row gives NaN.

    Example:
        >>> import torch, opforge
        >>> x = torch.randn(2, 3, 50)
        >>> y = opforge.log_softmax(x, dim=1)
        >>> torch.allclose(y, torch.log_softmax(x, dim=1), atol=1e-5)
        True
    """
    return _run("log_softmax", x, dim)


_register()

__all__ = ["softmax", "log_softmax"]
