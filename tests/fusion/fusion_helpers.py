"""Shared checks of the fusion tests: run a fused function on a backend, compare with float64."""
from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

import opforge
from opforge.testing import DEVICE, TOLERANCE, rel_error

BACKENDS = ["triton", "torch"]


def to_double(a: Any) -> Any:
    """The float64 copy of a floating tensor (the oracle's input); anything else unchanged."""
    return a.double() if isinstance(a, torch.Tensor) and a.is_floating_point() else a


def run(fused: Callable, args: Sequence[Any], backend: str) -> Any:
    with opforge.backend(backend):
        return fused(*args)


def assert_matches(out: Any, ref: Any, dtypes: Any = None, factor: float = 1.0) -> None:
    """``out`` (tensor or tuple) has ``ref``'s shapes, the expected dtypes, and is within tolerance.

    Floating outputs are judged by relative error against ``ref`` (float64) with NaNs required
    in the same places; bool and integer outputs must be equal.
    """
    outs = out if isinstance(out, tuple) else (out,)
    refs = ref if isinstance(ref, tuple) else (ref,)
    assert len(outs) == len(refs)
    if dtypes is not None:
        wanted = dtypes if isinstance(dtypes, (tuple, list)) else (dtypes,)
        assert [o.dtype for o in outs] == list(wanted)
    for index, (o, r) in enumerate(zip(outs, refs)):
        assert isinstance(o, torch.Tensor)
        assert tuple(o.shape) == tuple(r.shape), (tuple(o.shape), tuple(r.shape))
        if not o.dtype.is_floating_point:
            assert torch.equal(o.cpu(), r.to(o.dtype).cpu()), (o, r)
            continue
        o64, r64 = o.detach().cpu().double(), r.detach().cpu().double()
        assert torch.equal(torch.isnan(o64), torch.isnan(r64)), (o64, r64)
        keep = ~torch.isnan(r64)
        same_inf = torch.isinf(r64) & (o64 == r64)
        keep &= ~same_inf
        err = rel_error(o64[keep], r64[keep]) if keep.any() else 0.0
        assert err <= TOLERANCE[o.dtype] * factor, f"output {index}: relative error {err:.3g} for {o.dtype}"


def randn(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(shape, device=DEVICE).to(dtype)


def check(fused: Callable, eager: Callable, args: Sequence[Any], backend: str, factor: float = 1.0) -> Any:
    """Run ``fused`` on ``backend`` and compare it with ``eager`` on float64 copies of ``args``."""
    out = run(fused, args, backend)
    ref = eager(*[to_double(a) for a in args])
    expected = eager(*args)  # dtypes as torch gives them
    dtypes = tuple(e.dtype for e in expected) if isinstance(expected, tuple) else expected.dtype
    assert_matches(out, ref, dtypes, factor)
    return out


def fresh(fn: Callable) -> Any:
    """A new fused function (its own caches) for ``fn``."""
    from opforge.fusion import fuse
    return fuse(fn)
