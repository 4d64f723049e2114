"""``opforge bench --suite io``: loading a SafeTensors checkpoint onto the device.

A file of random bf16 tensors with the shapes of a Llama-7B checkpoint, cut to about ``GB``
gigabytes (default 3; ``--quick``: a small file, shapes divided by 8), is written to a temporary
folder and read once (warm page cache). Each loader then runs in a fresh Python process, so that
the host memory it reports is its own: wall time to the last tensor on the device (synchronized),
GB/s of file bytes, and the peak growth of the process's resident memory against the largest
tensor. Loaders: ``opforge.load_safetensors`` (plain, and quantizing to int4 g128 on the way),
and as peers ``safetensors.torch.load_file(device=...)`` and ``safe_open`` + ``.to(device)`` per
tensor (absent without ``safetensors``).

Correctness before speed: every tensor a loader returns is compared with a regenerated copy,
bit-exact (plain loads) or within 0.15 relative error of the bf16 weight (int4). Targets: >= 2 GB/s,
and for a GPU, resident growth <= 1.5x the largest tensor (opforge's plain load; loaded to the
CPU, the tensors themselves are the growth). The loader's own edge cases
(every dtype, staging chunks, GPTQ/AWQ import, saving) are tested in ``tests/io``.

Run: ``opforge bench --suite io [--device cuda] [--shapes 3] [--quick] [--json io.json] [--markdown io.md]``
(``--shapes`` gives the file size in GB).
"""
from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

import torch

from opforge.bench.results import write_report

GB = 3.0
QUICK_GB = 0.06
GROUP = 128
TARGET_GBPS, TARGET_RSS = 2.0, 1.5
LOADERS = ("opforge", "opforge int4", "safetensors load_file", "safetensors safe_open")


def llama_like(total_gb: float, shrink: int = 1) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape) of a Llama-7B-shaped checkpoint of about ``total_gb`` of bf16 (dims / ``shrink``).

    Example:
        >>> spec = llama_like(0.06, shrink=8)
        >>> spec[0], spec[-1][0]
        (('model.embed_tokens.weight', (4000, 512)), 'lm_head.weight')
    """
    h, inter, vocab = 4096 // shrink, 11008 // shrink, 32000 // shrink
    layer = [("self_attn.q_proj.weight", (h, h)), ("self_attn.k_proj.weight", (h, h)),
             ("self_attn.v_proj.weight", (h, h)), ("self_attn.o_proj.weight", (h, h)),
             ("mlp.gate_proj.weight", (inter, h)), ("mlp.up_proj.weight", (inter, h)),
             ("mlp.down_proj.weight", (h, inter)), ("input_layernorm.weight", (h,)),
             ("post_attention_layernorm.weight", (h,))]
    per_layer = sum(2 * torch.Size(s).numel() for _, s in layer)
    fixed = 2 * 2 * vocab * h + 2 * h
    layers = max(1, round((total_gb * 1e9 / shrink ** 2 - fixed) / per_layer))
    names = [("model.embed_tokens.weight", (vocab, h))]
    for i in range(layers):
        names += [(f"model.layers.{i}.{n}", s) for n, s in layer]
    return names + [("model.norm.weight", (h,)), ("lm_head.weight", (vocab, h))]


def tensor_for(i: int, shape: tuple[int, ...]) -> torch.Tensor:
    """The ``i``-th tensor of the file: seeded, so a loader's result can be regenerated and compared."""
    g = torch.Generator().manual_seed(1000 + i)
    return torch.randn(shape, generator=g, dtype=torch.float32).to(torch.bfloat16)


def write_file(path: str, spec: list[tuple[str, tuple[int, ...]]]) -> int:
    """Write the checkpoint, read it once into the page cache; returns its size in bytes."""
    from opforge.io import save_safetensors
    save_safetensors({n: tensor_for(i, s) for i, (n, s) in enumerate(spec)}, path)
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(64 << 20)
        while f.readinto(buf):
            pass
    return os.path.getsize(path)


