"""Plots and a results summary for the H100 measurements of session 3.

Reads the JSON files that the gpu_check_* scripts wrote into
``benchmarks/results/h100/session3/`` and writes, into the same folder:

- ``attention-prefill.png``: TFLOP/s of opforge and each SDPA backend per prefill case (bf16);
- ``attention-decode.png``: % of copy bandwidth per decode case, opforge vs SDPA cuDNN / flash;
- ``quant.png``: speedup over bf16 cuBLAS by M, per shape, with the issue's targets;
- ``latency.png``: wall time per call, torch eager vs opforge plans off / on;
- ``models.png``: decode tokens/s of every configuration, with the weight-bandwidth limits;
- ``results.md``: one section per suite; every number in it is read from the JSON here.

Usage (matplotlib needed, no GPU)::

    python benchmarks/plot_session3.py [--dir benchmarks/results/h100/session3]
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = Path(__file__).resolve().parent
DEFAULT_DIR = HERE / "results" / "h100" / "session3"
COLORS = {"opforge": "#d62728", "cudnn": "#1f77b4", "flash": "#2ca02c", "efficient": "#9467bd",
          "eager": "#7f7f7f", "off": "#ff9896", "on": "#d62728", "tinygemm": "#1f77b4",
          "int8": "#ff7f0e", "int8g": "#bcbd22"}
COMMITS = {"attention": "980a81d", "quant": "980a81d", "rotary_delay": "980a81d",
           "latency_plans": "980a81d", "models": "fb41884", "io": "b44ddb4"}


def load(folder: Path, name: str) -> dict[str, Any]:
    """Read ``folder/name.json``.

    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp()); _ = (d / "x.json").write_text('{"a": 1}')
    >>> load(d, "x")
    {'a': 1}
    """
    return json.loads((folder / f"{name}.json").read_text())


def verdict(ok: bool) -> str:
    """``MET`` or ``MISSED``.

    >>> verdict(True), verdict(False)
    ('MET', 'MISSED')
    """
    return "MET" if ok else "MISSED"


def md_table(header: list[str], rows: list[list[Any]]) -> str:
    """A compact Markdown table.

    >>> print(md_table(["a", "b"], [[1, "x"]]))
    | a | b |
    |---|---|
    | 1 | x |
    """
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def short_device(d: str) -> str:
    """The device name before its first parenthesis.

    >>> short_device("NVIDIA H100 80GB HBM3 (cuda:0, cuda), sm_90")
    'NVIDIA H100 80GB HBM3'
    """
    return d.split(" (")[0].strip()


# ---- attention ---------------------------------------------------------------------------------

def prefill_label(r: dict) -> str:
    return f"D{r['D']} {'causal' if r['causal'] else 'full'}\nB{r['B']} S{r['S']}"


def decode_label(r: dict) -> str:
    ctx = f"{r['ctx'] // 1024}K"
    return f"B{r['B']}\n{ctx}{'' if 'opforge_graph_us' in r else '*'}"


def plot_attention_prefill(att: dict, out: Path) -> None:
    rows = att["prefill"]
    names = ["opforge", "cudnn", "flash", "efficient"]
    fig, ax = plt.subplots(figsize=(14, 5.2))
    width = 0.2
    for j, n in enumerate(names):
        xs = [i + (j - 1.5) * width for i in range(len(rows))]
        ax.bar(xs, [r.get(f"{n}_tflops", 0) for r in rows], width, label=n if n == "opforge" else f"SDPA {n}",
               color=COLORS[n])
    ax.text(0.99, 0.97, "labels: opforge's ratio to SDPA flash and to the fastest SDPA backend",
            transform=ax.transAxes, ha="right", va="top", fontsize=8, color=COLORS["opforge"])
    for i, r in enumerate(rows):
        top = max(r.get(f"{n}_tflops", 0) for n in names)
        ax.text(i, top + 8, f"{r['vs_flash']:.2f}x flash\n{r['vs_best']:.2f}x best",
                ha="center", fontsize=7.5, color=COLORS["opforge"])
    ax.set_xticks(range(len(rows)), [prefill_label(r) for r in rows], fontsize=8)
    ax.set_ylabel("TFLOP/s (4·B·H·S²·D, halved for causal)")
    ax.set_ylim(0, max(r["cudnn_tflops"] for r in rows) * 1.2)
    ax.set_title(f"Attention prefill, bf16, H=32 ({short_device(att['device'])}, torch {att['torch']}, "
                 f"triton {att['triton']}; opforge at {COMMITS['attention']}).  "
                 "Target: >= 1.15x flash and >= 0.75x best SDPA", fontsize=9)
    ax.legend(fontsize=8, loc="upper left", ncol=4)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "attention-prefill.png", dpi=110)
    plt.close(fig)


def decode_pct(r: dict, name: str) -> float | None:
    """% of copy bandwidth of a peer on the same bytes as opforge's (time ratio)."""
    if f"{name}_us" not in r:
        return None
    return r["opforge_pct_copy"] * r["opforge_us"] / r[f"{name}_us"]


