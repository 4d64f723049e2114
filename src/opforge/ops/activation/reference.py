"""The activations' math: the torch path everywhere and, in float64, the test oracle.

Two layers:

* ``*_formula(x, ..., ops=torch)`` are the formulas written with arithmetic operators and a
  few named functions taken from ``ops`` (``erf``, ``tanh``, ``sigmoid``, ``where``). Any
  object with those functions works, so the fusion compiler can evaluate the same formulas on
  its symbolic tensors by passing its own ``ops``.
* ``gelu``, ``silu``, ``relu``, ``swiglu``, ``geglu`` apply the formulas to torch tensors in
  float32 (float64 for float64 inputs) and round once to the input dtype (exact GELU through
  ``erfc``, the same function without the cancellation of ``1 + erf`` for x << 0). On
  ``.double()`` tensors they are the oracle the kernels are judged against.

GELU is exact by default, ``0.5 * x * (1 + erf(x / sqrt(2)))``; ``approximate="tanh"`` is
``0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x**3)))``, as in ``torch.nn.functional.gelu``.

Example:
    >>> import torch
    >>> from opforge.ops.activation import reference
    >>> reference.relu(torch.tensor([-1.0, 2.0])).tolist()
    [0.0, 2.0]
"""
from __future__ import annotations

from typing import Any, Callable

import torch

SQRT_HALF = 0.7071067811865476          # 1 / sqrt(2)
SQRT_2_OVER_PI = 0.7978845608028654     # sqrt(2 / pi)
TANH_CUBIC = 0.044715
APPROXIMATIONS = ("none", "tanh")


def gelu_formula(x: Any, approximate: str = "none", ops: Any = torch) -> Any:
    """GELU written with ``ops.erf`` (exact) or ``ops.tanh`` (``approximate="tanh"``).

    Example:
        >>> import torch
        >>> round(gelu_formula(torch.tensor(1.0)).item(), 6)
        0.841345
    """
    if approximate == "tanh":
        return 0.5 * x * (1.0 + ops.tanh(SQRT_2_OVER_PI * (x + TANH_CUBIC * x * x * x)))
    return 0.5 * x * (1.0 + ops.erf(x * SQRT_HALF))


def silu_formula(x: Any, ops: Any = torch) -> Any:
    """SiLU (swish): ``x * sigmoid(x)``.

    Example:
        >>> import torch
        >>> silu_formula(torch.tensor(0.0)).item()
        0.0
    """
    return x * ops.sigmoid(x)


def relu_formula(x: Any, ops: Any = torch) -> Any:
    """ReLU: ``where(x < 0, 0, x)``; NaN stays NaN, as in ``torch.relu``.

    Example:
        >>> import torch
        >>> relu_formula(torch.tensor([-2.0, 3.0])).tolist()
        [0.0, 3.0]
    """
    return ops.where(x < 0, 0.0, x)


def swiglu_formula(gate: Any, up: Any, ops: Any = torch) -> Any:
    """SwiGLU: ``silu(gate) * up``.

    Example:
        >>> import torch
        >>> swiglu_formula(torch.tensor(0.0), torch.tensor(5.0)).item()
        0.0
    """
    return silu_formula(gate, ops) * up


def geglu_formula(gate: Any, up: Any, approximate: str = "none", ops: Any = torch) -> Any:
    """GeGLU: ``gelu(gate) * up``.

    Example:
        >>> import torch
        >>> round(geglu_formula(torch.tensor(1.0), torch.tensor(2.0)).item(), 5)
        1.68269
    """
    return gelu_formula(gate, approximate, ops) * up


#: name -> formula, for the fusion compiler: ``FORMULAS["gelu"](x, approximate="tanh", ops=my_ops)``.
FORMULAS: dict[str, Callable[..., Any]] = {
    "gelu": gelu_formula, "silu": silu_formula, "relu": relu_formula,
    "swiglu": swiglu_formula, "geglu": geglu_formula,
}


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _up(x: torch.Tensor) -> torch.Tensor:
    return x.to(_compute_dtype(x))


