"""Normalizations over the last dimension: layer_norm, rms_norm and their fused residual-add forms.

Every call validates its arguments, asks the registry for a variant (Triton on CUDA/ROCm,
Metal on MPS, the torch path elsewhere), runs it and, inside ``opforge.trace()``, records it.
"""
from __future__ import annotations

from typing import Optional

import torch

from ...runtime import dispatch, plans
from ...runtime.compile_support import compiled
from . import fakes, reference
from .problem import OPS, PLANS, NormCall, prepare, signature


_INF = float("inf")


def _torch_launch(call: NormCall):
    op = call.problem.op
    p = call.problem
    if call.signature is not None and p.device_type == "cpu" and p.dtype != torch.float64:
        _offer_torch_plan(call.signature, reference.fast_function(
            op, p.n, p.weight_dtype in (None, p.dtype) and p.bias_dtype in (None, p.dtype)))
    return reference.run(op, call.x.tensor.view(call.shape),
                         None if call.residual is None else call.residual.tensor.view(call.shape),
                         call.weight, call.bias, call.eps)


def _offer_torch_plan(sig: tuple, fast) -> None:
    """On a CPU tensor the torch path is the native one: a call of the same signature (packed
    tensors of the same shapes, dtypes and device) goes straight to PyTorch's fused norm."""
    def plan(x, residual, weight, bias, eps):
        if type(eps) is not float or not 0.0 <= eps < _INF:
            return None  # the general path names the argument
        return fast(x, residual, weight, bias, eps)

    PLANS.offer(sig, plan, "torch")


def _register() -> None:
    dispatch.register_family(OPS, dispatch.kernel_tables(__name__), _torch_launch,
                             "torch composite ops, float32 accumulation (float64 for float64 inputs)", _problem_builder)


def _problem_builder(op: str):
    has_residual = op.startswith("add_")

    def build(x, *args, **kwargs):
        residual = (args[0] if args else kwargs.pop("residual")) if has_residual else None
        rest = args[1:] if has_residual else args
        names = ("weight", "bias", "eps") if "layer" in op else ("weight", "eps")
        params = dict(zip(names, rest))
        params.update(kwargs)
        return prepare(op, x, residual, params.get("weight"), params.get("bias"),
                       params.get("eps", 1e-5 if "layer" in op else 1e-6)).problem

    return build


def _run(op: str, x, residual, weight, bias, eps):
    sig = None
    if plans.enabled():
        sig = signature(op, x, residual, weight, bias)
        plan = PLANS.get(sig)
        if plan is not None:
            try:
                out = plan(x, residual, weight, bias, eps)
            except torch.OutOfMemoryError:  # the general path retries after freeing, or names the op
                out = None
            if out is not None:
                return out
    call = prepare(op, x, residual, weight, bias, eps)
    call.signature = sig
    if call.problem.rows == 0:
        empty = torch.empty(call.shape, dtype=x.dtype, device=x.device)
        return (empty, empty.clone()) if call.problem.has_residual else empty
    return dispatch.run(op, call, x)


@compiled("layer_norm", fakes.layer_norm)
def layer_norm(x: torch.Tensor, weight: Optional[torch.Tensor] = None, bias: Optional[torch.Tensor] = None,
               eps: float = 1e-5) -> torch.Tensor:
    """Layer normalization over the last dimension: ``(x - mean) / sqrt(var + eps) * weight + bias``.

    Args:
        x: (..., N) float32, float16 or bfloat16 (float64 runs on the torch path). Rows may be
            strided (``big[:, :N]``); a non-contiguous last dimension is copied (the trace says so).
        weight, bias: optional (N,) tensors, float32 or x's dtype.
        eps: added to the variance; finite and >= 0.

    Returns:
        A packed tensor of x's shape and dtype. Accumulation is in float32.

    Example:
        >>> import torch, opforge
        >>> x = torch.randn(2, 8, 64)
        >>> y = opforge.layer_norm(x, torch.ones(64), torch.zeros(64))
        >>> torch.allclose(y, torch.nn.functional.layer_norm(x, (64,)), atol=1e-5)
        True
    """
    return _run("layer_norm", x, None, weight, bias, eps)


@compiled("rms_norm", fakes.rms_norm)
def rms_norm(x: torch.Tensor, weight: Optional[torch.Tensor] = None, eps: float = 1e-6) -> torch.Tensor:
    """RMS normalization over the last dimension: ``x / sqrt(mean(x**2) + eps) * weight``.

    Same dtypes, shapes and strides as ``layer_norm``.

    Example:
        >>> import torch, opforge
        >>> x = torch.randn(4, 128)
        >>> y = opforge.rms_norm(x, torch.ones(128))
        >>> torch.allclose(y, x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6), atol=1e-5)
        True
    """
    return _run("rms_norm", x, None, weight, None, eps)


@compiled("add_layer_norm", fakes.add_layer_norm)
def add_layer_norm(x: torch.Tensor, residual: torch.Tensor, weight: Optional[torch.Tensor] = None,
                   bias: Optional[torch.Tensor] = None, eps: float = 1e-5) -> tuple[torch.Tensor, torch.Tensor]:
    """The pre-norm block's add & norm in one pass: returns ``(layer_norm(x + residual), x + residual)``.

    ``residual`` has x's shape and dtype. The sum is rounded to x's dtype, stored as the new
    residual, and that rounded sum is what gets normalized.

    Example:
        >>> import torch, opforge
        >>> x, r = torch.randn(3, 256), torch.randn(3, 256)
        >>> y, new_r = opforge.add_layer_norm(x, r)
        >>> torch.equal(new_r, x + r)
        True
    """
    return _run("add_layer_norm", x, residual, weight, bias, eps)


@compiled("add_rms_norm", fakes.add_rms_norm)
def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: Optional[torch.Tensor] = None,
                 eps: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """Residual add fused with RMS norm: returns ``(rms_norm(x + residual), x + residual)``.

    Example:
        >>> import torch, opforge
        >>> x, r = torch.randn(3, 256), torch.randn(3, 256)
        >>> y, new_r = opforge.add_rms_norm(x, r, torch.ones(256))
        >>> torch.allclose(y, opforge.rms_norm(x + r, torch.ones(256)), atol=1e-6)
        True
    """
    return _run("add_rms_norm", x, residual, weight, None, eps)


_register()

__all__ = ["layer_norm", "rms_norm", "add_layer_norm", "add_rms_norm"]
