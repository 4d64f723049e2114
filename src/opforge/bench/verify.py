"""Correctness before speed: every implementation's output against the float64 oracle.

The measure is the relative error ``||out - ref|| / ||ref||`` per output, computed in
float64; non-finite values, a wrong shape, dtype or number of outputs fail outright.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

#: Default relative-error tolerance per input dtype. Rounding the output alone costs
#: about 2^-9 (bf16), 2^-12 (fp16) and 2^-25 (fp32) relative; a wrong kernel (a row
#: mixed up, a term left out) lands near 1.
TOLERANCE: dict[torch.dtype, float] = {
    torch.float32: 1e-4,
    torch.float16: 2e-3,
    torch.bfloat16: 1.6e-2,
    torch.float64: 1e-10,
}


def as_outputs(value: Any) -> tuple[torch.Tensor, ...]:
    """Normalize an op's return value to a tuple of tensors.

    Example:
        >>> len(as_outputs(torch.ones(2)))
        1
    """
    if isinstance(value, torch.Tensor):
        return (value,)
    return tuple(value)


def tolerance(dtype: torch.dtype, overrides: Mapping[torch.dtype, float] | None = None) -> float:
    """Relative-error tolerance for ``dtype``. Example: ``tolerance(torch.bfloat16)``."""
    if overrides and dtype in overrides:
        return overrides[dtype]
    return TOLERANCE.get(dtype, 1e-2)


def upcast(inputs: tuple[Any, ...]) -> tuple[Any, ...]:
    """float64 copies of the floating-point tensors among ``inputs``."""
    return tuple(
        a.to(torch.float64) if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in inputs
    )


def compare(outputs: Any, reference: Any, dtype: torch.dtype) -> tuple[float | None, str | None]:
    """Return ``(max relative error, problem)``; ``problem`` is None when outputs are sane.

    The tolerance is applied by the caller; ``problem`` reports what no tolerance can
    excuse (count, shape, dtype, NaN/Inf).

    Example:
        >>> ref = torch.ones(4, dtype=torch.float64)
        >>> compare(torch.ones(4), ref, torch.float32)
        (0.0, None)
    """
    outs, refs = as_outputs(outputs), as_outputs(reference)
    if len(outs) != len(refs):
        return None, f"returned {len(outs)} output(s), expected {len(refs)}"
    worst = 0.0
    for i, (o, r) in enumerate(zip(outs, refs)):
        if not isinstance(o, torch.Tensor):
            return None, f"output {i} is {type(o).__name__}, not a tensor"
        if tuple(o.shape) != tuple(r.shape):
            return None, f"output {i} has shape {tuple(o.shape)}, expected {tuple(r.shape)}"
        if o.dtype != dtype:
            return None, f"output {i} has dtype {o.dtype}, expected {dtype}"
        o64 = o.detach().to(device=r.device, dtype=torch.float64)
        if not bool(torch.isfinite(o64).all()):
            return None, f"output {i} has NaN or Inf"
        r64 = r.to(torch.float64)               # integer outputs (codes) are compared as numbers too
        denom = float(torch.linalg.vector_norm(r64))
        err = float(torch.linalg.vector_norm(o64 - r64))
        worst = max(worst, err / denom if denom > 0 else err)
    return worst, None