def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


def _load(loader: str, path: str, device: torch.device) -> dict[str, Any]:
    if loader == "opforge":
        from opforge.io import load_safetensors
        return load_safetensors(path, device=device)
    if loader == "opforge int4":
        from opforge.io import load_safetensors
        return load_safetensors(path, device=device, quantize="int4", group_size=GROUP, quantize_exclude=())
    from safetensors import safe_open
    from safetensors.torch import load_file
    if loader == "safetensors load_file":
        return load_file(path, device=str(device))
    with safe_open(path, framework="pt") as f:
        return {k: f.get_tensor(k).to(device, non_blocking=True) for k in f.keys()}


def _check(loaded: dict[str, Any], spec: list[tuple[str, tuple[int, ...]]]) -> str | None:
    """None when every tensor is right, else what is wrong with the first one that is not."""
    from opforge.ops.quant import QuantizedWeight
    for i, (name, shape) in enumerate(spec):
        ref, got = tensor_for(i, shape), loaded.get(name)
        if isinstance(got, QuantizedWeight):
            r = ref.double()
            err = float((got.dequantize(torch.float64).cpu() - r).norm() / r.norm())
            if not err < 0.15:
                return f"{name}: int4 relative error {err:.3g}"
        elif not isinstance(got, torch.Tensor) or not torch.equal(got.cpu(), ref):
            return f"{name}: not equal to the tensor written"
    return None


