"""Plots and a results summary for the H100 measurements of session 5.

Reads the files the four GPU calls of session 5 left in ``benchmarks/results/h100/session5/`` and
writes into the same folder:

- ``gemv.png``: time per decode GEMV (M = 1, inside a CUDA graph over L2-cold weights) per shape
  of the 1B/8B models: cuBLAS bf16, opforge's dense GEMV, opforge int4/int8 before and after the
  wide-K tiles, torch's int4 tinygemm;
- ``model_suite.png``: decode tokens/s of ``opforge bench --suite model`` by batch and context;
- ``results.md``: every table below, each number read from the files here.

Usage (matplotlib needed, no GPU)::

    python benchmarks/plot_session5.py [--dir benchmarks/results/h100/session5]
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_DIR = HERE / "results" / "h100" / "session5"
#: the commit each file measured
COMMITS = {"run1": "31cfb7e", "round2": "688ef45", "run3": "4c989b9", "run4": "0bc35e1", "final": "b634a74"}
#: the sweep's labels for the launch choices before and after this session (see triton_kernels.wide_k_config)
BEFORE_INT4, BEFORE_INT8 = "int4 linear", "int8 linear"
DENSE_NOW = "dense gemv (4, 2048, 4, 4)"


def now_int4(n: int) -> str:
    return "int4 (16, 1024) w4 pps4 fixup" if n >= 16384 else "int4 (8, 2048) w4 pps4 fixup"


def now_int8(n: int) -> str:
    return "int8 (16, 512) w4 pps4 combine" if n >= 16384 else "int8 (8, 1024) w4 pps4 combine"


def load(folder: Path, name: str) -> dict:
    return json.loads((folder / name).read_text())


def gpu_test_md(folder: Path) -> list[str]:
    lines = ["## GPU test command (`scripts/gpu_test.sh`)", ""]
    for name, commit in (("gpu_test_run1.log", COMMITS["run1"]), ("gpu_test_run4.log", COMMITS["run4"]),
                         ("gpu_test.log", COMMITS["final"])):
        text = [t for t in (folder / name).read_text().splitlines() if t.startswith("gpu_test.sh")]
        lines.append(f"- at {commit}: `{text[-1]}`")
    lines += ["", f"Final run (at {COMMITS['final']}, HEAD of every kernel, launch path and test), per shard:", "",
              "```", (folder / "gpu_test.log").read_text().strip(), "```", ""]
    return lines


def step_md(folder: Path) -> list[str]:
    d = load(folder, "breakdown_run1.json")["step"]
    lines = [f"## A decode step, kernel by kernel (1B shape, batch 1, context 512; at {COMMITS['run1']}, before "
             "this session's kernel changes)", "",
             "GPU time per step from `torch.profiler` over eager steps; graph = CUDA-graph replay of the same step.", ""]
    for prec, e in d.items():
        lines += [f"**{prec}**: graph {e['graph_step_us']:.0f} us per step, kernels {e['kernel_sum_us']:.0f} us, "
                  f"{sum(e['launches_per_step'].values()):.0f} launches.", "",
                  "| kernel | us per step | launches |", "|---|---|---|"]
        for name, us in list(e["kernels_us_per_step"].items())[:10]:
            lines.append(f"| `{name[:60]}` | {us:.1f} | {e['launches_per_step'][name]:.0f} |")
        lines.append("")
    return lines


def sweep_rows(folder: Path) -> list[dict]:
    return load(folder, "sweep_round2.json")["sweep"]


def sweep_md(folder: Path) -> list[str]:
    lines = [f"## Decode GEMVs, M = 1 (`gpu_decode_breakdown.py --part sweep`, at {COMMITS['round2']})", "",
             "Time per launch in us: a CUDA graph of L launches over L different weights (>= 160 MB in all, so "
             "nothing stays in the 50 MB L2), same x. *before*: the launch choices before this session; *now*: "
             "the wide-K tiles (`wide_k_config`: 8 rows x 1 KB of packed codes, 16 x 512 B from N = 16384) and "
             "the dense GEMV (4 rows x 2048 columns), both the default since "
             f"{COMMITS['run3']}. Speedups over cuBLAS bf16 in brackets.", "",
             "| shape | N x K | cuBLAS bf16 | dense GEMV | int4 before | int4 now | tinygemm int4 | int8 before | "
             "int8 now |", "|---|---|---|---|---|---|---|---|---|"]
    for r in sweep_rows(folder):
        us, base = r["us"], r["us"]["cublas bf16"]

        def cell(name: str) -> str:
            v = us.get(name)
            return "-" if v is None else f"{v:.1f} ({base / v:.2f}x)"
        lines.append(f"| {r['shape']} | {r['n']}x{r['k']} | {base:.1f} | {cell(DENSE_NOW)} | {cell(BEFORE_INT4)} | "
                     f"{cell(now_int4(r['n']))} | {cell('tinygemm int4')} | {cell(BEFORE_INT8)} | "
                     f"{cell(now_int8(r['n']))} |")
    return lines + [""]


def settings_md(folder: Path) -> list[str]:
    d = load(folder, "models_settings.json")["models"]
    lines = [f"## The 1B model's decode step under each setting (`gpu_decode_breakdown.py --part models`, at "
             f"{COMMITS['run3']})", "",
             "CUDA-graph replay of one decode step (batch 1, context 512); *head*: the output head quantized too "
             "(`load(..., quantize_head=True)`). The defaults are now wide_k=1 dense_gemv=1.", "",
             "| model | wide_k | dense_gemv | step us | tokens/s | weights GB |", "|---|---|---|---|---|---|"]
    for label, e in d.items():
        model, wide, dense = label.rsplit(" ", 2)
        lines.append(f"| {model} | {wide.split('=')[1]} | {dense.split('=')[1]} | {e['step_us']:.0f} | "
                     f"{e['tokens_per_s']:.0f} | {e['weight_bytes'] / 1e9:.2f} |")
    return lines + [""]


def check_md(folder: Path) -> list[str]:
    d = load(folder, "models_check.json")
    lines = [f"## Models through `generate` (`gpu_check_models.py`, at {COMMITS['run3']})", "",
             f"Weight-bandwidth limit (bf16): {d['decode_limit_tokens_per_s']:.0f} tokens/s "
             f"({d['weight_bytes'] / 1e9:.2f} GB at {d['copy_bandwidth_gbs']:.0f} GB/s).", "",
             "| what | tokens/s | % of own limit |", "|---|---|---|"]
    lines += timings_rows(d["timings"])
    lines += ["", "Targets (issue 11):", ""] + [f"- {t['verdict']}: {t['name']}: {t['detail']}" for t in d["targets"]]
    return lines + [""]


def timings_rows(timings: list[dict]) -> list[str]:
    """``gpu_check_models.py``'s timings as Markdown rows: name, tokens/s, % of its own limit."""
    rows = []
    for t in timings:
        if t.get("tokens_per_s") is None:
            continue
        pct = t.get("pct_of_limit")
        rows.append(f"| {t['name']} | {t['tokens_per_s']:.0f} | {'' if pct is None else f'{pct:.0f}'} |")
    return rows


