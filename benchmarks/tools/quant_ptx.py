"""Registers, spills, shared memory and 16-byte loads of the quantized-linear kernel per tile
config, compiled for sm_90 with the launch's specialization (aligned pointers, sizes and strides
divisible by 16). No GPU needed.

    PYTHONPATH=src python benchmarks/tools/quant_ptx.py            # a few configs: registers, spills, loads
    PYTHONPATH=src python benchmarks/tools/quant_ptx.py --matrix   # every constexpr combination compiles (~80 s)
"""
from __future__ import annotations

import re
from typing import Optional

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from opforge.ops.quant import triton_kernels as tk
from ptxas_tool import ptxas_verbose

ALIGNED = ("x_ptr", "w_ptr", "s_ptr", "z_ptr", "b_ptr", "out_ptr", "N", "K", "stride_xm", "stride_w", "k_per_split",
           "words_per_split")


def compile_kernel(bits: int, group: int, x: str, config: tuple, partial: bool = False, symmetric: bool = False):
    block_m, block_n, block_k, use_dot, warps, stages = config
    common = dict(BITS=bits, GROUP=group, PER_ROW=False, SYMMETRIC=symmetric, HAS_BIAS=False, PARTIAL=partial,
                  FIXUP=False, BLOCK_N=block_n, BLOCK_K=block_k)
    if use_dot:
        kernel = tk._qmm_kernel
        mode, offset = tk.code_mode(bits, {"bf16": tk.torch.bfloat16, "fp16": tk.torch.float16}[x])
        consts = dict(common, F32_DOT=False, CODE_MODE=mode, CODE_OFFSET=offset, BLOCK_M=block_m)
        ints = ("M", "N", "K", "k_words", "stride_xm", "stride_w", "k_per_split", "m_tiles", "n_splits")
    else:
        kernel = tk._gemv_kernel
        consts = dict(common, BLOCK_M=block_m, LOP3=True)
        ints = ("M", "N", "K", "k_words", "stride_xm", "stride_w", "words_per_split", "n_splits")
    sig = {"x_ptr": "*" + x, "w_ptr": "*i32" if bits == 4 else "*u8", "s_ptr": "*fp16", "z_ptr": "*fp16",
           "b_ptr": "*fp16", "out_ptr": "*" + x, "ws_ptr": "*fp32", "cnt_ptr": "*i32"}
    sig.update({a: "i32" for a in ints})
    aligned = [a for a in ALIGNED + ("k_words",) if a in kernel.arg_names]
    attrs = {(kernel.arg_names.index(a),): [["tt.divisibility", 16]] for a in aligned}
    return _compile(kernel, sig, consts, warps, stages, attrs)


def report(compiled) -> str:
    ptx = compiled.asm["ptx"]
    out = ptxas_verbose(ptx)
    used = re.search(r"Used (\d+) registers", out)
    spills = re.search(r"(\d+) bytes spill stores", out)
    v4 = len(re.findall(r"ld\.global[^\n]*\.v4", ptx))
    cp_async = len(re.findall(r"cp\.async\.(?:ca|cg)[^\n]*16", ptx))
    cvt = len(re.findall(r"cvt\.rn\.f32\.s32|cvt\.rn\.f32\.u32", ptx))
    return (f"{used.group(1) if used else '?'} regs, {spills.group(1) if spills else '?'} B spilled, "
            f"shared {compiled.metadata.shared} B, {v4} v4 loads, {cp_async} 16-B cp.async, {cvt} int->float cvt")