def child(loader: str, path: str, device_name: str, gb: float, shrink: int) -> dict[str, Any]:
    """One load in this (fresh) process: seconds, resident growth, and the check's verdict."""
    device = torch.device(device_name)
    if device.type == "cuda":
        torch.empty(1, device=device)           # the CUDA context before the baseline
    gc.collect()
    base = _status("VmRSS")
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")                        # resets VmHWM to the current resident size
    except OSError:
        pass
    t0 = time.perf_counter()
    loaded = _load(loader, path, device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - t0
    growth = _status("VmHWM") - base
    return {"seconds": seconds, "rss_growth": growth, "problem": _check(loaded, llama_like(gb, shrink))}


def _run_child(loader: str, path: str, device: torch.device, gb: float, shrink: int) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "opforge.bench.suites.io", loader, path, str(device), str(gb), str(shrink)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    if r.returncode or not lines:
        raise RuntimeError(f"exit {r.returncode}: {(r.stderr or r.stdout)[-400:]}")
    return json.loads(lines[-1])


def measure(device: torch.device, gb: float = GB, shrink: int = 1, loaders: tuple[str, ...] = LOADERS) -> dict:
    """Every loader on one file; a row per loader (``error`` or ``absent`` instead of numbers)."""
    from opforge.bench.envinfo import collect
    spec = llama_like(gb, shrink)
    largest = max(2 * torch.Size(s).numel() for _, s in spec)
    rows = []
    with tempfile.TemporaryDirectory(prefix="opforge_io_") as tmp:
        path = os.path.join(tmp, "llama_like.safetensors")
        size = write_file(path, spec)
        for loader in loaders:
            row: dict[str, Any] = {"impl": loader}
            if loader.startswith("safetensors"):
                try:
                    import safetensors  # noqa: F401
                except ImportError:
                    rows.append({**row, "absent": "safetensors is not installed"})
                    continue
            try:
                got = _run_child(loader, path, device, gb, shrink)
            except Exception as exc:  # reported per loader, the others still run
                rows.append({**row, "error": f"{type(exc).__name__}: {exc}"[:500]})
                continue
            row.update(seconds=got["seconds"], gbps=size / got["seconds"] / 1e9,
                       rss_growth_mb=got["rss_growth"] / 2 ** 20, rss_vs_largest=got["rss_growth"] / largest)
            if got["problem"]:
                row["error"] = f"wrong: {got['problem']}"
            rows.append(row)
    return {"schema": "opforge-bench-io/1", "meta": collect(device), "device": str(device), "file_bytes": size,
            "tensors": len(spec), "largest_tensor_mb": largest / 2 ** 20, "rows": rows,
            "targets": judge(rows, device.type != "cpu")}


def judge(rows: list[dict[str, Any]], to_device: bool = True) -> list[dict[str, Any]]:
    """The targets, on opforge's plain load (host memory only where the tensors leave the host).

    Example:
        >>> [t["met"] for t in judge([{"impl": "opforge", "gbps": 2.5, "rss_vs_largest": 1.1}])]
        [True, True]
    """
    row = next((r for r in rows if r["impl"] == "opforge"), {})
    ok = "error" not in row and "gbps" in row
    why = row.get("error", "not measured")
    targets = [{"target": f">= {TARGET_GBPS:g} GB/s", "met": ok and row["gbps"] >= TARGET_GBPS,
                "detail": f"{row['gbps']:.2f} GB/s" if ok else why}]
    if to_device:
        targets.append({"target": f"resident growth <= {TARGET_RSS:g}x the largest tensor",
                        "met": ok and row["rss_vs_largest"] <= TARGET_RSS,
                        "detail": f"{row['rss_vs_largest']:.2f}x" if ok else why})
    return targets


def markdown(result: dict[str, Any]) -> str:
    """The result as a Markdown table.

    Example:
        >>> r = {"device": "cpu", "file_bytes": 2e9, "tensors": 3, "largest_tensor_mb": 250.0, "targets": [],
        ...      "rows": [{"impl": "opforge", "gbps": 2.5, "seconds": 0.8, "rss_growth_mb": 260.0,
        ...                "rss_vs_largest": 1.04}]}
        >>> "| opforge | 0.80 | 2.50 | 260 | 1.04x |" in markdown(r)
        True
    """
    lines = [f"# Loading a SafeTensors checkpoint to {result['device']}", "",
             f"{result['file_bytes'] / 1e9:.2f} GB of bf16, {result['tensors']} tensors, largest "
             f"{result['largest_tensor_mb']:.0f} MB; each load in a fresh process, page cache warm.", "",
             "| loader | seconds | GB/s | resident growth (MB) | x largest tensor |", "|---|---|---|---|---|"]
    for r in result["rows"]:
        if "gbps" in r and "error" not in r:
            lines.append(f"| {r['impl']} | {r['seconds']:.2f} | {r['gbps']:.2f} | {r['rss_growth_mb']:.0f} | "
                         f"{r['rss_vs_largest']:.2f}x |")
        else:
            lines.append(f"| {r['impl']} | {r.get('error') or r.get('absent')} | | | |")
    lines.append("")
    lines += [f"- {t['target']}: {'met' if t['met'] else 'missed'} ({t['detail']})" for t in result["targets"]]
    return "\n".join(lines) + "\n"


def main(args: Any) -> int:
    """Entry from ``opforge bench --suite io`` (``--device``, ``--shapes GB``, ``--quick``, ``--impls``,
    ``--json``, ``--markdown``)."""
    from opforge.bench.envinfo import pick_device
    from opforge.bench.fmt import split_list
    try:
        device = pick_device(args.device)
        gb = float(split_list(args.shapes)[0]) if args.shapes else (QUICK_GB if args.quick else GB)
        loaders = tuple(split_list(args.impls) or LOADERS)
        unknown = [x for x in loaders if x not in LOADERS]
        if unknown or gb <= 0:
            raise ValueError(f"unknown loader(s) {unknown}; known: {', '.join(LOADERS)}" if unknown
                             else "--shapes must be a positive size in GB")
    except ValueError as exc:
        print(f"opforge bench: error: {exc}", file=sys.stderr)
        return 2
    result = measure(device, gb, 8 if args.quick else 1, loaders)
    write_report(result, markdown(result), args.json, args.markdown)
    return 1 if any("error" in r for r in result["rows"] if r["impl"].startswith("opforge")) else 0


if __name__ == "__main__":  # the child process of one load: prints its result as one JSON line
    print(json.dumps(child(sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), int(sys.argv[5]))))
