"""Registers and spills of the Triton norm kernels per configuration, from ptxas -v. No GPU needed.

Compiles the layer-norm kernels for sm_90 with the launch's specialization (16-byte aligned
pointers, sizes and strides divisible by 16) and runs Triton's bundled ptxas on the PTX.

    python benchmarks/tools/norm_registers.py [--first-shift] [--unpaired]
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from opforge.ops.norm import config, triton_kernels as tk

PTXAS = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
POINTERS = ("x_ptr", "r_ptr", "y_ptr", "s_ptr", "w_ptr", "b_ptr")
INTS = ("rows", "n", "x_inner", "x_so", "x_si", "r_inner", "r_so", "r_si")
ALIGNED = POINTERS + ("n", "x_so", "x_si", "r_so", "r_si")


def compile_ptx(kernel, consts: dict, dtype: str, warps: int) -> str:
    """The sm_90 PTX of a norm kernel (``tk._tile_kernel`` or ``tk._looped_kernel``) for ``dtype``
    ("bf16", "fp16", "fp32") with the given constexprs, specialized as a launch of packed rows is."""
    sig = {a: "*" + dtype for a in POINTERS}
    sig.update({a: "i32" for a in INTS})
    sig["eps"] = "fp32"
    sig.update({k: "constexpr" for k in consts})
    attrs = {(kernel.arg_names.index(a),): [["tt.divisibility", 16]] for a in ALIGNED}
    compiled = triton.compile(ASTSource(kernel, sig, constexprs=consts, attrs=attrs),
                              target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
    return compiled.asm["ptx"]


def registers(kernel, consts: dict, dtype: str, warps: int) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        ptx = os.path.join(tmp, "k.ptx")
        with open(ptx, "w") as f:
            f.write(compile_ptx(kernel, consts, dtype, warps))
        report = subprocess.run([PTXAS, "-arch=sm_90a", "-v", ptx, "-o", os.path.join(tmp, "k.cubin")],
                                capture_output=True, text=True).stderr
    used = re.search(r"Used (\d+) registers", report)
    spills = re.search(r"(\d+) bytes spill stores", report)
    return f"{used.group(1) if used else '?'} registers, {spills.group(1) if spills else '?'} B spilled"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--first-shift", action="store_true", help="the tile kernel shifts by the row's first value")
    ap.add_argument("--unpaired", action="store_true", help="two sums instead of one of pairs (the interpreter's)")
    ap.add_argument("--dtype", default="bf16")
    args = ap.parse_args()
    paired = not args.unpaired
    for res in (False, True):
        base = dict(IS_RMS=False, HAS_RES=res, HAS_W=True, HAS_B=True, PAIRED=paired)
        name = "add_layer_norm" if res else "layer_norm"
        for bm, bn, warps in ((16, 128, 4), (1, 1024, 4), (1, 4096, 4), (1, 16384, 16), (1, 32768, 32)):
            consts = dict(base, BLOCK_M=bm, BLOCK_N=bn, FIRST_SHIFT=args.first_shift)
            print(f"{name:15s} tile {bm}x{bn} {warps:2d} warps: {registers(tk._tile_kernel, consts, args.dtype, warps)}")
        info = registers(tk._looped_kernel, dict(base, CHUNK=config.LOOP_CHUNK), args.dtype, 32)
        print(f"{name:15s} looped {config.LOOP_CHUNK} 32 warps: {info}")


if __name__ == "__main__":
    main()
