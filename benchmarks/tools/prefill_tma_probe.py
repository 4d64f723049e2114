"""A candidate Hopper prefill attention kernel: Q, K and V through TMA tensor descriptors, the
key loop optionally warp-specialized (``tl.range(..., warp_specialize=True)``: a producer
warp group issues the TMA loads while the consumers run the MMAs and the softmax). Timed beside
opforge's prefill kernel (its default, and forced to pointer loads and to descriptors) and SDPA's
cuDNN and flash backends, each output checked first.

The candidate takes contiguous (B, H, S, D) tensors with S a multiple of the tiles (a probe, not
the product kernel: it does not mask a ragged end).

    PYTHONPATH=src:benchmarks/tools python benchmarks/tools/prefill_tma_probe.py --ptx   # sm_90 compile, no GPU
    PYTHONPATH=src:benchmarks/tools python benchmarks/tools/prefill_tma_probe.py         # check and time (GPU)
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys
import time

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634


@triton.jit
def _tile(acc, m_i, l_i, q, k, v, offs_m, cols, qk_scale, MASKED: tl.constexpr):
    """One K/V tile into the running (acc, max, sum); MASKED (every tile of a causal call): key j
    is seen by row i only if j <= i."""
    s = tl.dot(q, tl.trans(k))
    if MASKED:
        s = tl.where(cols[None, :] <= offs_m[:, None], s * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        p = tl.exp2(s - m_new[:, None])
    else:
        m_new = tl.maximum(m_i, tl.max(s, axis=1) * qk_scale)
        p = tl.exp2(s * qk_scale - m_new[:, None])
    alpha = tl.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None]
    acc = tl.dot(p.to(v.dtype), v, acc)
    return acc, m_new, l_i


@triton.jit
def _tma_prefill(desc_q, desc_k, desc_v, o_ptr, seq, hq, group, qk_scale,
                 D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
                 WS: tl.constexpr):
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
    bh = tl.program_id(1)
    kv_bh = (bh // hq) * (hq // group) + (bh % hq) // group
    q_row = bh * seq + pid_m * BLOCK_M
    kv_row = kv_bh * seq
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    q = desc_q.load([q_row, 0])
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    if CAUSAL:
        hi = (pid_m + 1) * BLOCK_M
    else:
        hi = seq
    if CAUSAL and not WS:
        # two loops: the tiles left of the diagonal unmasked, then the diagonal's tiles masked
        for start_n in tl.range(0, pid_m * BLOCK_M, BLOCK_N):
            k = desc_k.load([kv_row + start_n, 0])
            v = desc_v.load([kv_row + start_n, 0])
            acc, m_i, l_i = _tile(acc, m_i, l_i, q, k, v, offs_m, start_n + offs_n, qk_scale, False)
        for start_n in tl.range(pid_m * BLOCK_M, hi, BLOCK_N):
            k = desc_k.load([kv_row + start_n, 0])
            v = desc_v.load([kv_row + start_n, 0])
            acc, m_i, l_i = _tile(acc, m_i, l_i, q, k, v, offs_m, start_n + offs_n, qk_scale, True)
    else:
        # one loop: the pass that warp-specializes a loop fails on a second loop after it (Triton
        # 3.6), so under CAUSAL every tile masks (one select per score; row i always sees key 0)
        for start_n in tl.range(0, hi, BLOCK_N, warp_specialize=WS):
            k = desc_k.load([kv_row + start_n, 0])
            v = desc_v.load([kv_row + start_n, 0])
            acc, m_i, l_i = _tile(acc, m_i, l_i, q, k, v, offs_m, start_n + offs_n, qk_scale, CAUSAL)
    # a plain store: the warp-specializing pass splits the rows between two consumer groups, and a
    # descriptor store of a (BLOCK_M / 2)-row half no longer matches a BLOCK_M-row descriptor
    rows = (q_row + tl.arange(0, BLOCK_M)).to(tl.int64)
    tl.store(o_ptr + rows[:, None] * D + tl.arange(0, D)[None, :], (acc / l_i[:, None]).to(o_ptr.dtype.element_ty))


def candidate(q, k, v, causal: bool, bm: int, bn: int, warps: int, stages: int, ws: bool) -> torch.Tensor:
    from triton.tools.tensor_descriptor import TensorDescriptor

    b, hq, s, d = q.shape
    hkv = k.shape[1]
    out = torch.full_like(q, float("nan"))   # poisoned: a row the kernel skips stays NaN
    flat = lambda t, rows: TensorDescriptor.from_tensor(t.view(-1, d), [rows, d])   # noqa: E731
    grid = (s // bm, b * hq)
    _tma_prefill[grid](flat(q, bm), flat(k, bn), flat(v, bn), out, s, hq, hq // hkv,
                       LOG2E / math.sqrt(d), D=d, BLOCK_M=bm, BLOCK_N=bn, CAUSAL=causal, WS=ws,
                       num_warps=warps, num_stages=stages)
    return out


VARIANTS = {   # name: (BLOCK_M, BLOCK_N, warps, stages, warp-specialized)
    "tma 128x128 w8 s3": (128, 128, 8, 3, False),
    "tma 128x64 w8 s3": (128, 64, 8, 3, False),
    "tma 128x128 w8 s2": (128, 128, 8, 2, False),
    "tma 128x128 w4 s2 ws": (128, 128, 4, 2, True),
    "tma 128x128 w4 s3 ws": (128, 128, 4, 3, True),
    "tma 128x64 w4 s3 ws": (128, 64, 4, 3, True),
}


def ptx_report() -> int:
    """Compile every variant for sm_90 (no GPU): registers, spills, whether warp groups were made."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from ptxas_tool import ptxas_verbose
    import re

    fails = 0
    for name, (bm, bn, warps, stages, ws) in VARIANTS.items():
        for causal in (False, True):
            sig = {"desc_q": f"tensordesc<bf16[{bm}, 128]>", "desc_k": f"tensordesc<bf16[{bn}, 128]>",
                   "desc_v": f"tensordesc<bf16[{bn}, 128]>", "o_ptr": "*bf16",
                   "seq": "i32", "hq": "i32", "group": "i32", "qk_scale": "fp32"}
            consts = dict(D=128, BLOCK_M=bm, BLOCK_N=bn, CAUSAL=causal, WS=ws)
            sig.update({c: "constexpr" for c in consts})
            try:
                compiled = triton.compile(ASTSource(_tma_prefill, sig, constexprs=consts),
                                          target=GPUTarget("cuda", 90, 32),
                                          options={"num_warps": warps, "num_stages": stages})
            except Exception as exc:   # noqa: BLE001 - a probe reports every failure and goes on
                fails += 1
                print(f"{name} causal={causal}: FAILED {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
                continue
            rep = ptxas_verbose(compiled.asm["ptx"])
            regs = re.search(r"Used (\d+) registers", rep)
            spill = re.search(r"(\d+) bytes spill stores", rep)
            ttgir = compiled.asm["ttgir"]
            print(f"{name} causal={causal}: {regs.group(1) if regs else '?'} regs, "
                  f"{spill.group(1) if spill else '?'} B spilled, shared {compiled.metadata.shared} B, "
                  f"warp_specialize ops {ttgir.count('ttg.warp_specialize')}, "
                  f"setmaxnreg {compiled.asm['ptx'].count('setmaxnreg')}, "
                  f"wgmma {compiled.asm['ptx'].count('wgmma.mma_async')}, "
                  f"tma loads {compiled.asm['ptx'].count('cp.async.bulk.tensor')}", flush=True)
    return fails


def median_us(clock, fn, reps: int = 30) -> float:
    """Median GPU time of one call (the bench harness's event clock), after 3 warm-up calls."""
    for _ in range(3):
        fn()
    return statistics.median(clock.device_times(fn, [()], reps, host_us=100.0))


SWEEP = {   # head dim: (BLOCK_M, BLOCK_N, warps, stages) of opforge's prefill; None: its default for the call
    128: (None, (128, 128, 8, 3), (128, 128, 8, 2), (128, 64, 8, 3), (64, 128, 4, 3), (64, 64, 4, 3), (64, 64, 4, 2),
          (128, 32, 8, 3)),
    64: (None, (128, 64, 8, 3), (128, 64, 8, 2), (128, 64, 4, 3), (128, 128, 8, 3), (64, 64, 4, 3)),
}
#: (B, H, S, D, through descriptors) of the sweep: pointer loads where a model's call is under
#: ``PREFILL_TMA_MIN_FLOPS``
SWEEP_SHAPES = ((16, 32, 1024, 128, True), (8, 32, 2048, 128, True), (4, 32, 4096, 128, True),
                (1, 32, 16384, 128, True), (16, 32, 1024, 64, True), (8, 32, 2048, 64, True), (4, 32, 4096, 64, True),
                (1, 32, 1024, 128, False), (1, 32, 2048, 128, False), (1, 32, 2048, 64, False),
                (4, 32, 1024, 64, False))


def sweep(budget: float) -> int:
    """opforge's prefill kernel at each ``SWEEP`` configuration on ``SWEEP_SHAPES``, beside cuDNN."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from int4_candidate import write_json
    from opforge.bench.timing import clock_for
    from opforge.ops.attention.problem import prepare_attention
    from opforge.ops.attention.triton_kernels import launch_prefill

    t0, rows = time.time(), []
    clock = clock_for(torch.device("cuda"))
    for b, h, s, d, tma in SWEEP_SHAPES:
        for causal in (True, False):
            if time.time() - t0 > budget:
                break
            q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            flops = 4 * b * h * s * s * d / (2 if causal else 1)

            def cudnn():
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
            want = cudnn().float()
            cudnn_us = median_us(clock, cudnn)
            call = prepare_attention(q, k, v, causal, None)
            for cfg in SWEEP[d]:
                fn = lambda cfg=cfg: launch_prefill(call, *(cfg or ()), tma=tma)   # noqa: E731
                try:
                    err = ((fn().float() - want).norm() / want.norm()).item()
                    us = median_us(clock, fn)
                except Exception as exc:   # noqa: BLE001 - a probe reports every failure and goes on
                    print(f"{b}x{h}x{s}x{d} {cfg}: FAILED {type(exc).__name__}: {str(exc)[:200]}", flush=True)
                    continue
                line = {"shape": f"{b}x{h}x{s}x{d}", "causal": causal, "tma": tma,
                        "config": "x".join(map(str, cfg)) if cfg else "default",
                        "us": round(us, 1), "tflops": round(flops / us / 1e6, 1), "vs_cudnn": round(cudnn_us / us, 3),
                        "err_vs_cudnn": err}
                rows.append(line)
                print(line, flush=True)
            write_json(rows, "prefill_sweep.json")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ptx", action="store_true", help="compile for sm_90 only (no GPU)")
    parser.add_argument("--budget", type=float, default=90.0, help="seconds for the timed shapes")
    parser.add_argument("--sweep", action="store_true",
                        help="time opforge's prefill over tiles, warps and stages instead")
    parser.add_argument("--ws", action="store_true",
                        help="run the warp-specialized variants instead of the others (with Triton 3.6 on an H100 "
                             "the first launch did not return within 130 s: run them under `timeout`)")
    args = parser.parse_args()
    if args.ptx:
        return 1 if ptx_report() else 0

    import opforge
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from int4_candidate import write_json
    from opforge.bench.timing import clock_for
    from opforge.ops.attention.problem import prepare_attention
    from opforge.ops.attention.triton_kernels import launch_prefill

    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    if args.sweep:
        return sweep(args.budget)
    torch.manual_seed(0)
    t0 = time.time()
    clock = clock_for(torch.device("cuda"))
    rows, ok = [], True
    variants = {name: cfg for name, cfg in VARIANTS.items() if cfg[4] == args.ws}
    out_name = "prefill_tma_probe_ws.json" if args.ws else "prefill_tma_probe.json"
    # correctness on a small shape (grouped heads) against float64
    q, k, v = (torch.randn(2, h, 512, 128, device="cuda", dtype=torch.bfloat16) for h in (8, 2, 2))
    for causal in (False, True):
        ref = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=causal,
                                                               enable_gqa=True)
        for name, cfg in variants.items():
            try:
                got = candidate(q, k, v, causal, *cfg)
                err = ((got.double() - ref).norm() / ref.norm()).item()
            except Exception as exc:   # noqa: BLE001
                print(f"check {name} causal={causal}: FAILED {type(exc).__name__}: {str(exc)[:300]}", flush=True)
                err = float("inf")
            print(f"check {name} causal={causal}: rel err {err:.2e}", flush=True)
            rows.append({"check": name, "causal": causal, "rel_err": err})
            ok &= err < 1e-2
    backends = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}
    for b, h, s, d in ((4, 32, 4096, 128), (16, 32, 1024, 128), (1, 32, 16384, 128), (4, 32, 4096, 64)):
        for causal in (True, False):
            if time.time() - t0 > args.budget:
                break
            q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            flops = 4 * b * h * s * s * d / (2 if causal else 1)
            fns = {}
            for name, backend in backends.items():   # cuDNN first: every row's ratio is to it
                def sdpa(backend=backend):
                    with sdpa_kernel(backend):
                        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
                fns[name] = sdpa
            fns["opforge"] = lambda: opforge.attention(q, k, v, causal=causal)
            call = prepare_attention(q, k, v, causal, None)
            fns["opforge pointers"] = lambda call=call: launch_prefill(call, tma=False)
            fns["opforge descriptors"] = lambda call=call: launch_prefill(call, tma=True)
            for name, cfg in variants.items():   # the candidates last: a hang leaves the peers' rows printed
                fns[name] = lambda cfg=cfg: candidate(q, k, v, causal, *cfg)
            want = fns["cudnn"]().float()
            cudnn_us = None
            for name, fn in fns.items():
                try:
                    err = ((fn().float() - want).norm() / want.norm()).item()
                    us = median_us(clock, fn)
                except Exception as exc:   # noqa: BLE001
                    print(f"{name}: FAILED {type(exc).__name__}: {str(exc)[:200]}", flush=True)
                    continue
                cudnn_us = cudnn_us or us
                line = {"shape": f"{b}x{h}x{s}x{d}", "causal": causal, "impl": name, "us": round(us, 1),
                        "tflops": round(flops / us / 1e6, 1), "vs_cudnn": round(cudnn_us / us, 3), "err_vs_cudnn": err}
                rows.append(line)
                print(line, flush=True)
            write_json(rows, out_name)   # after every shape: a cut-off run keeps what it measured
    if not args.ws:   # host time per call where the kernel is short: building three descriptors costs some
        q, k, v = (torch.randn(1, 32, 128, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        call = prepare_attention(q, k, v, True, None)
        for tma in (False, True):
            for _ in range(10):
                launch_prefill(call, tma=tma)
            torch.cuda.synchronize()
            t = time.perf_counter()
            for _ in range(300):
                launch_prefill(call, tma=tma)
            torch.cuda.synchronize()
            line = {"shape": "1x32x128x128", "causal": True, "impl": "descriptors" if tma else "pointers",
                    "wall_us_per_call": round((time.perf_counter() - t) / 300 * 1e6, 1)}
            rows.append(line)
            print(line, flush=True)
        write_json(rows, out_name)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
