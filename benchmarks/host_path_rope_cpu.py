"""Host time of the rotary, kv-append and delay call paths without a GPU: launches faked.

The kernel launchers are replaced by no-ops and the CPU-only value checks (positions in the
table, cache positions in range; a CUDA call does not run them) are switched off, so what is
left is the Python a CUDA call runs around its launch: signature, validation (first call of a
signature only), selection, launch arguments. Compare with one torch eager op on this host.

    PYTHONPATH=src python benchmarks/host_path_rope_cpu.py
"""
from __future__ import annotations

import os
import timeit

os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

import opforge  # noqa: E402
import opforge.ops.rotary as rotary  # noqa: E402
from opforge.ops.delay import triton_kernels as dtk  # noqa: E402
from opforge.ops.rotary import cases as rc, triton_kernels as rtk  # noqa: E402


def _fake_launches() -> None:
    def no_launch(self, grid, args, num_warps=4, num_stages=2, key=None):
        return None

    for launcher in (rtk._rotary, rtk._kv_append, rtk._rotary_append, dtk._delay):
        launcher.__class__ = type("NoLaunch", (launcher.__class__,), {"__call__": no_launch})
    rotary.check_table_range = lambda *a: None
    rotary.check_append_range = lambda *a: None


def per_call_us(fn, calls: int = 20000, repeat: int = 5) -> float:
    fn()
    return min(timeit.repeat(fn, number=calls, repeat=repeat)) / calls * 1e6


def main() -> None:
    _fake_launches()
    q, k, cos, sin, pos = rc.make_rotary_inputs(64, 32, 8, 1, 128, 128, torch.bfloat16, "cpu", max_positions=64)
    v = torch.randn_like(k)
    kc = torch.randn(64, 8, 16, 128, dtype=torch.bfloat16)
    vc = torch.randn_like(kc)
    lens = torch.full((64,), 3, dtype=torch.int32)
    codes = torch.randint(0, 9, (1, 3072, 9), dtype=torch.int32)
    d = [0, 8, 9, 10, 11, 12, 13, 14, 15]
    calls = {
        "rotary_embedding inplace": lambda: opforge.rotary_embedding(q, k, cos, sin, pos, inplace=True),
        "rotary_embedding (new outputs)": lambda: opforge.rotary_embedding(q, k, cos, sin, pos),
        "kv_cache_append check=False": lambda: opforge.kv_cache_append(kc, vc, k, v, lens, check=False),
        "rotary_kv_cache_append check=False":
            lambda: opforge.rotary_kv_cache_append(q, k, v, kc, vc, lens, cos, sin, check=False),
        "apply_delay": lambda: opforge.apply_delay(codes, d, bos_id=1, pad_id=2),
        "revert_delay": lambda: opforge.revert_delay(codes, d, pad_id=2),
    }
    print(f"{'call (decode sizes, launch faked)':40s} per call")
    print(f"{'torch.add(codes, 1) (eager op)':40s} {per_call_us(lambda: torch.add(codes, 1)):6.2f} us")
    print(f"{'torch.empty_like(q)':40s} {per_call_us(lambda: torch.empty_like(q)):6.2f} us")
    with opforge.backend("triton"):
        for label, fn in calls.items():
            print(f"{label:40s} {per_call_us(fn):6.2f} us", flush=True)


if __name__ == "__main__":
    main()
