"""Helpers to check kernels against the float64 oracle, shared by ``opforge verify`` and the tests.

Example:
    >>> import torch
    >>> from opforge.testing import rel_error
    >>> rel_error(torch.ones(3), torch.ones(3, dtype=torch.float64))
    0.0
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence, Union

import math

import torch

#: Relative-error bounds per output dtype: float32 well under 1e-5; half types near their rounding
#: (bf16 allows Triton's interpreter, whose bf16 stores truncate instead of rounding).
TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2, torch.float64: 1e-12}
TOLERANCE.update({torch.int32: 0.0, torch.int64: 0.0})  # integer ops (delay patterns) are exact

Outputs = Union[torch.Tensor, Sequence[torch.Tensor]]


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """‖out − ref‖ / ‖ref‖ in float64; NaN anywhere in ``out`` gives ``inf``.

    Computed on ``out``'s device where it has float64 (CPU, CUDA; MPS has none and goes to the
    CPU), ``ref`` moved there, in chunks of ``_CHUNK`` elements: the GPU verify cases hold KV caches
    of 268M elements, which took seconds each through the host and gigabytes as whole float64
    copies.

    Example:
        >>> rel_error(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.5]))   # doctest: +ELLIPSIS
        0.1856...
    """
    if out.shape != ref.shape:
        raise ValueError(f"shape {tuple(out.shape)} != reference shape {tuple(ref.shape)}")
    device = out.device if out.device.type in ("cpu", "cuda") else torch.device("cpu")
    flat_out = out.detach().to(device).reshape(-1)
    flat_ref = ref.detach().to(device).reshape(-1)
    diff_sq = ref_sq = 0.0
    for start in range(0, flat_out.numel(), _CHUNK):
        o = flat_out[start:start + _CHUNK].to(torch.float64)
        r = flat_ref[start:start + _CHUNK].to(torch.float64)
        if not torch.isfinite(o).all():
            return float("inf")
        ref_sq += r.square().sum().item()
        diff_sq += (o - r).square().sum().item()
    denom, diff = math.sqrt(ref_sq), math.sqrt(diff_sq)
    return diff / denom if denom > 0 else diff


#: Elements per float64 chunk in ``rel_error`` (128 MB per operand).
_CHUNK = 1 << 24


def max_rel_error(outs: Outputs, refs: Outputs) -> float:
    """The worst ``rel_error`` over matching outputs (single tensors or tuples)."""
    if isinstance(outs, torch.Tensor):
        outs, refs = (outs,), (refs,)
    return max(rel_error(o, r) for o, r in zip(outs, refs))


def strided_rows(shape: Sequence[int], dtype: torch.dtype, device: Any) -> torch.Tensor:
    """Random data of ``shape`` viewed out of a larger tensor as ``big[..., ::2, :N]``.

    Rows are then neither packed nor evenly spaced across the leading dims: the layout kernels
    must read in place.
    """
    *lead, n = shape
    if not lead:
        return torch.randn(2, n + 5, dtype=dtype, device=device)[0, :n]
    big = torch.randn(*lead[:-1], 2 * lead[-1], n + 5, dtype=dtype, device=device)
    return big[..., ::2, :n]


def random_layout(shape: Sequence[int], dtype: torch.dtype, device: Any, layout: str = "packed") -> torch.Tensor:
    """Random data of ``shape`` in a layout: packed, strided (``strided_rows``), transposed (the last
    two dims swapped in memory; packed below two dims) or sliced (every other element of the last dim).
    """
    if layout == "strided":
        return strided_rows(shape, dtype, device)
    if layout == "transposed" and len(shape) >= 2:
        return torch.randn(*shape[:-2], shape[-1], shape[-2], dtype=dtype, device=device).transpose(-1, -2)
    if layout == "sliced":
        return torch.randn(*shape[:-1], 2 * shape[-1], dtype=dtype, device=device)[..., ::2]
    return torch.randn(tuple(shape), dtype=dtype, device=device)


@dataclass
class Case:
    """One check: an op on fresh random inputs of a shape and dtype, and its float64 oracle."""

    op: str
    shape: tuple
    dtype: torch.dtype
    layout: str
    make: Callable[[Any], tuple]                 # device -> (args, kwargs), fresh random data
    call: Callable[..., Outputs]                 # the public opforge function
    oracle: Callable[..., Outputs]               # (args, kwargs) -> float64 outputs
    # (args, kwargs, outputs) -> float64 outputs, for an op whose contract refers to one of its own
    # outputs (add_* norms normalize the sum they store): judged against that, not a re-derivation.
    judge: Optional[Callable[..., Outputs]] = None

    def reference(self, args: tuple, kwargs: dict, out: Outputs) -> Outputs:
        """The float64 outputs ``out`` (this case's result on ``args``) must match."""
        return self.judge(args, kwargs, out) if self.judge is not None else self.oracle(args, kwargs)

    @property
    def label(self) -> str:
        return f"{'x'.join(map(str, self.shape))}{'' if self.layout == 'packed' else ' ' + self.layout}"


#: The dtypes every op family's kernels take.
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def verify_grid(make_case: Callable[..., Case], ops: Sequence[str], shapes: Sequence[tuple], quick: bool,
                extras: Callable[[str, Sequence[tuple]], list[Case]]) -> list[Case]:
    """A family's ``verify_cases``: per op, ``make_case(op, shape, dtype)`` for each shape and each
    of ``DTYPES``, then the op's ``extras(op, shapes)``. ``quick`` keeps every other shape."""
    if quick:
        shapes = shapes[1::2]
    return [case for op in ops
            for case in [make_case(op, shape, dtype) for shape in shapes for dtype in DTYPES] + extras(op, shapes)]


def shapes_and_layouts(max_n: int):
    """A hypothesis strategy of ``(shape, layout)`` for the row-wise ops: zero to two leading dims
    of 1..3, a last dim of 1..``max_n``, and a layout of packed, strided or transposed (packed
    where there is one dim only). Needs hypothesis (the ``test`` extra)."""
    from hypothesis import strategies as st

    def shape_and_layout(drawn):
        lead, n, layout = drawn
        shape = tuple(lead) + (n,)
        return shape, "packed" if layout == "transposed" and len(shape) < 2 else layout

    return st.tuples(st.lists(st.integers(1, 3), min_size=0, max_size=2), st.integers(1, max_n),
                     st.sampled_from(["packed", "strided", "transposed"])).map(shape_and_layout)


#: Where tests and ``opforge verify`` run the kernels: the GPU if there is one, else the CPU
#: (Triton then runs in its interpreter).
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
ON_GPU = DEVICE == "cuda"


def run_case(case: Case, backend: str, device: Any = DEVICE) -> tuple:
    """Run ``case`` once on fresh data with ``backend`` forced: ``(args, out, float64 reference, trace)``."""
    from .runtime.policy import backend as force_backend
    from .runtime.trace import trace

    args, kwargs = case.make(device)
    with force_backend(backend), trace() as t:
        out = case.call(*args, **kwargs)
    return args, out, case.reference(args, kwargs, out), t


def check_case(case: Case, backend: str, tol_scale: float = 1.0, device: Any = DEVICE) -> tuple:
    """Run ``case`` and assert it is within ``TOLERANCE`` (times ``tol_scale``) of its oracle and ran as
    one traced call of ``op`` on ``backend``: ``(trace event, args, out)``."""
    args, out, ref, t = run_case(case, backend, device)
    err = max_rel_error(out, ref)
    assert err <= TOLERANCE[case.dtype] * tol_scale, f"{case.op} {case.label} {case.dtype}: rel err {err:.3e}"
    assert len(t) == 1 and t[0].backend == backend and t[0].op == case.op
    return t[0], args, out


def spy_launch_keys(launcher: Any, name: str, seen: dict) -> None:
    """Make a ``runtime.triton.launch.TritonLauncher`` check instead of launch: every call must pass an
    explicit key, and each key must stand for one specialization (the generic key Triton's
    arguments give), recorded in ``seen``. Nothing is compiled or run, so no GPU is needed.

    Example:
        >>> seen = {}   # spy_launch_keys(triton_kernels._decode_split, "split", seen), then call the op
    """
    def call(self, grid, args, num_warps=4, num_stages=2, key=None):
        assert key is not None, name
        generic = launcher._key(args, num_warps, num_stages)
        assert seen.setdefault((name, key), generic) == generic, (name, key)
    launcher.__class__ = type("Spy", (launcher.__class__,), {"__call__": call})


def run_launch_key_probe(probe: Any) -> str:
    """Run a launch-key probe script in a fresh process without ``TRITON_INTERPRET`` (a
    specialization key is only computed for compiled launches) and return what it printed;
    raises AssertionError with its output if it failed.

    Example:
        >>> callable(run_launch_key_probe)   # run_launch_key_probe(Path("tests/ops/rotary/launch_keys_probe.py"))
        True
    """
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
    done = subprocess.run([sys.executable, str(probe)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout
