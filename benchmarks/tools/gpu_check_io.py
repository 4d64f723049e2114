"""Check, then time, opforge's SafeTensors loader on a GPU (about 40-70 s on an H100).

    PYTHONPATH=src python3 benchmarks/tools/gpu_check_io.py [--gb 3.0] [--out DIR] [--cpu-smoke]

1. Correctness (PASS/FAIL per case, small tensors): every dtype loads bit-exactly onto the device;
   tensors spanning many pinned staging chunks; dtype conversion; quantize="int4"/"int8" on load
   equals opforge.quantize_weight of the same tensor (and dequantizes near float64); GPTQ (v1,
   v2) and AWQ layers built from known codes dequantize exactly; QuantizedWeight save/load.
2. Speed: a ~3 GB file of random bf16 Llama-like tensors is written to /tmp and read once (warm
   page cache), then loaded to cuda with and without quantize="int4". Reported: GB/s into GPU
   memory (file bytes / wall time, synchronized), peak host RSS growth (VmHWM after resetting it,
   minus VmRSS before) against the largest tensor, every loaded tensor compared with a
   regenerated copy. Peers in the same run: safetensors.torch.load_file(device="cuda") and
   safe_open + .to("cuda") per tensor (when safetensors is installed); ceilings: single-thread
   page-cache read into pinned memory, and a pinned host-to-device copy.
   Targets: >= 2 GB/s; RSS growth <= 1.5x the largest tensor.

Writes ``io.json`` into --out (default: $OUT or ./gpu-out). --cpu-smoke runs everything on the
CPU with a ~60 MB file (a typo check, no numbers worth keeping).
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import threading
import time
import traceback
from typing import Any, Callable, Dict, List

import torch

import opforge
from opforge.io import reader as io_reader

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "io"))
from packers import awq_tensors, gptq_tensors  # noqa: E402  (test-side packers, written from the formats)

RESULTS: Dict[str, Any] = {"cases": [], "loads": []}
T0 = time.perf_counter()


def case(name: str, fn: Callable[[], str]) -> None:
    """Run one check; print PASS/FAIL; never let one failure stop the run."""
    try:
        detail = fn() or ""
        status = "PASS"
    except Exception as e:  # noqa: BLE001 - report and continue
        detail = f"{type(e).__name__}: {e}"
        traceback.print_exc()
        status = "FAIL"
    print(f"{status}  {name}  {detail}", flush=True)
    RESULTS["cases"].append({"case": name, "status": status, "detail": detail})


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ---------------------------------------------------------------- host memory
def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


class PeakRSS:
    """Peak resident-set growth over a block: VmHWM after resetting it (clear_refs 5), or, where
    that is not allowed, a 2 ms sampler of VmRSS."""

    def __enter__(self) -> "PeakRSS":
        gc.collect()
        self.base = _status("VmRSS")
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            self.sampler = None
        except OSError:
            self.peak, self.stop = self.base, False
            self.sampler = threading.Thread(target=self._sample, daemon=True)
            self.sampler.start()
        return self

    def _sample(self) -> None:
        while not self.stop:
            self.peak = max(self.peak, _status("VmRSS"))
            time.sleep(0.002)

    def __exit__(self, *exc) -> None:
        if self.sampler is None:
            self.growth = _status("VmHWM") - self.base
        else:
            self.stop = True
            self.sampler.join()
            self.growth = max(self.peak, _status("VmRSS")) - self.base


# ---------------------------------------------------------------- correctness cases
def check_cases(device: torch.device, tmp: str) -> None:
    def every_dtype() -> str:
        state = {"bf16": torch.randn(33, 17, dtype=torch.bfloat16), "f16": torch.randn(5, 7).half(),
                 "f32": torch.randn(9), "f64": torch.randn(3, 3, dtype=torch.float64),
                 "i64": torch.randint(-2**40, 2**40, (6,)), "i32": torch.randint(-9, 9, (4, 4), dtype=torch.int32),
                 "i8": torch.randint(-128, 127, (10,), dtype=torch.int8), "u8": torch.randint(0, 255, (10,), dtype=torch.uint8),
                 "bool": torch.rand(7) > 0.5, "scalar": torch.tensor(2.5), "empty": torch.empty(0, 3)}
        p = os.path.join(tmp, "dtypes.safetensors")
        opforge.save_safetensors(state, p)
        got = opforge.load_safetensors(p, device=device)
        bad = [k for k, t in state.items() if got[k].device.type != device.type or not torch.equal(got[k].cpu(), t)]
        assert not bad, f"differ: {bad}"
        return f"{len(state)} tensors bit-exact"

    def chunked() -> str:
        old = io_reader.CHUNK_BYTES
        io_reader.CHUNK_BYTES = 1 << 20
        try:
            state = {"big": torch.randn(2048, 1531, dtype=torch.bfloat16), "odd": torch.randn(100003),
                     "tiny": torch.randn(3)}
            p = os.path.join(tmp, "chunks.safetensors")
            opforge.save_safetensors(state, p)
            got = opforge.load_safetensors(p, device=device)
            sync(device)
            assert all(torch.equal(got[k].cpu(), t) for k, t in state.items())
            got = opforge.load_safetensors(p, device=device, dtype=torch.float16)
            assert all(torch.equal(got[k].cpu(), t.half()) for k, t in state.items())
        finally:
            io_reader.CHUNK_BYTES = old
        return "1 MiB chunks, both buffers reused; bf16->fp16 equal"

    def quantize_on_load() -> str:
        w = {"layers.0.mlp.up_proj.weight": torch.randn(512, 1024, dtype=torch.bfloat16),
             "layers.0.self_attn.o_proj.weight": torch.randn(1024, 512, dtype=torch.bfloat16),
             "embed_tokens.weight": torch.randn(100, 512, dtype=torch.bfloat16)}
        p = os.path.join(tmp, "q.safetensors")
        opforge.save_safetensors(w, p)
        notes = []
        for quantize, bits, tol in (("int4", 4, 0.15), ("int8", 8, 0.01)):
            got = opforge.load_safetensors(p, device=device, quantize=quantize, group_size=128)
            assert torch.equal(got["embed_tokens.weight"].cpu(), w["embed_tokens.weight"])
            for k in ("layers.0.mlp.up_proj.weight", "layers.0.self_attn.o_proj.weight"):
                qw = got[k]
                ref = opforge.quantize_weight(w[k].to(device), bits, 128)
                assert torch.equal(qw.codes(), ref.codes()) and torch.equal(qw.scales, ref.scales), k
                x64 = w[k].double().to(device)
                err = ((qw.dequantize(torch.float64) - x64).norm() / x64.norm()).item()
                assert err < tol, f"{k}: rel err {err:.3g}"
                notes.append(f"{quantize} {err:.3g}")
        return "rel err vs float64: " + ", ".join(notes)

    def prequantized() -> str:
        out = []
        for fmt in ("gptq-v1", "gptq-v2", "awq"):
            n, k, g = 256, 1024, 128
            codes = torch.randint(0, 16, (n, k))
            zeros = torch.randint(1 if fmt == "gptq-v1" else 0, 16, (n, k // g))
            scales = (torch.rand(n, k // g) * 0.05 + 1e-3).half()
            parts = awq_tensors(codes, zeros, scales) if fmt == "awq" else \
                gptq_tensors(codes, zeros, scales, 4, v1=fmt == "gptq-v1")
            p = os.path.join(tmp, f"{fmt}.safetensors")
            opforge.save_safetensors({f"l.{name}": t for name, t in parts.items()}, p)
            qw = opforge.load_safetensors(p, device=device, gptq_format="v2" if fmt == "gptq-v2" else None)["l.weight"]
            ref = (codes.double() - zeros.double().repeat_interleave(g, 1)) * scales.double().repeat_interleave(g, 1)
            assert qw.device.type == device.type
            assert torch.equal(qw.dequantize(torch.float64).cpu(), ref), fmt
            out.append(fmt)
        return "exact: " + ", ".join(out)

    def round_trip() -> str:
        w = torch.randn(256, 512, device=device)
        state = {"a.weight": opforge.quantize_weight(w, 4, 64), "b.weight": opforge.quantize_weight(w.half(), 8, 128, True),
                 "a.bias": torch.randn(256, device=device)}
        p = os.path.join(tmp, "rt.safetensors")
        opforge.save_safetensors(state, p)
        got = opforge.load_safetensors(p, device=device)
        for key in ("a.weight", "b.weight"):
            assert torch.equal(got[key].dequantize(torch.float64), state[key].dequantize(torch.float64)), key
        assert torch.equal(got["a.bias"], state["a.bias"])
        return "QuantizedWeight int4/int8 exact"

    for name, fn in (("every dtype", every_dtype), ("staging chunks", chunked), ("quantize on load", quantize_on_load),
                     ("GPTQ/AWQ import", prequantized), ("save/load QuantizedWeight", round_trip)):
        case(name, fn)


# ---------------------------------------------------------------- the big file
def llama_like(total_gb: float) -> List[tuple]:
    """(name, shape) of a Llama-7B-shaped checkpoint cut to about ``total_gb`` of bf16."""
    h, inter, vocab = 4096, 11008, 32000
    names = [("model.embed_tokens.weight", (vocab, h))]
    layer = [("self_attn.q_proj.weight", (h, h)), ("self_attn.k_proj.weight", (h, h)),
             ("self_attn.v_proj.weight", (h, h)), ("self_attn.o_proj.weight", (h, h)),
             ("mlp.gate_proj.weight", (inter, h)), ("mlp.up_proj.weight", (inter, h)),
             ("mlp.down_proj.weight", (h, inter)), ("input_layernorm.weight", (h,)),
             ("post_attention_layernorm.weight", (h,))]
    per_layer = sum(2 * torch.Size(s).numel() for _, s in layer)
    fixed = 2 * 2 * vocab * h + 2 * h
    layers = max(1, round((total_gb * 1e9 - fixed) / per_layer))
    for i in range(layers):
        names += [(f"model.layers.{i}.{n}", s) for n, s in layer]
    names += [("model.norm.weight", (h,)), ("lm_head.weight", (vocab, h))]
    return names


def tensor_for(i: int, shape, device: torch.device) -> torch.Tensor:
    g = torch.Generator(device=device).manual_seed(1000 + i)
    return torch.randn(shape, generator=g, device=device, dtype=torch.bfloat16)


def big_file(path: str, spec: List[tuple], device: torch.device) -> Dict[str, Any]:
    t = time.perf_counter()
    opforge.save_safetensors({n: tensor_for(i, s, device) for i, (n, s) in enumerate(spec)}, path)
    write_s = time.perf_counter() - t
    size = os.path.getsize(path)
    t = time.perf_counter()
    with open(path, "rb", buffering=0) as f:  # warm the page cache
        buf = bytearray(64 << 20)
        while f.readinto(buf):
            pass
    warm_s = time.perf_counter() - t
    return {"bytes": size, "write_s": write_s, "read_GBps_pageable": size / warm_s / 1e9}


def ceilings(path: str, device: torch.device) -> Dict[str, float]:
    out: Dict[str, float] = {}
    size = os.path.getsize(path)
    pinned = torch.empty(32 << 20, dtype=torch.uint8, pin_memory=device.type == "cuda")
    view = memoryview(pinned.numpy())
    t = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        while f.readinto(view):
            pass
    out["read_into_pinned_GBps"] = size / (time.perf_counter() - t) / 1e9
    if device.type == "cuda":
        src = torch.empty(512 << 20, dtype=torch.uint8, pin_memory=True)
        dst = torch.empty_like(src, device=device)
        dst.copy_(src, non_blocking=True)
        sync(device)
        t = time.perf_counter()
        for _ in range(4):
            dst.copy_(src, non_blocking=True)
        sync(device)
        out["h2d_pinned_GBps"] = 4 * src.numel() / (time.perf_counter() - t) / 1e9
        del src, dst
    return out


LOADERS = ("opforge", "opforge-int4", "peer-load_file", "peer-safe_open")
LABELS = {"opforge": "opforge load_safetensors", "opforge-int4": "opforge load_safetensors int4",
          "opforge-int4-warm": "opforge load_safetensors int4, quantize warmed",
          "peer-load_file": "peer safetensors load_file(device)", "peer-safe_open": "peer safe_open + .to(device)"}


def run_loader(kind: str, path: str, device: torch.device, group_size: int) -> Dict[str, Any]:
    if kind == "opforge":
        return opforge.load_safetensors(path, device=device)
    if kind in ("opforge-int4", "opforge-int4-warm"):
        return opforge.load_safetensors(path, device=device, quantize="int4", group_size=group_size,
                                        quantize_exclude=())
    from safetensors import safe_open
    from safetensors.torch import load_file
    if kind == "peer-load_file":
        return load_file(path, device=str(device))
    with safe_open(path, framework="pt") as f:
        return {k: f.get_tensor(k).to(device, non_blocking=True) for k in f.keys()}


def child(args) -> None:
    """One timed load in a fresh process, so that the host memory it measures is its own."""
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.empty(1, device=device)  # CUDA context before the baseline
    spec = make_spec(args)
    kind, verify = args.child.split(":")
    if kind.endswith("-warm"):
        # one-time costs before the baseline too, as the CUDA context above: the first quantization
        # in the process (quantize_weight is torch ops: their CUDA kernels load lazily on first
        # use); what is left is the load's own growth
        opforge.quantize_weight(torch.randn(64, 4 * args.group_size, device=device), 4, args.group_size)
        sync(device)
    if args.chunk_mib:
        io_reader.CHUNK_BYTES = args.chunk_mib << 20
    with PeakRSS() as rss:
        t = time.perf_counter()
        sd = run_loader(kind, args.path, device, args.group_size)
        sync(device)
        wall = time.perf_counter() - t
    row = {"seconds": wall, "rss_growth": rss.growth, "check": verify_loaded(sd, spec, device, verify) if verify else "-"}
    print("CHILD " + json.dumps(row), flush=True)


def timed_load(kind: str, repeat: int, args, size: int, largest: int, device: torch.device, verify: str,
               chunk_mib: int = 0) -> None:
    import subprocess

    label = LABELS[kind] + (" (again)" if repeat else "") + (f" {chunk_mib} MiB chunks" if chunk_mib else "")
    cmd = [sys.executable, os.path.abspath(__file__), "--child", f"{kind}:{verify}", "--path", args.path,
           "--device", str(device), "--gb", str(args.gb), "--group-size", str(args.group_size),
           "--chunk-mib", str(chunk_mib)]
    cmd += ["--cpu-smoke"] if args.cpu_smoke else []
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=dict(os.environ))
        lines = [ln for ln in r.stdout.splitlines() if ln.startswith("CHILD ")]
        if r.returncode or not lines:
            raise RuntimeError(f"exit {r.returncode}: {(r.stderr or r.stdout)[-600:]}")
        got = json.loads(lines[-1][6:])
        wall, growth = got["seconds"], got["rss_growth"]
        row = {"load": label, "seconds": wall, "GBps": size / wall / 1e9, "rss_growth_MB": growth / 2**20,
               "rss_vs_largest": growth / largest, "check": got["check"]}
        if verify:
            RESULTS["cases"].append({"case": f"big load: {label}", "status": "PASS" if row["check"].startswith("PASS") else "FAIL",
                                     "detail": row["check"]})
        RESULTS["loads"].append(row)
        print(f"{label:44s} {wall:6.2f} s {row['GBps']:6.2f} GB/s  RSS +{row['rss_growth_MB']:7.1f} MB "
              f"({row['rss_vs_largest']:.2f}x largest)  {row['check']}", flush=True)
    except Exception as e:  # noqa: BLE001
        RESULTS["loads"].append({"load": label, "error": f"{type(e).__name__}: {e}"})
        if verify:
            RESULTS["cases"].append({"case": f"big load: {label}", "status": "FAIL", "detail": str(e)})
        print(f"{label:44s} FAIL {type(e).__name__}: {e}", flush=True)


def verify_loaded(sd: Dict[str, Any], spec: List[tuple], device: torch.device, mode: str) -> str:
    bad, worst = [], 0.0
    for i, (name, shape) in enumerate(spec):
        ref = tensor_for(i, shape, device)
        got = sd[name]
        if isinstance(got, opforge.QuantizedWeight):
            if mode == "exact":
                bad.append(name)
                continue
            r = ref.double()
            err = ((got.dequantize(torch.float64) - r).norm() / r.norm()).item()
            worst = max(worst, err)
            if not err < 0.15:
                bad.append(name)
        elif got.device.type != device.type or not torch.equal(got, ref):
            bad.append(name)
    status = "PASS" if not bad else f"FAIL {len(bad)} tensors ({bad[:3]})"
    return status + (f", int4 worst rel err {worst:.3g}" if mode == "quantized" else "")


def make_spec(args) -> List[tuple]:
    spec = llama_like(0.06 if args.cpu_smoke else args.gb)
    if args.cpu_smoke:  # Llama-like shapes cut by 8 in each dimension
        spec = [(n, tuple(max(1, d // 8) for d in s)) for n, s in spec]
    return spec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gb", type=float, default=3.0)
    ap.add_argument("--out", default=os.environ.get("OUT", "./gpu-out"))
    ap.add_argument("--cpu-smoke", action="store_true")
    ap.add_argument("--tmp", default="/tmp")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--path", help=argparse.SUPPRESS)
    ap.add_argument("--device", help=argparse.SUPPRESS)
    ap.add_argument("--group-size", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--chunk-mib", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    device = torch.device("cpu" if args.cpu_smoke or not torch.cuda.is_available() else "cuda")
    if device.type == "cuda":
        device = torch.device("cuda", torch.cuda.current_device())
    args.group_size = 32 if args.cpu_smoke else 128
    os.makedirs(args.out, exist_ok=True)
    RESULTS["device"] = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    RESULTS["torch"] = torch.__version__
    tmp = os.path.join(args.tmp, f"opforge_io_check_{os.getpid()}")
    os.makedirs(tmp, exist_ok=True)
    print(f"device {RESULTS['device']}, torch {torch.__version__}", flush=True)
    check_cases(device, tmp)

    spec = make_spec(args)
    args.path = path = os.path.join(tmp, "llama_like.safetensors")
    try:
        info = big_file(path, spec, device)
        size = info["bytes"]
        largest = max(2 * torch.Size(s).numel() for _, s in spec)
        info.update(ceilings(path, device), largest_tensor_MB=largest / 2**20, tensors=len(spec))
        RESULTS["file"] = info
        print(f"file {size / 1e9:.2f} GB, {len(spec)} tensors, largest {largest / 2**20:.0f} MB; written in "
              f"{info['write_s']:.1f} s; page-cache read {info['read_GBps_pageable']:.1f} GB/s, into pinned "
              f"{info['read_into_pinned_GBps']:.1f} GB/s; pinned H2D {info.get('h2d_pinned_GBps', float('nan')):.1f} GB/s",
              flush=True)
        timed_load("opforge", 0, args, size, largest, device, "exact")
        timed_load("opforge", 1, args, size, largest, device, "")
        timed_load("opforge-int4", 0, args, size, largest, device, "quantized")
        timed_load("opforge-int4-warm", 0, args, size, largest, device, "")
        try:
            import safetensors  # noqa: F401
        except ImportError:
            print("safetensors not installed: peers skipped", flush=True)
        else:
            timed_load("peer-load_file", 0, args, size, largest, device, "exact")
            timed_load("peer-safe_open", 0, args, size, largest, device, "")
        for chunk_mib in (8, 128):  # the staging chunk size (default 32 MiB), while time allows
            if time.perf_counter() - T0 < 85:
                timed_load("opforge", 0, args, size, largest, device, "", chunk_mib)
    except Exception as e:  # noqa: BLE001
        traceback.print_exc()
        print(f"FAIL big file: {type(e).__name__}: {e}", flush=True)
    finally:
        for name in os.listdir(tmp):
            os.remove(os.path.join(tmp, name))
        os.rmdir(tmp)

    print("\n=== summary ===")
    for c in RESULTS["cases"]:
        print(f"{c['status']:4s}  {c['case']}")
    print(f"{'load':44s} {'GB/s':>6s} {'RSS MB':>8s} {'xlargest':>8s}  target >= 2 GB/s, <= 1.5x")
    for r in RESULTS["loads"]:
        if "error" in r:
            print(f"{r['load']:44s} ERROR {r['error'][:200]}")
        else:
            print(f"{r['load']:44s} {r['GBps']:6.2f} {r['rss_growth_MB']:8.1f} {r['rss_vs_largest']:8.2f}")
    RESULTS["total_s"] = time.perf_counter() - T0
    with open(os.path.join(args.out, "io.json"), "w") as f:
        json.dump(RESULTS, f, indent=1)
    print(f"total {RESULTS['total_s']:.1f} s; wrote {os.path.join(args.out, 'io.json')}")


if __name__ == "__main__":
    main()
