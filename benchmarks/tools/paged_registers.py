"""Compile the paged kernels for sm_90 (no GPU needed) and report registers and spills (ptxas -v).

Catches GPU-only compile errors before a GPU run, and shows what each default tile costs.

    PYTHONPATH=src python benchmarks/tools/paged_registers.py
"""
from __future__ import annotations

import triton

from opforge.ops.paged import config, triton_append as ta, triton_kernels as tk
from ptxas_tool import compile_sm90, register_line

STRIDES = ("_st", "_sh", "_sb", "_ss", "_s")


def compile_ptx(kernel, pointers: dict, floats: tuple, consts: dict, warps: int, stages: int) -> str:
    return compile_sm90(kernel, pointers, floats, consts, warps, stages, STRIDES)


def ptxas(ptx_text: str) -> str:
    return register_line(ptx_text)


def _attention_pointers(dtype: str) -> dict:
    ptrs = {a: "*" + dtype for a in ("q_ptr", "k_ptr", "v_ptr", "o_ptr")}
    ptrs.update({a: "*i32" for a in ("tables_ptr", "lens_ptr", "cu_ptr")})
    ptrs["po_ptr"] = "*fp32"
    return ptrs


def decode(dtype: str, d: int, rows: int, direct: bool, batch: int = 1) -> str:
    br, bn, warps, stages, _ = config.decode_tiles(d, 4 if dtype == "fp32" else 2, rows, batch, 8, 4096, 132)
    consts = dict(BS=16, D=d, BLOCK_D=config.head_block(d), BLOCK_R=br, BLOCK_N=bn, DOT_F32=False,
                  IEEE=dtype == "fp32", DIRECT=direct, PDL=False)
    ptx = compile_ptx(tk._decode_split_kernel, _attention_pointers(dtype), ("qk_scale",), consts, warps, stages)
    return f"{br}x{bn} w{warps} s{stages}: " + ptxas(ptx)


def prefill(dtype: str, d: int) -> str:
    bm, bn, warps, stages = config.prefill_config(d, 4 if dtype == "fp32" else 2)
    consts = dict(BS=16, D=d, BLOCK_D=config.head_block(d), BLOCK_M=bm, BLOCK_N=bn, DOT_F32=False,
                  IEEE=dtype == "fp32", SCALE_POS=True, PDL=False)
    ptx = compile_ptx(tk._prefill_kernel, _attention_pointers(dtype), ("qk_scale",), consts, warps, stages)
    return f"{bm}x{bn} w{warps} s{stages}: " + ptxas(ptx)


def combine(d: int, block_s: int) -> str:
    consts = dict(D=d, BLOCK_D=config.head_block(d), BLOCK_S=block_s, CHUNK_S=16, PDL=False)
    ptrs = {"po_ptr": "*fp32", "o_ptr": "*bf16", "cu_ptr": "*i32"}
    return ptxas(compile_ptx(tk._combine_kernel, ptrs, (), consts, 2, 2))


def append(d: int, heads: int) -> str:
    hb = config.append_heads(heads, d)
    ptrs = {a: "*bf16" for a in ("k_ptr", "v_ptr", "kp_ptr", "vp_ptr")}
    ptrs.update({a: "*i32" for a in ("cu_ptr", "lens_ptr", "tables_ptr")})
    consts = dict(BS=16, LOG_B=6, D=d, D_P=triton.next_power_of_2(d), HB=hb, PDL=False)
    return ptxas(compile_ptx(ta._append_kernel, ptrs, (), consts, 2, 1))


def rotary_append(d: int, rotary_dim: int, interleaved: bool) -> str:
    hb = config.append_heads(32, d)
    half, tail = rotary_dim // 2, d - rotary_dim
    ptrs = {a: "*bf16" for a in ("q_ptr", "k_ptr", "v_ptr", "qo_ptr", "kp_ptr", "vp_ptr")}
    ptrs.update({"cos_ptr": "*fp32", "sin_ptr": "*fp32"})
    ptrs.update({a: "*i32" for a in ("pos_ptr", "cu_ptr", "lens_ptr", "tables_ptr")})
    consts = dict(BS=16, LOG_B=6, HB=hb, HALF_P=triton.next_power_of_2(half),
                  TAIL_P=triton.next_power_of_2(tail) if tail else 0, D_P=triton.next_power_of_2(d),
                  INTERLEAVED=interleaved, Q_TAIL=tail > 0, POS_GIVEN=False, PDL=False)
    return ptxas(compile_ptx(ta._rotary_append_kernel, ptrs, (), consts, 4, 1))


def main() -> None:
    for dtype in ("bf16", "fp32"):
        for d in (64, 128, 256):
            for rows, batch in ((4, 1), (64, 1), (4, 32)):   # batch 32: the 128-key tiles (16-bit, D <= 128)
                for direct in (False, True):
                    print(f"decode  {dtype} D={d:3d} rows={rows:2d} batch={batch:2d} {'direct' if direct else 'split '} "
                          f"{decode(dtype, d, rows, direct, batch)}", flush=True)
    for dtype in ("bf16", "fp16", "fp32"):
        for d in (64, 128, 256):
            print(f"prefill {dtype} D={d:3d} {prefill(dtype, d)}", flush=True)
    for d in (64, 128, 256):
        for block_s in (16, config.MAX_SPLITS):
            print(f"combine D={d:3d} BLOCK_S={block_s:3d}: {combine(d, block_s)}", flush=True)
    for d, heads in ((128, 8), (128, 32), (64, 2)):
        print(f"append  D={d} Hkv={heads}: {append(d, heads)}", flush=True)
    for d, r, inter in ((128, 128, False), (128, 64, False), (64, 64, True)):
        print(f"rotary_append D={d} R={r}{' interleaved' if inter else ''}: {rotary_append(d, r, inter)}", flush=True)


if __name__ == "__main__":
    main()
