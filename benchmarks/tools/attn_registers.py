"""Compile the attention kernels for sm_90 (no GPU needed) and report registers and spills (ptxas -v).

Catches GPU-only compile errors before a GPU run, and shows what each default tile costs.

    PYTHONPATH=src python benchmarks/tools/attn_registers.py
"""
from __future__ import annotations

from opforge.ops.attention import config, triton_kernels as tk
from opforge.runtime.triton.launch import next_power_of_2
from ptxas_tool import compile_sm90, register_line

DT = {"bf16": "bf16", "fp16": "fp16", "fp32": "fp32"}
ALIGNED = ("_sb", "_sh", "_ss")    # strides: multiples of 16 elements on the tensors the kernels see


def registers(kernel, pointers: dict, consts: dict, warps: int, stages: int, floats: tuple = ("qk_scale",)) -> str:
    return register_line(compile_sm90(kernel, pointers, floats, consts, warps, stages, ALIGNED), smem=True)


def prefill(dtype: str, d: int, causal: bool, cfg=None, tma: bool = False) -> str:
    bm, bn, warps, stages = cfg or config.prefill_config(d, 4 if dtype == "fp32" else 2, tma=tma)
    bd = config.head_block(d)
    ptrs = {a: "*" + dtype for a in ("q_src", "k_src", "v_src", "o_ptr")}
    if tma:   # (B, H, S, D) descriptors whose block is one head's rows
        ptrs.update({a: f"tensordesc<{dtype}[1, 1, {rows}, {bd}]>"
                     for a, rows in (("q_src", bm), ("k_src", bn), ("v_src", bn))})
    consts = dict(D=d, BLOCK_D=bd, PAD_D=bd != d, BLOCK_M=bm, BLOCK_N=bn, CAUSAL=causal, DOT_F32=False,
                  IEEE=dtype == "fp32", SCALE_POS=True, TMA=tma)
    return f"{bm}x{bn} w{warps} s{stages}: " + registers(tk._prefill_kernel, ptrs, consts, warps, stages)


def decode(dtype: str, d: int, rows: int, cfg=None, direct: bool = False) -> str:
    br, bn, warps, stages = cfg or config.decode_config(d, 4 if dtype == "fp32" else 2, rows)
    bd = config.head_block(d)
    ptrs = {"q_ptr": "*" + dtype, "k_ptr": "*" + dtype, "v_ptr": "*" + dtype, "lens_ptr": "*i32",
            "po_ptr": "*fp32", "o_ptr": "*" + dtype}
    consts = dict(D=d, BLOCK_D=bd, BLOCK_R=br, BLOCK_N=bn, DOT_F32=False, IEEE=dtype == "fp32", DIRECT=direct,
                  PAD_D=bd != d, BY_LENGTH=not direct, PDL=False)
    return f"{br}x{bn} w{warps} s{stages}: " + registers(tk._decode_split_kernel, ptrs, consts, warps, stages)


def combine(d: int, splits: int) -> str:
    bs = max(2, next_power_of_2(splits))
    consts = dict(D=d, BLOCK_D=config.head_block(d), BLOCK_S=bs, CHUNK_S=min(bs, 16), PDL=False)
    return registers(tk._decode_combine_kernel, {"po_ptr": "*fp32", "o_ptr": "*bf16"}, consts, 2, 2, floats=())


def main() -> None:
    for dtype in ("bf16", "fp32"):
        for d in (64, 80, 96, 128, 256):
            for causal in (False, True):
                print(f"prefill {dtype} D={d:3d} {'causal' if causal else 'full  '} {prefill(dtype, d, causal)}",
                      flush=True)
    for d in config.PREFILL_TMA_HEAD_DIMS:
        for causal in (False, True):
            print(f"prefill bf16 D={d:3d} {'causal' if causal else 'full  '} descriptors "
                  f"{prefill('bf16', d, causal, tma=True)}", flush=True)
    for d in config.CAUSAL_SMALL_TILES_MAX_KEYS:
        for tma in (False, True):
            print(f"prefill bf16 D={d:3d} causal small tiles{' descriptors' if tma else ''} "
                  f"{prefill('bf16', d, True, config.CAUSAL_SMALL_TILES, tma)}", flush=True)
    for dtype in ("bf16", "fp32"):
        for d in (64, 128, 256):
            for rows in (4, 16, 128):
                print(f"decode  {dtype} D={d:3d} rows={rows:3d} {decode(dtype, d, rows)}", flush=True)
    print(f"decode  bf16 D=128 rows=4 one split (direct) {decode('bf16', 128, 4, direct=True)}", flush=True)
    for d in (64, 128, 256):
        print(f"combine D={d} splits=64: {combine(d, 64)}")


if __name__ == "__main__":
    main()
