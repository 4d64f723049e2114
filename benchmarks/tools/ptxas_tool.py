"""Compile Triton kernels for sm_90 and run triton's bundled ``ptxas -v`` on the PTX: the registers,
spills and shared memory the ``*_ptx.py`` / ``*_registers.py`` scripts report (no GPU needed).

    from ptxas_tool import compile_sm90, register_line   # benchmarks/tools is on sys.path there
"""
from __future__ import annotations

import os
import re
import subprocess
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

PTXAS = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")


def ptxas_verbose(ptx: str, arch: str = "sm_90a") -> str:
    """``ptxas -v``'s report (its stderr) for ``ptx``, assembled in a temporary folder."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.ptx")
        with open(path, "w") as f:
            f.write(ptx)
        return subprocess.run([PTXAS, f"-arch={arch}", "-v", path, "-o", os.path.join(tmp, "k.cubin")],
                              capture_output=True, text=True).stderr


def compile_sm90(kernel, pointers: dict, floats: tuple, consts: dict, warps: int, stages: int,
                 aligned_suffixes: tuple = ()) -> str:
    """PTX of ``kernel`` for sm_90: ``pointers`` (and tensor descriptors) typed as given, ``floats`` fp32, ``consts`` as
    constexprs, every other argument i32; the pointers and the i32 arguments whose names end in
    ``aligned_suffixes`` (strides) marked divisible by 16, as launches on aligned tensors see them."""
    sig = {a: pointers.get(a, "fp32" if a in floats else "constexpr" if a in consts else "i32")
           for a in kernel.arg_names}
    aligned = [a for a in kernel.arg_names if (a in pointers and not pointers[a].startswith("tensordesc"))
               or (sig[a] == "i32" and a.endswith(aligned_suffixes))]
    attrs = {(kernel.arg_names.index(a),): [["tt.divisibility", 16]] for a in aligned}
    compiled = triton.compile(ASTSource(kernel, sig, constexprs=consts, attrs=attrs),
                              target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": stages})
    return compiled.asm["ptx"]


def register_line(ptx: str, smem: bool = False) -> str:
    """"N registers, M B spilled" (and the static shared memory) from ``ptxas -v`` on ``ptx``."""
    report = ptxas_verbose(ptx)
    found = {key: re.search(pattern, report) for key, pattern in
             (("used", r"Used (\d+) registers"), ("spills", r"(\d+) bytes spill stores"), ("smem", r"(\d+) bytes smem"))}
    value = {key: m.group(1) if m else "?" for key, m in found.items()}
    line = f"{value['used']} registers, {value['spills']} B spilled"
    return line + (f", {value['smem']} B static smem" if smem else "")
