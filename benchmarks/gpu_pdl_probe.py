"""Probe: does programmatic dependent launch (PDL) shorten a decode-like chain of kernels?

A 1B decode step is ~180 dependent kernels; each GEMV's first weight loads wait for the kernel
before it to finish, though weights never depend on it. With PDL (Triton's ``launch_pdl=True``
and ``gdc_wait``/``gdc_launch_dependents``) a kernel may start while its predecessor runs, load
what does not depend on it (the weight tile), then wait. This script builds the chain
``norm -> GEMV -> norm -> GEMV ...`` over L different 2048-wide bf16 weights (L2-cold), captures it
in a CUDA graph with PDL off and on, checks the last output against float64 of the same chain,
and times the replays.

    PYTHONPATH=src python3 benchmarks/gpu_pdl_probe.py      # GPU only; prints and writes $OUT/pdl_probe.json
"""
from __future__ import annotations

import sys

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from gpu_decode_breakdown import write_json


@triton.jit
def _norm(x_ptr, y_ptr, K, PDL: tl.constexpr, BLOCK: tl.constexpr):
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < K, other=0.0).to(tl.float32)
    r = tl.rsqrt(tl.sum(x * x, axis=0) / K + 1e-6)
    tl.store(y_ptr + offs, (x * r).to(y_ptr.dtype.element_ty), mask=offs < K)


@triton.jit
def _gemv(x_ptr, w_ptr, out_ptr, N, K, PDL: tl.constexpr, EARLY: tl.constexpr, BLOCK_N: tl.constexpr,
          BLOCK_K: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    kk = tl.arange(0, BLOCK_K)
    w_rows = w_ptr + rows.to(tl.int64)[:, None] * K
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    if PDL:
        if EARLY:   # the first weight tile before the wait: it does not depend on the predecessor
            w0 = tl.load(w_rows + kk[None, :])
            gdc_wait()
            gdc_launch_dependents()
            acc += w0.to(tl.float32) * tl.load(x_ptr + kk).to(tl.float32)[None, :]
        else:
            gdc_wait()
            gdc_launch_dependents()
            w0 = tl.load(w_rows + kk[None, :])
            acc += w0.to(tl.float32) * tl.load(x_ptr + kk).to(tl.float32)[None, :]
    else:
        w0 = tl.load(w_rows + kk[None, :])
        acc += w0.to(tl.float32) * tl.load(x_ptr + kk).to(tl.float32)[None, :]
    for k0 in range(BLOCK_K, K, BLOCK_K):
        w = tl.load(w_rows + k0 + kk[None, :])
        acc += w.to(tl.float32) * tl.load(x_ptr + k0 + kk).to(tl.float32)[None, :]
    tl.store(out_ptr + rows, tl.sum(acc, axis=1).to(out_ptr.dtype.element_ty))


def chain(x, weights, bufs, pdl: bool, early: bool):
    k = x.shape[0]
    cur = x
    for i, w in enumerate(weights):
        y, out = bufs[i]
        _norm[(1,)](cur, y, k, PDL=pdl, BLOCK=triton.next_power_of_2(k), launch_pdl=pdl)
        _gemv[(w.shape[0] // 4,)](y, w, out, w.shape[0], k, PDL=pdl, EARLY=early, BLOCK_N=4, BLOCK_K=2048,
                                 num_warps=4, launch_pdl=pdl)
        cur = out
    return cur


def reference(x, weights):
    cur = x.double()
    for w in weights:
        y = (cur * torch.rsqrt((cur * cur).mean() + 1e-6)).to(torch.bfloat16).double()
        cur = (w.double() @ y).to(torch.bfloat16).double()
    return cur


def main() -> int:
    if not torch.cuda.is_available():
        print("GPU only")
        return 0
    torch.manual_seed(0)
    k = 2048
    layers = 48                        # 48 x 8 MB weights: L2-cold
    weights = [torch.randn(k, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5 for _ in range(layers)]
    x = torch.randn(k, device="cuda", dtype=torch.bfloat16)
    bufs = [(torch.empty(k, device="cuda", dtype=torch.bfloat16), torch.empty(k, device="cuda", dtype=torch.bfloat16))
            for _ in range(layers)]
    want = reference(x, weights)
    results = {}
    for name, pdl, early in (("off", False, False), ("pdl", True, False), ("pdl+early weights", True, True)):
        try:
            for _, out in bufs:
                out.fill_(float("nan"))
            got = chain(x, weights, bufs, pdl, early).double()
            torch.cuda.synchronize()
            eager_err = ((got - want).norm() / want.norm()).item()
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                chain(x, weights, bufs, pdl, early)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                chain(x, weights, bufs, pdl, early)
            for _, out in bufs:
                out.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            graph_err = ((bufs[-1][1].double() - want).norm() / want.norm()).item()
            times = []
            for _ in range(5):
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                for _ in range(20):
                    graph.replay()
                e.record()
                torch.cuda.synchronize()
                times.append(s.elapsed_time(e) * 1e3 / 20)
            us = sorted(times)[2]
            results[name] = {"chain_us": us, "per_pair_us": us / layers, "eager_rel_err": eager_err,
                             "graph_rel_err": graph_err, "bytes_GBps": layers * k * k * 2 / us / 1e3}
            print(f"{name:20s} chain {us:8.1f} us = {us / layers:5.2f} us per norm+GEMV, "
                  f"{results[name]['bytes_GBps']:.0f} GB/s; rel err eager {eager_err:.2e} graph {graph_err:.2e}",
                  flush=True)
        except Exception as exc:   # a failure is a result
            results[name] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
            print(name, results[name]["error"], flush=True)
    write_json(results, "pdl_probe.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