def suite_rows(folder: Path) -> list[dict]:
    return load(folder, "model_suite.json")["rows"]


def suite_md(folder: Path) -> list[str]:
    return suite_table(load(folder, "model_suite.json"),
                       f"## `opforge bench --suite model` (1B shape, at {COMMITS['run4']}; its first GPU run)")


def suite_table(d: dict, title: str) -> list[str]:
    """A model suite's JSON as a Markdown section: every measured row, decode as % of the limit."""
    lines = [title, "",
             f"Copy bandwidth {d['copy_bandwidth_gbs']:.0f} GB/s. Peers: "
             + (", ".join(f"{k.split(' ', 1)[1]}: {v}" for k, v in d["peers"].items()) or "none") + ". Tokens/s; "
             "decode points also as % of the weight-bandwidth limit of that precision.", "",
             "| impl | precision | what | tokens/s | % of limit |", "|---|---|---|---|---|"]
    for r in d["rows"]:
        if r.get("tokens_per_s") is None:
            continue
        pct = r.get("pct_of_limit")
        lines.append(f"| {r['impl']} | {r['precision']} | {r['what']} | {r['tokens_per_s']:.0f} | "
                     f"{'' if pct is None else f'{pct:.1f}'} |")
    return lines + [""]


def quant_md(folder: Path) -> list[str]:
    d = load(folder, "quant.json")
    lines = [f"## `gpu_check_quant.py` (do_bench, L2 flushed; at {COMMITS['run4']})", "",
             f"Correctness {sum(c['ok'] for c in d['correctness'])}/{len(d['correctness'])} PASS. On the "
             "4096x4096 .. 4096x14336 shapes these times are host-bound (the Python path of `opforge.linear` "
             "costs 30-140 us per call on that machine: `quant_profile.json`, graph replay 9.5 us vs 142 us wall "
             "for 4096x4096 int4 M=1), so the GEMV table above is the measure of the kernels; the two large "
             "shapes are GPU-bound here.", "",
             "| N x K | M | bf16 us | int4 us (x bf16) | int8 per-ch us (x bf16) | tinygemm x bf16 |",
             "|---|---|---|---|---|---|"]
    by = {}
    for t in d["timing"]:
        by[(tuple(t["shape"]), t["m"], t["impl"])] = t
    for (shape, m, impl), t in by.items():
        if impl != "bf16 cuBLAS" or shape[0] < 28672:
            continue

        def cell(name: str, key=(shape, m)) -> str:
            e = by.get((key[0], key[1], name))
            return "-" if e is None else f"{e['ms'] * 1e3:.1f} ({e['speedup_vs_bf16']:.2f}x)"
        tg = by.get((shape, m, "torch int4 tinygemm"))
        tiny = "-" if tg is None else f"{tg['speedup_vs_bf16']:.2f}"
        lines.append(f"| {shape[0]}x{shape[1]} | {m} | {t['ms'] * 1e3:.1f} | {cell('opforge int4 g128')} | "
                     f"{cell('opforge int8 per-ch')} | {tiny} |")
    return lines + [""]