def plot_attention_decode(att: dict, out: Path) -> None:
    groups = [(hq, hkv) for hq, hkv in ((32, 8), (8, 1))]
    fig, axes = plt.subplots(2, 1, figsize=(13, 8))
    names = ["opforge", "cudnn", "flash"]
    width = 0.27
    for ax, (hq, hkv) in zip(axes, groups):
        rows = [r for r in att["decode"] if r["Hq"] == hq and r["Hkv"] == hkv]
        for j, n in enumerate(names):
            vals = [r["opforge_pct_copy"] if n == "opforge" else (decode_pct(r, n) or 0) for r in rows]
            ax.bar([i + (j - 1) * width for i in range(len(rows))], vals, width, color=COLORS[n],
                   label=n if n == "opforge" else f"SDPA {n}")
        for i, r in enumerate(rows):
            ax.text(i - width, r["opforge_pct_copy"] + 2, f"{r['vs_best']:.2f}x", ha="center", fontsize=7,
                    color=COLORS["opforge"])
        ax.axhline(85, color="k", ls="--", lw=1, label="target 85% of copy")
        ax.set_xticks(range(len(rows)), [decode_label(r) for r in rows], fontsize=8)
        ax.set_ylabel("% of copy bandwidth")
        ax.set_ylim(0, 118)
        ax.set_title(f"GQA {hq}/{hkv}, D=128, 1 query token (label over opforge: time ratio to fastest SDPA)",
                     fontsize=9)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=8, loc="upper left", ncol=4)
    fig.suptitle(f"Attention decode, bf16, bytes = KV cache + q + out; copy {att['copy_gbs']:.0f} GB/s "
                 f"({short_device(att['device'])}; opforge at {COMMITS['attention']}). "
                 "GPU time from CUDA graphs; * = do_bench only", fontsize=10)
    fig.tight_layout()
    fig.savefig(out / "attention-decode.png", dpi=110)
    plt.close(fig)


def attention_md(att: dict) -> str:
    pre = att["prefill"]
    dec = att["decode"]
    rows = [[r["D"], "causal" if r["causal"] else "full", f"{r['B']}x{r['S']}", f"{r['opforge_tflops']:.0f}",
             f"{r['cudnn_tflops']:.0f}", f"{r['flash_tflops']:.0f}", f"{r['efficient_tflops']:.0f}",
             f"{r['vs_flash']:.2f}", f"{r['vs_best']:.2f}", verdict(r["meets_target"])] for r in pre]
    drows = [[f"{r['Hq']}/{r['Hkv']}", r["B"], r["ctx"], r["splits"],
              f"{r['opforge_us']:.1f}{'' if 'opforge_graph_us' in r else '*'}", f"{r['opforge_pct_copy']:.1f}",
              *(f"{r[n + '_us']:.1f}{'' if n + '_graph_us' in r else '*'}" for n in ("cudnn", "flash")),
              f"{r['vs_best']:.2f}",
              verdict(r["meets_target"])] for r in dec]
    n_ok = sum(c["ok"] for c in att["correctness"])
    pre_d = {d: [r for r in pre if r["D"] == d] for d in (64, 128)}
    dec_85 = sum(r["opforge_pct_copy"] >= 85 for r in dec)
    dec_fast = sum(r["vs_best"] >= 1.0 for r in dec)
    dec_near = sum(r["vs_best"] >= 0.97 for r in dec)
    return "\n".join([
        f"## Attention (`gpu_check_attn.py` -> attention.json, opforge at {COMMITS['attention']})",
        "",
        f"Correctness {n_ok}/{len(att['correctness'])} PASS. Copy bandwidth {att['copy_gbs']:.0f} GB/s. "
        "Plots: [attention-prefill.png](attention-prefill.png), [attention-decode.png](attention-decode.png).",
        "",
        "Prefill, bf16, H=32, TFLOP/s (target: >= 1.15x SDPA flash and >= 0.75x the fastest SDPA backend):",
        "",
        md_table(["D", "mask", "BxS", "opforge", "cuDNN", "flash", "efficient", "x flash", "x best", "target"], rows),
        "",
        "Decode, bf16, D=128, one query token; opforge and SDPA times are CUDA-graph GPU time per call "
        "(* = do_bench only); % of copy on K/V up to the length + q + out "
        "(target: >= 85% of copy AND never slower than the fastest SDPA):",
        "",
        md_table(["GQA", "B", "ctx", "splits", "opforge us", "% copy", "cuDNN us", "flash us", "x best", "target"],
                 drows),
        "",
        "| target (issue 9) | verdict |",
        "|---|---|",
        f"| prefill >= 1.15x flash and >= 0.75x best, D=128 | "
        f"{verdict(all(r['meets_target'] for r in pre_d[128]))}: "
        f"{sum(r['meets_target'] for r in pre_d[128])}/6 cases "
        f"(x flash {min(r['vs_flash'] for r in pre_d[128]):.2f}-{max(r['vs_flash'] for r in pre_d[128]):.2f}, "
        f"x best {min(r['vs_best'] for r in pre_d[128]):.2f}-{max(r['vs_best'] for r in pre_d[128]):.2f}) |",
        f"| prefill >= 1.15x flash and >= 0.75x best, D=64 | "
        f"{verdict(all(r['meets_target'] for r in pre_d[64]))}: "
        f"{sum(r['meets_target'] for r in pre_d[64])}/6 cases "
        f"(x flash {min(r['vs_flash'] for r in pre_d[64]):.2f}-{max(r['vs_flash'] for r in pre_d[64]):.2f}, "
        f"x best {min(r['vs_best'] for r in pre_d[64]):.2f}-{max(r['vs_best'] for r in pre_d[64]):.2f}) |",
        f"| decode >= 85% of copy | {verdict(dec_85 == len(dec))}: {dec_85}/{len(dec)} cases "
        f"({min(r['opforge_pct_copy'] for r in dec):.1f}-{max(r['opforge_pct_copy'] for r in dec):.1f}%) |",
        f"| decode never slower than the fastest SDPA | {verdict(dec_fast == len(dec))}: {dec_fast}/{len(dec)} "
        f"cases at >= 1.00x, {dec_near}/{len(dec)} within 3% "
        f"(x best {min(r['vs_best'] for r in dec):.2f}-{max(r['vs_best'] for r in dec):.2f}; the ratio is rounded "
        "to 2 decimals in the table, the verdict uses the unrounded value) |",
        f"| both decode targets at once (the script's meets_target) | "
        f"{verdict(all(r['meets_target'] for r in dec))}: {sum(r['meets_target'] for r in dec)}/{len(dec)} |",
        "",
    ])


