"""Host time of the op call paths without a GPU: the compiled launch replaced by a no-op.

What is left is the Python that runs around a launch: validation, selection, launch arguments
(general path), or the signature lookup and the plan (launch plans). The launch itself (Triton's
C launcher, ~4-6 us on the H100 host) and the output allocation on the GPU are not in it.
Norms, softmax, log_softmax and the activations; for the softmax and activation families the
whole ``TritonLauncher.__call__`` is replaced (the norms' general path only fakes
``launch_raw``, which skips the same Python), so their general-path figures lack the launcher's
own key check (~0.3 us).

    TRITON_INTERPRET=1 PYTHONPATH=src python benchmarks/host_path_cpu.py
"""
from __future__ import annotations

import os
import timeit

os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

import opforge  # noqa: E402
from opforge.ops.activation import triton_kernels as ak  # noqa: E402
from opforge.ops.norm import triton_kernels as tk  # noqa: E402
from opforge.ops.softmax import triton_kernels as sk  # noqa: E402
from opforge.runtime import plans  # noqa: E402


class _NoLaunch:
    """Stands in for a TritonLauncher: launches nothing, and hands plans a launch that does nothing."""

    def __call__(self, grid, args, num_warps=4, num_stages=2, key=None):
        return None

    def raw_launcher(self, key):
        return lambda grid_x, raw_args, index: True


def _fake_launches() -> None:
    def launch_raw(key, grid, raw_args, num_warps, index):
        return True

    def raw_launcher(key):
        return lambda grid_x, raw_args, index: True

    for launcher in (tk._tile, tk._looped):
        launcher.launch_raw = launch_raw
        launcher.raw_launcher = raw_launcher
    sk._tile = sk._looped = _NoLaunch()
    ak._pointwise = _NoLaunch()


def per_call_us(fn, calls: int = 20000, repeat: int = 7) -> float:
    return min(timeit.repeat(fn, number=calls, repeat=repeat)) / calls * 1e6


def main() -> None:
    _fake_launches()
    x = torch.randn(2, 32, 256)
    r = torch.randn_like(x)
    w, b = torch.randn(256), torch.randn(256)
    calls = {
        "layer_norm(x, w, b)": lambda: opforge.layer_norm(x, w, b),
        "rms_norm(x, w)": lambda: opforge.rms_norm(x, w),
        "add_rms_norm(x, r, w)": lambda: opforge.add_rms_norm(x, r, w),
        "softmax(x)": lambda: opforge.softmax(x),
        "log_softmax(x)": lambda: opforge.log_softmax(x),
        "silu(x)": lambda: opforge.silu(x),
        "gelu(x)": lambda: opforge.gelu(x),
        "swiglu(x, r)": lambda: opforge.swiglu(x, r),
    }
    per_call_us(lambda: torch.empty_like(x), calls=200000, repeat=3)  # warm-up: clocks, caches
    print(f"{'call (2x32x256 float32, launch faked)':40s} {'general':>9s} {'plan':>9s}   torch.empty_like")
    empty = per_call_us(lambda: torch.empty_like(x))
    with opforge.backend("triton"):
        for label, fn in calls.items():
            plans.set_enabled(False)
            general = per_call_us(fn)
            plans.set_enabled(True)
            fn()
            planned = per_call_us(fn)
            print(f"{label:40s} {general:7.2f}us {planned:7.2f}us   {empty:.2f}us")
    plans.set_enabled(False)


if __name__ == "__main__":
    main()