def plot_gemv(folder: Path) -> None:
    import matplotlib.pyplot as plt
    rows = sweep_rows(folder)
    series = [("cuBLAS bf16", lambda r: "cublas bf16"), ("opforge dense GEMV", lambda r: DENSE_NOW),
              ("int4 before", lambda r: BEFORE_INT4), ("int4 now", lambda r: now_int4(r["n"])),
              ("tinygemm int4", lambda r: "tinygemm int4"), ("int8 before", lambda r: BEFORE_INT8),
              ("int8 now", lambda r: now_int8(r["n"]))]
    fig, axes = plt.subplots(1, 2, figsize=(15, 5), gridspec_kw={"width_ratios": [8, 1]})
    small = [r for r in rows if r["n"] < 100000]
    for ax, group in ((axes[0], small), (axes[1], [r for r in rows if r["n"] >= 100000])):
        width = 0.8 / len(series)
        for i, (label, pick) in enumerate(series):
            ax.bar([j + i * width for j in range(len(group))], [r["us"].get(pick(r), 0) for r in group], width,
                   label=label)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(group))], [r["shape"] for r in group], rotation=30)
        ax.set_ylabel("us per launch (CUDA graph, L2-cold)")
    axes[0].legend(ncol=2, fontsize=8)
    fig.suptitle("Decode GEMVs at M = 1 on the H100 (session 5)")
    fig.tight_layout()
    fig.savefig(folder / "gemv.png", dpi=110)
    plt.close(fig)


def plot_suite(folder: Path) -> None:
    plot_suite_rows(suite_rows(folder), "opforge bench --suite model, 1B shape, H100 (session 5)",
                    folder / "model_suite.png")


def plot_suite_rows(all_rows: list[dict], title: str, path: Path) -> None:
    """Decode tokens/s of a model suite's rows, grouped by batch and context, log scale."""
    import matplotlib.pyplot as plt
    rows = [r for r in all_rows if r["what"].startswith("decode") and r.get("tokens_per_s")]
    shapes = {r.get("shape") for r in rows}
    impls = sorted({(r.get("shape"), r["impl"], r["precision"]) for r in rows},
                   key=lambda k: (not k[1].startswith("opforge"), str(k[0]), k[1:]))
    points = sorted({r["what"] for r in rows}, key=lambda w: (int(w.split()[1][1:]), w))
    fig, ax = plt.subplots(figsize=(14, 5))
    width = 0.85 / len(impls)
    for i, (shape, impl, prec) in enumerate(impls):
        vals = {r["what"]: r["tokens_per_s"] for r in rows if (r.get("shape"), r["impl"], r["precision"]) == (shape, impl, prec)}
        ax.bar([j + i * width for j in range(len(points))], [vals.get(p, 0) for p in points], width,
               label=f"{shape + ' ' if len(shapes) > 1 else ''}{impl} {prec}",
               color=plt.cm.tab20(i % 20) if len(impls) > 10 else None)   # past 10 series the default colours repeat
    ax.set_xticks([j + 0.42 for j in range(len(points))], [p.replace("decode ", "") for p in points])
    ax.set_yscale("log")
    ax.set_ylabel("decode tokens/s (log)")
    ax.legend(fontsize=7, ncol=3)
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", type=Path, default=DEFAULT_DIR)
    folder = ap.parse_args().dir
    d = load(folder, "quant.json")
    lines = ["# H100 results, session 5", "",
             f"Device: {d['device']}, torch {d['torch']}. Written by `benchmarks/plot_session5.py`. Plots: "
             "[gemv.png](gemv.png), [model_suite.png](model_suite.png).", ""]
    for part in (gpu_test_md, step_md, sweep_md, settings_md, check_md, suite_md, quant_md):
        lines += part(folder)
    (folder / "results.md").write_text("\n".join(lines))
    plot_gemv(folder)
    plot_suite(folder)
    print(f"wrote {folder / 'results.md'}, gemv.png, model_suite.png")


if __name__ == "__main__":
    main()
