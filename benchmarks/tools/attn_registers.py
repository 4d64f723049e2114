"""Compile the attention kernels for sm_90 (no GPU needed) and report registers and spills (ptxas -v).

Catches GPU-only compile errors before a GPU run, and shows what each default tile costs.

    PYTHONPATH=src python benchmarks/tools/attn_registers.py
"""
from __future__ import annotations

import re

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from opforge.ops.attention import config, triton_kernels as tk
from opforge.runtime.triton.launch import next_power_of_2
from ptxas_tool import ptxas_verbose

DT = {"bf16": "bf16", "fp16": "fp16", "fp32": "fp32"}


def compile_ptx(kernel, pointers: dict, ints: tuple, floats: tuple, consts: dict, warps: int, stages: int) -> str:
    sig = dict(pointers)
    sig.update({a: "i32" for a in ints})
    sig.update({a: "fp32" for a in floats})
    sig.update({k: "constexpr" for k in consts})
    sig = {a: sig[a] for a in kernel.arg_names}   # the kernel's parameter order
    aligned = list(pointers) + [a for a in ints if a.endswith(("_sb", "_sh", "_ss"))]
    attrs = {(kernel.arg_names.index(a),): [["tt.divisibility", 16]] for a in aligned}
    compiled = triton.compile(ASTSource(kernel, sig, constexprs=consts, attrs=attrs),
                              target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": stages})
    return compiled.asm["ptx"]


def ptxas(ptx_text: str) -> str:
    report = ptxas_verbose(ptx_text)
    used = re.search(r"Used (\d+) registers", report)
    spills = re.search(r"(\d+) bytes spill stores", report)
    smem = re.search(r"(\d+) bytes smem", report)
    return (f"{used.group(1) if used else '?'} registers, {spills.group(1) if spills else '?'} B spilled, "
            f"{smem.group(1) if smem else '?'} B static smem")


def prefill(dtype: str, d: int, causal: bool, cfg=None) -> str:
    bm, bn, warps, stages = cfg or config.prefill_config(d, 4 if dtype == "fp32" else 2)
    bd = config.head_block(d)
    ptrs = {a: "*" + dtype for a in ("q_ptr", "k_ptr", "v_ptr", "o_ptr")}
    ints = ("sq", "sk", "hq", "group", "q_sb", "q_sh", "q_ss", "k_sb", "k_sh", "k_ss", "v_sb", "v_sh", "v_ss",
            "o_sb", "o_sh", "o_ss")
    consts = dict(D=d, BLOCK_D=bd, PAD_D=bd != d, BLOCK_M=bm, BLOCK_N=bn, CAUSAL=causal, DOT_F32=False,
                  IEEE=dtype == "fp32", SCALE_POS=True)
    return f"{bm}x{bn} w{warps} s{stages}: " + ptxas(compile_ptx(tk._prefill_kernel, ptrs, ints, ("qk_scale",),
                                                                 consts, warps, stages))


def decode(dtype: str, d: int, rows: int, cfg=None, direct: bool = False) -> str:
    br, bn, warps, stages = cfg or config.decode_config(d, 4 if dtype == "fp32" else 2, rows)
    bd = config.head_block(d)
    ptrs = {"q_ptr": "*" + dtype, "k_ptr": "*" + dtype, "v_ptr": "*" + dtype, "lens_ptr": "*i32",
            "po_ptr": "*fp32", "o_ptr": "*" + dtype}
    ints = ("lse_off", "hkv", "hq", "sq", "rows", "s_max", "split_len", "num_splits", "q_sb", "q_sh", "q_ss",
            "k_sb", "k_sh", "k_ss", "v_sb", "v_sh", "v_ss")
    consts = dict(D=d, BLOCK_D=bd, BLOCK_R=br, BLOCK_N=bn, DOT_F32=False, IEEE=dtype == "fp32", DIRECT=direct,
                  PAD_D=bd != d, BY_LENGTH=not direct, PDL=False)
    return f"{br}x{bn} w{warps} s{stages}: " + ptxas(compile_ptx(tk._decode_split_kernel, ptrs, ints, ("qk_scale",),
                                                                 consts, warps, stages))


def combine(d: int, splits: int) -> str:
    bs = max(2, next_power_of_2(splits))
    consts = dict(D=d, BLOCK_D=config.head_block(d), BLOCK_S=bs, CHUNK_S=min(bs, 16), PDL=False)
    return ptxas(compile_ptx(tk._decode_combine_kernel, {"po_ptr": "*fp32", "o_ptr": "*bf16"},
                             ("lse_off", "num_splits"), (), consts, 2, 2))


def main() -> None:
    for dtype in ("bf16", "fp32"):
        for d in (64, 80, 96, 128, 256):
            for causal in (False, True):
                print(f"prefill {dtype} D={d:3d} {'causal' if causal else 'full  '} {prefill(dtype, d, causal)}",
                      flush=True)
    for dtype in ("bf16", "fp32"):
        for d in (64, 128, 256):
            for rows in (4, 16, 128):
                print(f"decode  {dtype} D={d:3d} rows={rows:3d} {decode(dtype, d, rows)}", flush=True)
    print(f"decode  bf16 D=128 rows=4 one split (direct) {decode('bf16', 128, 4, direct=True)}", flush=True)
    for d in (64, 128, 256):
        print(f"combine D={d} splits=64: {combine(d, 64)}")


if __name__ == "__main__":
    main()