# ---- quant -------------------------------------------------------------------------------------

QUANT_LINES = [("opforge int4 g128", "opforge", "o-"), ("torch int4 tinygemm", "tinygemm", "s--"),
               ("opforge int8 per-ch", "int8", "^-"), ("opforge int8 g128", "int8g", "v:")]


def quant_index(q: dict) -> tuple[list[tuple[int, int]], list[int], dict]:
    shapes: list[tuple[int, int]] = []
    ms: set[int] = set()
    idx = {}
    for r in q["timing"]:
        s = tuple(r["shape"])
        if s not in shapes:
            shapes.append(s)
        ms.add(r["m"])
        idx[(s, r["m"], r["impl"])] = r
    return shapes, sorted(ms), idx


def plot_quant(q: dict, out: Path) -> None:
    shapes, ms, idx = quant_index(q)
    fig, axes = plt.subplots(1, len(shapes), figsize=(4.0 * len(shapes), 4.4), sharey=True)
    for ax, s in zip(axes, shapes):
        for impl, color, style in QUANT_LINES:
            pts = [(i, idx[(s, m, impl)]["speedup_vs_bf16"]) for i, m in enumerate(ms)
                   if (s, m, impl) in idx and idx[(s, m, impl)].get("speedup_vs_bf16")]
            if pts:
                ax.plot(*zip(*pts), style, color=COLORS[color], label=impl, ms=5)
        ax.axhline(1.0, color="k", lw=0.8)
        i1, i16 = ms.index(1), ms.index(16)
        ax.plot([i1 - 0.3, i1 + 0.3], [3.0, 3.0], color="k", lw=2.5)
        ax.plot([i16 - 0.3, i16 + 0.3], [2.0, 2.0], color="k", lw=2.5)
        ax.text(i1 + 0.35, 3.0, "3.0x", va="center", fontsize=8)
        ax.text(i16 + 0.35, 2.0, "2.0x", va="center", fontsize=8)
        ax.set_xticks(range(len(ms)), [str(m) for m in ms])
        ax.set_xlabel("M (rows of x)")
        ax.set_title(f"N x K = {s[0]}x{s[1]}", fontsize=9)
        ax.set_yscale("log")
        ax.set_ylim(0.02, 4)
        ax.grid(alpha=0.3, which="both")
    axes[0].set_ylabel("speedup over bf16 cuBLAS (log)")
    axes[0].legend(fontsize=7, loc="lower left")
    fig.suptitle(f"Weight-only quantized linear, bf16 activations ({short_device(q['device'])}, torch {q['torch']}, "
                 f"triton {q['triton']}; opforge at {COMMITS['quant']}). Black bars: int4 targets (issue 10)",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(out / "quant.png", dpi=110)
    plt.close(fig)


def quant_md(q: dict, sweep: dict | None) -> str:
    shapes, ms, idx = quant_index(q)

    def sp(s, m, impl):
        r = idx.get((s, m, impl))
        return f"{r['speedup_vs_bf16']:.2f}" if r and r.get("speedup_vs_bf16") else "-"

    rows = []
    for s in shapes:
        for m in ms:
            bf = idx[(s, m, "bf16 cuBLAS")]
            i4 = idx.get((s, m, "opforge int4 g128"))
            rows.append([f"{s[0]}x{s[1]}", m, f"{bf['ms'] * 1e3:.1f}", f"{bf['pct_copy']:.0f}",
                         f"{i4['ms'] * 1e3:.1f}" if i4 else "-", f"{i4['pct_copy']:.0f}" if i4 else "-",
                         sp(s, m, "opforge int4 g128"), sp(s, m, "torch int4 tinygemm"),
                         sp(s, m, "opforge int8 per-ch"), sp(s, m, "opforge int8 g128")])

    def all_sp(m, impl):
        return [idx[(s, m, impl)]["speedup_vs_bf16"] for s in shapes if (s, m, impl) in idx]

    def rng(v):
        return f"{min(v):.2f}-{max(v):.2f}x"

    pct1 = [idx[(s, 1, "opforge int4 g128")]["pct_copy"] for s in shapes]
    targets = [
        ("int4 g128 >= 3.0x bf16 at M=1", all_sp(1, "opforge int4 g128"), 3.0),
        ("int4 g128 >= 2.0x bf16 at M=16", all_sp(16, "opforge int4 g128"), 2.0),
        ("int4 g128 never slower than bf16 at M=64", all_sp(64, "opforge int4 g128"), 1.0),
        ("int4 g128 >= 0.8x bf16 at M=4096", all_sp(4096, "opforge int4 g128"), 0.8),
        ("int8 (per-channel) >= 1.8x bf16 at M=1", all_sp(1, "opforge int8 per-ch"), 1.8),
        ("int8 (per-channel) >= 1.8x bf16 at M=16", all_sp(16, "opforge int8 per-ch"), 1.8),
        ("int8 g128 >= 1.8x bf16 at M=1", all_sp(1, "opforge int8 g128"), 1.8),
        ("int8 g128 >= 1.8x bf16 at M=16", all_sp(16, "opforge int8 g128"), 1.8),
    ]
    trows = [f"| {name} | {verdict(min(v) >= t)}: {rng(v)} ({sum(x >= t for x in v)}/{len(v)} shapes) |"
             for name, v, t in targets]
    trows.insert(1, f"| int4 g128 >= 80% of copy on the packed bytes at M=1 | {verdict(min(pct1) >= 80)}: "
                    f"{min(pct1):.1f}-{max(pct1):.1f}% |")
    peer = all_sp(1, "torch int4 tinygemm"), all_sp(16, "torch int4 tinygemm")
    n_ok = sum(c["ok"] for c in q["correctness"])
    lines = [
        f"## Quantized linear (`gpu_check_quant.py` -> quant.json, opforge at {COMMITS['quant']})",
        "",
        f"Correctness {n_ok}/{len(q['correctness'])} PASS. Copy bandwidth {q['copy_gbs']:.0f} GB/s. "
        "Plot: [quant.png](quant.png).",
        "",
        "Times in us; % copy on the bytes that must move (packed weights + scales + x + out); "
        "speedups over bf16 cuBLAS in the same run:",
        "",
        md_table(["N x K", "M", "bf16 us", "bf16 % copy", "int4 us", "int4 % copy", "int4 x", "tinygemm x",
                  "int8 per-ch x", "int8 g128 x"], rows),
        "",
        "| target (issue 10) | verdict |",
        "|---|---|",
        *trows,
        "",
        f"Peer torch int4 tinygemm in the same run: {rng(peer[0])} at M=1, {rng(peer[1])} at M=16.",
    ]
    if sweep and sweep.get("sweep_best"):
        srows = []
        for key, v in sweep["sweep_best"].items():
            parts = [p.strip(" '") for p in key.strip("()").split(",")]
            n, k, m = (int(p) for p in parts[:3])
            if len(parts) > 3 or m > 64:
                continue
            ref = idx.get(((n, k), m, "bf16 cuBLAS"))
            cur = idx.get(((n, k), m, "opforge int4 g128"))
            srows.append([f"{n}x{k}", m, f"{v['ms'] * 1e3:.1f}",
                          f"{ref['ms'] / v['ms']:.2f}" if ref else "-",
                          f"{cur['speedup_vs_bf16']:.2f}" if cur else "-", v["choice"].split("  ", 1)[-1].strip()])
        lines += ["",
                  "quant_sweep.json (int4 g128 tile sweep, same commit): the best swept configuration per point, "
                  "its speedup over the bf16 time of quant.json (different runs), and the default's speedup "
                  "from quant.json:", "",
                  md_table(["N x K", "M", "best us", "best x bf16", "default x bf16", "config"], srows)]
    return "\n".join(lines) + "\n"


# ---- latency plans -----------------------------------------------------------------------------

def plot_latency(lat: dict, out: Path) -> None:
    ops: list[str] = []
    for r in lat["timing"]:
        if r["op"] not in ops:
            ops.append(r["op"])
    cols = 5
    nrows = (len(ops) + cols - 1) // cols
    fig, axes = plt.subplots(nrows, cols, figsize=(3.4 * cols, 3.4 * nrows), sharey=True)
    width = 0.27
    for ax, op in zip(axes.flat, ops):
        rows = [r for r in lat["timing"] if r["op"] == op]
        for j, (key, label) in enumerate((("eager", "torch eager"), ("plans_off", "opforge plans off"),
                                          ("plans_on", "opforge plans on"))):
            ax.bar([i + (j - 1) * width for i in range(len(rows))], [r[key] for r in rows], width,
                   color=COLORS[{"eager": "eager", "plans_off": "off", "plans_on": "on"}[key]], label=label)
        ax.set_xticks(range(len(rows)), [r["shape"] for r in rows], fontsize=7, rotation=20)
        ax.set_title(op, fontsize=9)
        ax.grid(axis="y", alpha=0.3)
    for ax in axes.flat[len(ops):]:
        ax.axis("off")
    for ax in axes[:, 0]:
        ax.set_ylabel("wall us per call")
    axes.flat[0].legend(fontsize=7, loc="upper left")
    fig.suptitle(f"Host overhead: wall time per call, bf16, median of {lat['rounds']} interleaved loops of "
                 f"{lat['calls']} ({short_device(lat['device'])}, torch {lat['torch']}, triton {lat['triton']}; "
                 f"opforge at {COMMITS['latency_plans']}). Target: plans on <= torch eager", fontsize=10)
    fig.tight_layout()
    fig.savefig(out / "latency.png", dpi=110)
    plt.close(fig)


def latency_md(lat: dict) -> str:
    rows = [[r["op"], r["shape"], f"{r['eager']:.1f}", f"{r['plans_off']:.1f}", f"{r['plans_on']:.1f}",
             f"{r['ratio_on']:.2f}", "yes" if r["met"] else "no"] for r in lat["timing"]]
    met = sum(r["met"] for r in lat["timing"])
    ops_met = sorted({r["op"] for r in lat["timing"]} - {r["op"] for r in lat["timing"] if not r["met"]})
    n_ok = sum(c["status"] == "PASS" for c in lat["checks"])
    return "\n".join([
        f"## Host overhead, launch plans (`gpu_check_plans.py` -> latency_plans.json, opforge at {COMMITS['latency_plans']})",
        "",
        f"Checks {n_ok}/{len(lat['checks'])} PASS, 8-thread race {lat['race']['status']}. Plans on by default: "
        f"{lat['plans_default']}; plans call the C launcher directly: {lat.get('c_launch_direct')}. "
        f"Wall us per call, median of {lat['rounds']} interleaved loops of {lat['calls']}. "
        "Plot: [latency.png](latency.png).",
        "",
        md_table(["op", "shape", "eager us", "plans off us", "plans on us", "eager/on", "on <= eager"], rows),
        "",
        "| target (issue 8 §2) | verdict |",
        "|---|---|",
        f"| wall time per call <= torch eager's at the 4 shapes, every op with a Triton kernel | "
        f"{verdict(met == len(lat['timing']))}: {met}/{len(lat['timing'])} cells; met for "
        f"{', '.join(ops_met) or 'none'} (the fused ops, where eager runs several kernels) |",
        "",
    ])


# ---- models ------------------------------------------------------------------------------------

def plot_models(mod: dict, out: Path) -> None:
    dec = [t for t in mod["timings"] if "decode" in t["name"]]
    pre = [t for t in mod["timings"] if "prefill" in t["name"]]
    bw = mod["copy_bandwidth_gbs"] * 1e9
    limits = {"bf16": mod["decode_limit_tokens_per_s"], "int8": bw / mod["int8_weight_bytes"],
              "int4": bw / mod["int4_weight_bytes"]}
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(14, 5.5), gridspec_kw={"width_ratios": [3, 1.4]})
    colors = [COLORS["opforge"] if t["name"].startswith("opforge") else
              ("#ff7f0e" if "patch" in t["name"] else COLORS["eager"]) for t in dec]
    ys = range(len(dec))
    ax.barh(ys, [t["tokens_per_s"] for t in dec], color=colors)
    for y, t in zip(ys, dec):
        ax.text(t["tokens_per_s"] + 15, y, f"{t['tokens_per_s']:.0f} ({t['pct_of_limit']:.0f}% of own limit)",
                va="center", fontsize=8, bbox=dict(fc="white", ec="none", alpha=0.8, pad=0.5), zorder=5)
    for (name, lim), ls in zip(limits.items(), ("-", "--", ":")):
        ax.axvline(lim, color="k", ls=ls, lw=1, label=f"{name} weight-bandwidth limit {lim:.0f} tok/s")
    ax.axvline(0.7 * limits["bf16"], color="g", ls="-.", lw=1, label="target: bf16 at 70% of its limit")
    bf16 = next((t["tokens_per_s"] for t in dec if t["name"].startswith("opforge bf16") and "graphs=on" in t["name"]),
                None)
    for y, t in zip(ys, dec):
        for q, factor in (("int8", 1.4), ("int4", 1.8)):
            if bf16 and t["name"].startswith(f"opforge {q}"):
                ax.plot([bf16 * factor] * 2, [y - 0.45, y + 0.45], color="g", lw=2.5)
                ax.text(bf16 * factor, y - 0.5, f"target {factor}x bf16", color="g", fontsize=7, ha="center")
    ax.set_yticks(list(ys), [t["name"].replace(" decode b1 ctx512", "").replace("transformers", "HF")
                             for t in dec], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("decode tokens/s, batch 1, 512-token prompt")
    ax.set_xlim(0, max(limits.values()) * 1.05)
    ax.legend(fontsize=7, loc="lower right")
    ax.grid(axis="x", alpha=0.3)
    ax.set_title("Decode", fontsize=10)
    ax2.barh(range(len(pre)), [t["tokens_per_s"] / 1e3 for t in pre],
             color=[COLORS["opforge"] if t["name"].startswith("opforge") else
                    ("#ff7f0e" if "patch" in t["name"] else COLORS["eager"]) for t in pre])
    for y, t in enumerate(pre):
        ax2.text(t["tokens_per_s"] / 1e3 + 2, y, f"{t['tokens_per_s'] / 1e3:.0f}k", va="center", fontsize=8)
    ax2.set_yticks(range(len(pre)), [t["name"].replace(" prefill 1x2048", "").replace("transformers", "HF")
                                     for t in pre], fontsize=8)
    ax2.invert_yaxis()
    ax2.set_xlabel("prefill ktokens/s, 1x2048")
    ax2.set_xlim(0, max(t["tokens_per_s"] for t in pre) / 1e3 * 1.25)
    ax2.grid(axis="x", alpha=0.3)
    ax2.set_title("Prefill", fontsize=10)
    fig.suptitle(f"Llama-3.2-1B shape, random weights ({short_device(mod['device'])}, torch {mod['torch']}; "
                 f"copy {mod['copy_bandwidth_gbs']:.0f} GB/s; opforge at {COMMITS['models']})", fontsize=10)
    fig.tight_layout()
    fig.savefig(out / "models.png", dpi=110)
    plt.close(fig)


def models_md(mod: dict) -> str:
    bw = mod["copy_bandwidth_gbs"] * 1e9
    rows = [[t["name"], f"{t['tokens_per_s']:.0f}",
             f"{t['pct_of_limit']:.1f}" if "pct_of_limit" in t else "-"] for t in mod["timings"]]
    trows = [f"| {t['name']} | {'MET' if t['verdict'] == 'PASS' else 'MISSED'}: {t['detail']} |"
             for t in mod["targets"]]
    n_ok = sum(c["pass"] for c in mod["checks"])
    return "\n".join([
        f"## Models (`gpu_check_models.py` -> models.json, opforge at {COMMITS['models']})",
        "",
        f"Llama-3.2-1B shape, random weights, bf16. Checks {n_ok}/{len(mod['checks'])} pass (the two that do not "
        f"are the int8/int4 quality reports: logits rel. err vs bf16 {mod['int8_logits_rel_err_vs_bf16']:.3f} "
        f"int8, {mod['int4_logits_rel_err_vs_bf16']:.3f} int4; reported, not targets). "
        f"Copy bandwidth {mod['copy_bandwidth_gbs']:.0f} GB/s; weights {mod['weight_bytes'] / 1e9:.2f} GB bf16 "
        f"-> limit {mod['decode_limit_tokens_per_s']:.0f} tokens/s (int8 {mod['int8_weight_bytes'] / 1e9:.2f} GB "
        f"-> {bw / mod['int8_weight_bytes']:.0f}; int4 {mod['int4_weight_bytes'] / 1e9:.2f} GB -> "
        f"{bw / mod['int4_weight_bytes']:.0f}; the lm_head stays dense, {mod['int4_dense_lm_head_bytes'] / 1e9:.2f} "
        f"GB). First token {mod['first_token_s']['total_wall']:.3f} s; peak GPU memory "
        f"{mod['peak_memory_gib']:.1f} GiB. Plot: [models.png](models.png).",
        "",
        md_table(["configuration", "tokens/s", "% of own weight-bandwidth limit"], rows),
        "",
        "| target (issue 11) | verdict |",
        "|---|---|",
        *trows,
        "",
        "Not measured in this run: the Llama-3-8B shape, decode at batch 8/32 and context 4096, prefill 8x512, "
        "transformers + torch.compile, Liger-Kernel.",
        "",
    ])


# ---- rotary / delay, io ------------------------------------------------------------------------

def rotary_md(rd: dict) -> str:
    by = {}
    for r in rd["timings"]:
        by[(r["group"], r["case"], r["impl"])] = r

    def get(g, c, i):
        return by.get((g, c, i))

    rows = []
    for g, c, ours, peer in [
            ("rotary", "decode B=64 S=1 bfloat16", "opforge", "torch composite"),
            ("rotary", "prefill B=1 S=4096 bfloat16", "opforge", "torch composite"),
            ("rotary", "prefill B=1 S=4096 bfloat16", "opforge inplace", "torch composite"),
            ("kv_append", "decode B=64 S_new=1 bf16", "opforge check=False", "torch index assignment"),
            ("kv_append", "prefill B=1 S_new=4096 bf16", "opforge check=False", "torch index assignment"),
            ("fused", "decode B=64 S=1 bf16", "opforge fused check=False", "torch composite"),
            ("fused", "prefill B=1 S=4096 bf16", "opforge fused check=False", "torch composite"),
            ("delay", "B=32 T=3072 C=32 int64", "opforge apply", "Dia-style, indices prebuilt"),
            ("delay", "B=32 T=3072 C=32 int32", "opforge apply", "Dia-style, indices prebuilt"),
            ("delay", "B=1 T=3072 C=9 int32", "opforge apply", "torch eager add (1 op)"),
            ("delay", "B=1 T=3072 C=9 int64", "opforge apply", "torch eager add (1 op)")]:
        o, p, cp = get(g, c, ours), get(g, c, peer), get(g, c, "copy of the same bytes")
        if not o:
            continue
        rows.append([g, c, ours, f"{o['gpu_us']:.1f} ({o['method']})", f"{o['pct_copy']:.1f}",
                     f"{o['pct_of_same_bytes_copy']:.1f}", f"{o['wall_us']:.1f}",
                     f"{peer}: {p['wall_us']:.1f}" if p else "-", f"{cp['wall_us']:.1f}" if cp else "-"])
    n_ok = sum(c["ok"] for c in rd["checks"])
    rot = [get("rotary", c, "opforge") for c in ("decode B=64 S=1 bfloat16", "prefill B=1 S=4096 bfloat16")]
    app = [get("kv_append", c, "opforge check=False") for c in ("decode B=64 S_new=1 bf16",
                                                              "prefill B=1 S_new=4096 bf16")]
    fus = [get("fused", c, "opforge fused check=False") for c in ("decode B=64 S=1 bf16", "prefill B=1 S=4096 bf16")]
    rot_t = [get("rotary", c, "torch composite") for c in ("decode B=64 S=1 bfloat16", "prefill B=1 S=4096 bfloat16")]
    app_t = [get("kv_append", c, "torch index assignment") for c in ("decode B=64 S_new=1 bf16",
                                                                   "prefill B=1 S_new=4096 bf16")]
    fus_t = [get("fused", c, "torch composite") for c in ("decode B=64 S=1 bf16", "prefill B=1 S=4096 bf16")]
    big = get("delay", "B=32 T=3072 C=32 int64", "opforge apply")
    small = [(get("delay", f"B=1 T=3072 C=9 {d}", "opforge apply"),
              get("delay", f"B=1 T=3072 C=9 {d}", "torch eager add (1 op)")) for d in ("int32", "int64")]

    def pct(rs):
        return f"{rs[0]['pct_copy']:.1f}% (decode), {rs[1]['pct_copy']:.1f}% (prefill)"

    def wall(rs, ts):
        return all(r["wall_us"] <= t["wall_us"] for r, t in zip(rs, ts)), \
            ", ".join(f"{r['wall_us']:.1f} vs {t['wall_us']:.1f} us" for r, t in zip(rs, ts))

    trows = []
    for name, rs, ts in (("rotary", rot, rot_t), ("append", app, app_t), ("rotary+append", fus, fus_t)):
        trows.append(f"| {name} >= 90% of copy at decode and prefill sizes | "
                     f"{verdict(all(r['pct_copy'] >= 90 for r in rs))}: {pct(rs)} |")
        ok, txt = wall(rs, ts)
        trows.append(f"| {name} wall per call no slower than torch | {verdict(ok)}: {txt} |")
    trows.append(f"| delay >= 85% of copy at the largest size (B=32 T=3072 C=32 int64) | "
                 f"{verdict(big['pct_copy'] >= 85)}: {big['pct_copy']:.1f}% ({big['pct_of_same_bytes_copy']:.1f}% of "
                 "a copy of the same bytes); int32 at that size is 25 MB, L2-resident under graph replay, so its "
                 ">100% is not a bandwidth figure |")
    trows.append("| delay wall per call no slower than one torch eager elementwise op at the smallest (B=1 C=9) | "
                 f"{verdict(all(o['wall_us'] <= t['wall_us'] for o, t in small))}: "
                 + ", ".join(f"{o['wall_us']:.1f} vs {t['wall_us']:.1f} us" for o, t in small) + " |")
    return "\n".join([
        f"## Rotary, KV-cache append, delay pattern (`gpu_check_rope.py` -> rotary_delay.json, opforge at {COMMITS['rotary_delay']})",
        "",
        f"Checks {n_ok}/{len(rd['checks'])} PASS. Copy bandwidth {rd['copy_gbs']:.0f} GB/s. GPU us from CUDA-graph "
        "replay (graph) or do_bench; small graph-replayed cases are L2-resident, so % of copy can exceed 100. "
        "No plot for this suite.",
        "",
        md_table(["group", "case", "opforge", "GPU us", "% copy", "% of same-bytes copy", "wall us",
                  "peer wall us", "copy wall us"], rows),
        "",
        "| target (issues 9, 12) | verdict |",
        "|---|---|",
        *trows,
        "",
    ])


def io_md(io: dict) -> str:
    f = io["file"]
    rows = [[ld["load"], f"{ld['seconds']:.2f}", f"{ld['GBps']:.2f}", f"{ld['rss_growth_MB']:.1f}",
             f"{ld['rss_vs_largest']:.2f}", ld.get("check", "-")] for ld in io["loads"]]
    ours = [ld for ld in io["loads"] if ld["load"].startswith("opforge load_safetensors")
            and "chunks" not in ld["load"]]
    cases = ", ".join(f"{c['case']} {c['status']}" for c in io["cases"])
    return "\n".join([
        f"## SafeTensors loader (`gpu_check_io.py` -> io.json, opforge at {COMMITS['io']})",
        "",
        f"File {f['bytes'] / 1e9:.2f} GB, {f['tensors']} tensors, largest {f['largest_tensor_MB']:.0f} MB; page-cache "
        f"read {f['read_GBps_pageable']:.2f} GB/s, pinned H2D {f['h2d_pinned_GBps']:.1f} GB/s. Cases: {cases}. "
        "The 8 MiB / 128 MiB chunk rows are staging-size variants, not the default. No plot for this suite.",
        "",
        md_table(["load", "s", "GB/s", "RSS growth MB", "x largest tensor", "check"], rows),
        "",
        "| target (issue 10) | verdict |",
        "|---|---|",
        *[f"| {ld['load']}: >= 2 GB/s | {verdict(ld['GBps'] >= 2)}: {ld['GBps']:.2f} GB/s |" for ld in ours],
        *[f"| {ld['load']}: RSS growth <= 1.5x largest tensor | {verdict(ld['rss_vs_largest'] <= 1.5)}: "
          f"{ld['rss_vs_largest']:.2f}x |" for ld in ours],
        "",
    ])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", type=Path, default=DEFAULT_DIR)
    folder = ap.parse_args().dir
    att, q, lat = load(folder, "attention"), load(folder, "quant"), load(folder, "latency_plans")
    mod, rd, io = load(folder, "models"), load(folder, "rotary_delay"), load(folder, "io")
    sweep = load(folder, "quant_sweep") if (folder / "quant_sweep.json").exists() else None
    plot_attention_prefill(att, folder)
    plot_attention_decode(att, folder)
    plot_quant(q, folder)
    plot_latency(lat, folder)
    plot_models(mod, folder)
    copies = ", ".join(f"{n} {v:.0f}" for n, v in (("attention", att["copy_gbs"]), ("quant", q["copy_gbs"]),
                                                     ("rotary_delay", rd["copy_gbs"]),
                                                     ("models", mod["copy_bandwidth_gbs"])))
    head = "\n".join([
        "# H100 results, session 3",
        "",
        f"Device: {short_device(att['device'])}, torch {att['torch'].split('+')[0]} ({att['torch']}), "
        f"triton {att['triton']}. Copy bandwidth as measured in each JSON (GB/s, bytes read + written): {copies}.",
        "",
        "Code measured: attention, quant, rotary_delay, latency_plans at commit 980a81d (main after the quant2 "
        "merge); models at fb41884; io at b44ddb4. Every number below is read from the JSON in this folder by "
        "`benchmarks/plot_session3.py`, which also draws the PNGs.",
        "",
    ])
    text = "\n".join([head, attention_md(att), quant_md(q, sweep), latency_md(lat), models_md(mod),
                      rotary_md(rd), io_md(io)])
    (folder / "results.md").write_text(text)
    print(f"wrote 5 PNGs and results.md into {folder}")


if __name__ == "__main__":
    main()
