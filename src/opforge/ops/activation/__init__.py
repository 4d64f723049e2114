"""Pointwise activations: gelu, silu, relu, and the gated forms swiglu and geglu.

Every call validates its arguments, asks the registry for a variant (Triton on CUDA/ROCm,
Metal on MPS, the torch path elsewhere), runs it and, inside ``opforge.trace()``, records it.

Each function first checks whether it was handed a symbolic tensor of the fusion compiler
(``x._opforge_symbolic_``); if so it records itself with ``x._opforge_apply_(op, tensors,
params)`` and returns the symbolic result, so ``@opforge.fuse`` functions can call it.
"""
from __future__ import annotations

from typing import Optional

import torch

from ...runtime import alloc, dispatch, plans
from ...runtime.compile_support import compiled
from . import fakes, reference
from .problem import OPS, PLANS, ActivationCall, prepare, signature

_Tensor = torch.Tensor


def _torch_launch(call: ActivationCall) -> torch.Tensor:
    p = call.problem
    if call.signature is not None and p.device_type == "cpu" and p.dtype != torch.float64:
        # On a CPU tensor the torch path is the native one: a call of the same signature goes
        # straight to PyTorch's function.
        PLANS.offer(call.signature, reference.fast_function(p.op, call.approximate), "torch")
    return reference.run(p.op, call.x, call.up, call.approximate)


def _register() -> None:
    dispatch.register_family(OPS, dispatch.kernel_tables(__name__), _torch_launch,
                             "torch composite ops in float32 (float64 for float64 inputs)", _problem_builder)


def _problem_builder(op: str):
    def build(x, *args, **kwargs):
        if op in ("swiglu", "geglu"):
            up = args[0] if args else kwargs.pop("up")
            args = args[1:]
        else:
            up = None
        approximate = (args[0] if args else kwargs.get("approximate", "none")) if op in ("gelu", "geglu") else None
        return prepare(op, x, up, approximate).problem

    return build


def _run(op: str, x: torch.Tensor, up: Optional[torch.Tensor], approximate: Optional[str]) -> torch.Tensor:
    sig = None
    if plans.enabled():
        sig = signature(op, x, up, approximate)
        plan = PLANS.get(sig)
        if plan is not None:
            try:
                out = plan(x, up)
            except torch.OutOfMemoryError:  # the general path retries after freeing, or names the op
                out = None
            if out is not None:
                return out
    call = prepare(op, x, up, approximate)
    call.signature = sig
    if call.problem.numel == 0:
        return alloc.empty(x.shape, x.dtype, x.device)
    return dispatch.run(op, call, x)


def _symbolic(*tensors: object):
    """The first of ``tensors`` that is a fusion compiler's symbolic tensor, or None."""
    for t in tensors:
        if type(t) is not _Tensor and getattr(t, "_opforge_symbolic_", False):
            return t
    return None


@compiled("gelu", fakes.gelu)
def gelu(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """GELU: ``0.5 * x * (1 + erf(x / sqrt(2)))``, or its tanh form, as ``torch.nn.functional.gelu``.

    Args:
        x: float32, float16 or bfloat16 tensor of any shape and strides (float64 runs on the
            torch path). Contiguous, dense-permuted and strided-row layouts run in place; other
            layouts are copied first (the trace says so).
        approximate: ``"none"`` (exact, erf) or ``"tanh"``
            (``0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x**3)))``).

    Returns:
        A tensor of x's shape and dtype (with x's layout if x is dense, else packed), computed in
        float32 and rounded once.

    Example:
        >>> import torch, opforge
        >>> x = torch.randn(4, 256)
        >>> torch.allclose(opforge.gelu(x), torch.nn.functional.gelu(x), atol=1e-6)
        True
        >>> torch.allclose(opforge.gelu(x, approximate="tanh"),
        ...                torch.nn.functional.gelu(x, approximate="tanh"), atol=1e-6)
        True
    """
    if type(x) is not _Tensor and getattr(x, "_opforge_symbolic_", False):
        return x._opforge_apply_("gelu", (x,), {"approximate": approximate})
    return _run("gelu", x, None, approximate)


@compiled("silu", fakes.silu)
def silu(x: torch.Tensor) -> torch.Tensor:
    """SiLU (swish): ``x * sigmoid(x)``, as ``torch.nn.functional.silu``.

    Same dtypes, shapes and layouts as ``gelu``.

    Example:
        >>> import torch, opforge
        >>> x = torch.randn(3, 100)
        >>> torch.allclose(opforge.silu(x), torch.nn.functional.silu(x), atol=1e-6)
        True
    """
    if type(x) is not _Tensor and getattr(x, "_opforge_symbolic_", False):
        return x._opforge_apply_("silu", (x,), {})
    return _run("silu", x, None, None)


@compiled("relu", fakes.relu)
def relu(x: torch.Tensor) -> torch.Tensor:
    """ReLU: ``max(x, 0)``, NaN kept, as ``torch.relu``.

    Same dtypes, shapes and layouts as ``gelu``.

    Example:
        >>> import torch, opforge
        >>> opforge.relu(torch.tensor([-1.0, 0.5])).tolist()
        [0.0, 0.5]
    """
    if type(x) is not _Tensor and getattr(x, "_opforge_symbolic_", False):
        return x._opforge_apply_("relu", (x,), {})
    return _run("relu", x, None, None)


@compiled("swiglu", fakes.swiglu)
def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """SwiGLU: ``silu(gate) * up`` in one pass (the gated MLP of LLaMA-style models).

    Args:
        gate, up: tensors of one shape, dtype and device; float32, float16 or bfloat16 (float64
            on the torch path). Strided rows run in place, so the two halves of a fused
            projection, ``h[..., :F]`` and ``h[..., F:]``, are read without a copy.

    Returns:
        A tensor of gate's shape and dtype, computed in float32 and rounded once.

    Example:
        >>> import torch, opforge
        >>> h = torch.randn(4, 2 * 64)
        >>> gate, up = h[:, :64], h[:, 64:]
        >>> y = opforge.swiglu(gate, up)
        >>> torch.allclose(y, torch.nn.functional.silu(gate) * up, atol=1e-6)
        True
    """
    sym = _symbolic(gate, up)
    if sym is not None:
        return sym._opforge_apply_("swiglu", (gate, up), {})
    return _run("swiglu", gate, up, None)


@compiled("geglu", fakes.geglu)
def geglu(gate: torch.Tensor, up: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """GeGLU: ``gelu(gate, approximate) * up`` in one pass.

    Same arguments and layouts as ``swiglu``; ``approximate`` as in ``gelu``.

    Example:
        >>> import torch, opforge
        >>> gate, up = torch.randn(2, 3, 32), torch.randn(2, 3, 32)
        >>> y = opforge.geglu(gate, up)
        >>> torch.allclose(y, torch.nn.functional.gelu(gate) * up, atol=1e-6)
        True
    """
    sym = _symbolic(gate, up)
    if sym is not None:
        return sym._opforge_apply_("geglu", (gate, up), {"approximate": approximate})
    return _run("geglu", gate, up, approximate)


_register()

__all__ = ["gelu", "silu", "relu", "swiglu", "geglu"]
