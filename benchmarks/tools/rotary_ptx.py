"""Compile the rotary kernel for sm_90 without a GPU and report registers and vector widths.

For the prefill configuration (bf16, D = R = 128, rotate-half, 16-byte divisible strides):
heads per program x num_warps as in the rotary prefill tile sweep (benchmarks/NOTES.md, rotary).

    PYTHONPATH=src python benchmarks/tools/rotary_ptx.py
"""
from __future__ import annotations

import re

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from opforge.ops.rotary import triton_kernels as tk
from ptxas_tool import ptxas_verbose

CONSTS = ("HBQ", "HBK", "HALF_P", "TAIL_P", "INTERLEAVED", "COPY_TAIL")
# what Triton's specialization marks divisible by 16 at the prefill size (pointers, sizes, strides)
DIVISIBLE = ("q_ptr", "k_ptr", "qo_ptr", "ko_ptr", "cos_ptr", "sin_ptr", "pos_ptr", "S", "HALF", "D", "P", "scos",
             "ssin", "sqb", "sqh", "sqs", "sqob", "sqoh", "sqos", "skb", "skh", "sks", "skob", "skoh", "skos")


def compile_rotary(hbq: int, hbk: int, warps: int):
    kernel = tk._rotary_kernel
    sig = {p: "*bf16" for p in ("q_ptr", "k_ptr", "qo_ptr", "ko_ptr")}
    sig.update({"cos_ptr": "*fp32", "sin_ptr": "*fp32", "pos_ptr": "*i64"})
    sig.update({a: "i32" for a in kernel.arg_names if a not in sig and a not in CONSTS})
    consts = dict(HBQ=hbq, HBK=hbk, HALF_P=64, TAIL_P=1, INTERLEAVED=False, COPY_TAIL=False)
    sig.update({c: "constexpr" for c in consts})
    attrs = {(kernel.arg_names.index(a),): [["tt.divisibility", 16]] for a in DIVISIBLE}
    return triton.compile(ASTSource(kernel, sig, constexprs=consts, attrs=attrs), target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": warps})


def report(compiled) -> str:
    ptx = compiled.asm["ptx"]
    out = ptxas_verbose(ptx)
    regs = re.search(r"Used (\d+) registers", out)
    n = {name: len(re.findall(pattern, ptx)) for name, pattern in (
        ("ld.v4", r"ld\.global[^\n]*\.v4"), ("ld.v2", r"ld\.global[^\n]*\.v2"), ("st.v4", r"st\.global[^\n]*\.v4"),
        ("st.v2", r"st\.global[^\n]*\.v2"), ("scalar ld", r"ld\.global\.(?!v)"))}
    return f"{regs.group(1) if regs else '?'} regs, " + ", ".join(f"{k} {v}" for k, v in n.items())


def main() -> None:
    for hbq, hbk, warps in ((32, 8, 4), (32, 8, 2), (32, 8, 8), (16, 8, 2), (16, 8, 4), (8, 8, 2)):
        print(f"q heads/program {hbq:2d}, k heads/program {hbk}, {warps} warps: {report(compile_rotary(hbq, hbk, warps))}")


if __name__ == "__main__":
    main()