def _compile(kernel, sig: dict, consts: dict, warps: int = 4, stages: int = 3, attrs: Optional[dict] = None):
    sig = dict(sig, **{k: "constexpr" for k in consts})
    return triton.compile(ASTSource(kernel, sig, constexprs=consts, attrs=attrs), target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": warps, "num_stages": stages})


def compile_matrix() -> int:
    """Compile every constexpr combination the launches can ask for (the GEMV and dot kernels,
    the dequantize and combine kernels) for sm_90; print failures; return their count."""
    import itertools
    import time

    t0, fails = time.time(), 0
    dtypes = {"bf16": tk.torch.bfloat16, "fp16": tk.torch.float16}
    for bits, per_row, sym, split, bias, x, group, kind in itertools.product(
            (4, 8), (False, True), (False, True), ("none", "combine", "fixup"), (False, True), ("bf16", "fp16"),
            (32, 128), ("gemv", "dot")):
        if per_row and group == 32:
            continue
        common = dict(BITS=bits, GROUP=group, PER_ROW=per_row, SYMMETRIC=sym, HAS_BIAS=bias,
                      PARTIAL=split != "none", FIXUP=split == "fixup",
                      BLOCK_N=64, BLOCK_K=128 if kind == "gemv" else min(group, 128))
        sig = {"x_ptr": "*" + x, "w_ptr": "*i32" if bits == 4 else "*u8", "s_ptr": "*fp16", "z_ptr": "*fp16",
               "b_ptr": "*" + x, "out_ptr": "*" + x, "ws_ptr": "*fp32", "cnt_ptr": "*i32"}
        if kind == "gemv":
            kernel, consts = tk._gemv_kernel, dict(common, BLOCK_M=4 if bias else 1, LOP3=x == "bf16")
            sig.update({a: "i32" for a in ("M", "N", "K", "k_words", "stride_xm", "stride_w", "words_per_split",
                                           "n_splits")})
        else:
            mode, offset = tk.code_mode(bits, dtypes[x])
            kernel = tk._qmm_kernel
            consts = dict(common, F32_DOT=False, CODE_MODE=mode, CODE_OFFSET=offset, BLOCK_M=16)
            sig.update({a: "i32" for a in ("M", "N", "K", "k_words", "stride_xm", "stride_w", "k_per_split",
                                           "m_tiles", "n_splits")})
        try:
            _compile(kernel, sig, consts)
        except Exception as exc:
            fails += 1
            print("FAIL", kind, bits, per_row, sym, split, bias, x, group, repr(exc)[-300:])
    for bits, per_row, sym, out in itertools.product((4, 8), (False, True), (False, True), ("bf16", "fp16", "fp32")):
        try:
            _compile(tk._dequant_kernel, {"w_ptr": "*i32" if bits == 4 else "*u8", "s_ptr": "*fp16",
                                          "z_ptr": "*fp16", "out_ptr": "*" + out, "N": "i32", "K": "i32",
                                          "k_words": "i32", "stride_w": "i32"},
                     dict(BITS=bits, GROUP=128, PER_ROW=per_row, SYMMETRIC=sym, BLOCK_N=32, BLOCK_K=128))
        except Exception as exc:
            fails += 1
            print("FAIL dequant", bits, per_row, sym, out, repr(exc)[-300:])
    for bias in (False, True):
        try:
            _compile(tk._combine_kernel, {"ws_ptr": "*fp32", "b_ptr": "*bf16", "out_ptr": "*bf16", "MN": "i32",
                                          "N": "i32"}, dict(SPLIT=4, HAS_BIAS=bias, BLOCK=1024))
        except Exception as exc:
            fails += 1
            print("FAIL combine", repr(exc)[-300:])
    print(f"compile matrix: {fails} failures ({time.time() - t0:.0f} s)")
    return fails


def main() -> None:
    import sys
    if "--matrix" in sys.argv:
        sys.exit(1 if compile_matrix() else 0)
    for bits in (4, 8):
        for cfg in [(1, 64, 128, False, 4, 3), (1, 128, 128, False, 4, 3), (1, 256, 128, False, 4, 3),
                    (1, 64, 256, False, 4, 3), (4, 64, 128, False, 4, 3), (4, 128, 128, False, 4, 3),
                    (8, 32, 128, False, 4, 3), (8, 64, 128, False, 4, 3), (16, 32, 128, False, 4, 3),
                    (16, 64, 128, True, 4, 3), (64, 128, 64, True, 4, 3), (128, 128, 64, True, 8, 3)]:
            for x in ("bf16",):
                try:
                    info = report(compile_kernel(bits, 128, x, cfg))
                except Exception as exc:
                    info = f"error: {type(exc).__name__}: {str(exc)[:300]}"
                print(f"int{bits} g128 {x} {str(cfg):30s} {info}", flush=True)


if __name__ == "__main__":
    main()