def _gelu(x: torch.Tensor, approximate: str) -> torch.Tensor:
    if approximate == "tanh":
        return gelu_formula(x, approximate)
    # 0.5 * x * (1 + erf(x / sqrt(2))) written with erfc, which does not cancel for x << 0
    return 0.5 * x * torch.special.erfc(x * -SQRT_HALF)


def gelu(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """GELU in float32 (float64 for float64 x), rounded once to x's dtype.

    The exact form is evaluated as ``0.5 * x * erfc(-x / sqrt(2))``, equal to the erf formula
    but accurate to the last bits for very negative x too.

    Example:
        >>> import torch
        >>> y = gelu(torch.randn(8, dtype=torch.bfloat16), approximate="tanh")
    """
    return _gelu(_up(x), approximate).to(x.dtype)


def silu(x: torch.Tensor) -> torch.Tensor:
    """SiLU in float32 (float64 for float64 x), rounded once to x's dtype.

    Example:
        >>> import torch
        >>> y = silu(torch.randn(8, dtype=torch.float16))
    """
    return silu_formula(_up(x)).to(x.dtype)


def relu(x: torch.Tensor) -> torch.Tensor:
    """ReLU in x's dtype (exact in every dtype).

    Example:
        >>> import torch
        >>> relu(torch.tensor([-1.0, 1.0])).tolist()
        [0.0, 1.0]
    """
    return relu_formula(_up(x)).to(x.dtype)


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` in float32 (float64 for float64 inputs), rounded once to gate's dtype.

    Example:
        >>> import torch
        >>> y = swiglu(torch.randn(4, 8), torch.randn(4, 8))
    """
    return swiglu_formula(_up(gate), _up(up)).to(gate.dtype)


def geglu(gate: torch.Tensor, up: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """``gelu(gate) * up`` in float32 (float64 for float64 inputs), rounded once to gate's dtype.

    Example:
        >>> import torch
        >>> y = geglu(torch.randn(4, 8), torch.randn(4, 8))
    """
    return (_gelu(_up(gate), approximate) * _up(up)).to(gate.dtype)


def fast_function(op: str, approximate: str | None) -> Callable[[torch.Tensor, Any], torch.Tensor]:
    """PyTorch's own functions for ``op`` as ``f(x, up)``: the torch path for float32 and half
    inputs (``run``). ``F.gelu`` and ``F.silu`` compute in float32 inside and round once, as
    the careful forms do; the gated forms round the activation to x's dtype before the product
    (one more rounding than ``swiglu`` / ``geglu``: within half precision's tolerance).

    Example:
        >>> import torch
        >>> g, u = torch.randn(4, 8), torch.randn(4, 8)
        >>> torch.allclose(fast_function("swiglu", None)(g, u), swiglu(g, u), atol=1e-6)
        True
    """
    import torch.nn.functional as F

    silu_, gelu_, relu_ = F.silu, F.gelu, torch.relu
    mode = approximate or "none"
    if op == "silu":
        return lambda x, up: silu_(x)
    if op == "relu":
        return lambda x, up: relu_(x)
    if op == "gelu":
        return lambda x, up: gelu_(x, approximate=mode)
    if op == "swiglu":
        return lambda x, up: silu_(x) * up
    if op == "geglu":
        return lambda x, up: gelu_(x, approximate=mode) * up
    raise KeyError(op)


def run(op: str, x: torch.Tensor, up: torch.Tensor | None, approximate: str | None) -> torch.Tensor:
    """Run ``op`` by name with the family's common argument list: the careful forms above for
    float64 inputs (the oracle), PyTorch's own functions otherwise (``fast_function``)."""
    if x.dtype != torch.float64:
        return fast_function(op, approximate)(x, up)
    return careful_run(op, x, up, approximate)


def careful_run(op: str, x: torch.Tensor, up: torch.Tensor | None, approximate: str | None) -> torch.Tensor:
    """Run ``op`` by name through the careful forms (float32 or float64 inside, one rounding)."""
    if op == "gelu":
        return gelu(x, approximate or "none")
    if op == "silu":
        return silu(x)
    if op == "relu":
        return relu(x)
    if op == "swiglu":
        return swiglu(x, up)
    if op == "geglu":
        return geglu(x, up, approximate or "none")
    raise KeyError(op)
