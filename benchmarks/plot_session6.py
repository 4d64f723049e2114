"""Plots and a results summary for the H100 measurements of session 6.

Reads what the five GPU calls of session 6 left in ``benchmarks/results/h100/session6/callN/``
and writes into ``benchmarks/results/h100/session6/``:

- ``batched_decode.png``: time per quantized linear at M = 16 (CUDA graph over L2-cold weights)
  per shape of the 1B/8B models: cuBLAS bf16, int4 and int8 before this session, and now (the
  swapped dot tiles, int4 with the JOIN unpack);
- ``model_suite.png``: decode tokens/s of ``opforge bench --suite model``, 1B and 8B shapes;
- ``results.md``: every table below, each number read from the files here.

Usage (matplotlib needed, no GPU)::

    python benchmarks/plot_session6.py [--dir benchmarks/results/h100/session6]
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from plot_session5 import plot_suite_rows, suite_table

HERE = Path(__file__).resolve().parent
DEFAULT_DIR = HERE / "results" / "h100" / "session6"
#: the commit each call measured
COMMITS = {"call1": "75170c1", "call2": "0b19853", "call3": "7b891e7", "call4": "f515a1a", "call5": "f515a1a"}
#: the sweep's labels of the launch choices before this session and now (triton_kernels.tile_config)
BEFORE = {4: "int4 linear", 8: "int8 linear"}
SWAP = {4: "int4 dot{b} swap (64, 128) w4 s3 pps4 combine", 8: "int8 dot{b} swap (64, 128) w4 s3 pps4 combine"}
NOW_INT4 = "int4 dot{b} join swap (64, 128) w4 s3 pps4 combine"


def load(path: Path) -> dict:
    return json.loads(path.read_text())


def block(m: int) -> int:
    return max(16, 1 << (m - 1).bit_length())


def gpu_test_md(folder: Path) -> list[str]:
    lines = ["## GPU test command (`scripts/gpu_test.sh`)", ""]
    for call in ("call3", "call4"):
        text = [t for t in (folder / call / "gpu_test.log").read_text().splitlines() if t.startswith("gpu_test.sh")]
        lines.append(f"- at {COMMITS[call]}: `{text[-1]}`")
    lines += ["", f"Final run (at {COMMITS['call4']}, HEAD of every kernel, launch path and test), per shard:", "",
              "```", (folder / "call4" / "gpu_test.log").read_text().strip(), "```", ""]
    return lines


def cell(us: dict, name: str, base: float) -> str:
    v = us.get(name)
    return "-" if v is None else f"{v:.1f} ({base / v:.2f}x)"


def batched_md(folder: Path) -> list[str]:
    lines = ["## Batched decode: quantized linear at M = 8, 16, 32, 64 (`gpu_decode_breakdown.py --part sweep "
             "--rows ...`)", "",
             "Time per launch in us (a CUDA graph of L launches over L different weights, >= 160 MB in all), "
             "speedup over cuBLAS bf16 in brackets. *before*: the launch choice before this session (int4: "
             "(16, 128, 128) tl.dot tiles up to M = 16; int8: (16, 64, 128)); *swap*: the weight as the MMA's "
             "first operand, 64 features x 128 codes; *now*: swap, and for int4 the codes unpacked through "
             "`tl.join` (the default since 7b891e7). int4 is g128 asymmetric, int8 per-channel symmetric.", "",
             f"Round 1 (at {COMMITS['call1']}):", "",
             "| shape | M | cuBLAS bf16 | int4 before | int4 swap | tinygemm int4 | int8 before | int8 swap |",
             "|---|---|---|---|---|---|---|---|"]
    lines += sweep_rows(folder / "call1", [BEFORE[4], SWAP[4], "tinygemm int4", BEFORE[8], SWAP[8]])
    lines += ["", f"Round 2 (at {COMMITS['call2']}, where swap was already the default):", "",
              "| shape | M | cuBLAS bf16 | int4 swap | int4 now (swap + join) | tinygemm int4 | int8 now (swap) |",
              "|---|---|---|---|---|---|---|"]
    lines += sweep_rows(folder / "call2", [SWAP[4], NOW_INT4, "tinygemm int4", SWAP[8]])
    return lines + [""]


def sweep_rows(call: Path, names: list[str]) -> list[str]:
    """One Markdown row per (shape, M) of a call's sweep: cuBLAS bf16, then each named variant
    (``{b}`` in a name stands for that M's dot tile rows)."""
    out = []
    for r in load(call / "rows" / "decode_breakdown.json")["sweep"]:
        us, base, b = r["us"], r["us"]["cublas bf16"], block(r["m"])
        cells = " | ".join(cell(us, name.format(b=b), base) for name in names)
        out.append(f"| {r['shape']} | {r['m']} | {base:.1f} | {cells} |")
    return out


def attention_md(folder: Path) -> list[str]:
    lines = ["## Decode attention at batch 1 (`gpu_decode_breakdown.py --part attn`)", "",
             "us per call (CUDA graph, one cache per layer, L2-cold). *capacity*: session 5's slices, sized by "
             "the cache's capacity; *by length*: slices that divide the tokens in the cache (read on the device), "
             "about one program per SM: the default since 0b19853; *merged in kernel*: partials merged by the last "
             "split instead of a merge kernel (call 3; rejected).", "",
             "| case | capacity (call 1) | by length (call 1) | by length, 8 splits (call 1) | capacity (call 3) | "
             "by length (call 3) | by length, merged in kernel (call 3) |", "|---|---|---|---|---|---|---|"]
    one = {r["case"]: r["us"] for r in load(folder / "call1" / "attn" / "decode_breakdown.json")["attention"]}
    three = {r["case"]: r["us"] for r in load(folder / "call3" / "attn" / "decode_breakdown.json")["attention"]}
    for case, a in one.items():
        c = three.get(case, {})
        lines.append(f"| {case} | {a['splits=default']:.1f} | {a['splits=16 by length']:.1f} | "
                     f"{a['splits=8 by length']:.1f} | {c.get('splits=default', 0):.1f} | "
                     f"{c.get('splits=default by length', 0):.1f} | {c.get('splits=default by length merged', 0):.1f} |")
    return lines + ["", "(The by-length heuristic gives 16 splits at batch 1 with 8 key/value heads on 132 SMs.)", ""]


def steps_md(folder: Path) -> list[str]:
    lines = ["## The 1B model's decode step under each setting (`gpu_decode_breakdown.py --part models`)", "",
             "CUDA-graph replay of one decode step, a 4096-token cache holding 512; int4/int8 with the output head "
             "quantized. Each row turns one of this session's choices off (or, in call 2, JOIN on before it was "
             "the default; in call 3, the in-kernel merge was the default and `merge=0` is what landed).", "",
             "| call | batch | model | setting | step us | tokens/s |", "|---|---|---|---|---|---|"]
    for call in ("call2", "call3"):
        for label, e in load(folder / call / "models" / "decode_breakdown.json")["models"].items():
            batch, model, setting = label.split(" ", 1)[0], *label.split(" ", 1)[1].rsplit(" ", 1)
            lines.append(f"| {call} ({COMMITS[call]}) | {batch[1:]} | {model} | {setting} | {e['step_us']:.0f} | "
                         f"{e['tokens_per_s']:.0f} |")
    return lines + [""]


def host_md(folder: Path) -> list[str]:
    d = load(folder / "call1" / "host" / "host_profile.json")
    lines = [f"## Host time per eager `opforge.linear` call (`gpu_host_profile.py`, at {COMMITS['call1']})", "",
             "4096x4096, M = 1, bf16 x, wall time per call in a loop of 2000 (the GPU machine's host):", "",
             "| weight | opforge.linear us | F.linear us (same loop) |", "|---|---|---|"]
    for name in ("int4 g128", "int8", "dense"):
        lines.append(f"| {name} | {d['wall_us'][name]:.1f} | {d['wall_us'][name + ' (F.linear)']:.1f} |")
    return lines + ["", "cProfile's top entries are in `call1/host.log`.", ""]


def plot_batched(folder: Path) -> None:
    import matplotlib.pyplot as plt
    before = {r["shape"]: r["us"] for r in load(folder / "call1" / "rows" / "decode_breakdown.json")["sweep"]
              if r["m"] == 16}
    now = [r for r in load(folder / "call2" / "rows" / "decode_breakdown.json")["sweep"] if r["m"] == 16]
    series = [("cuBLAS bf16 (round 2)", lambda r: r["us"]["cublas bf16"]),
              ("int4 before (round 1)", lambda r: before[r["shape"]].get(BEFORE[4], 0)),
              ("int4 now (round 2)", lambda r: r["us"].get(NOW_INT4.format(b=16), 0)),
              ("int8 before (round 1)", lambda r: before[r["shape"]].get(BEFORE[8], 0)),
              ("int8 now (round 2)", lambda r: r["us"].get(SWAP[8].format(b=16), 0)),
              ("tinygemm int4 (round 2)", lambda r: r["us"].get("tinygemm int4", 0))]
    fig, axes = plt.subplots(1, 2, figsize=(15, 5), gridspec_kw={"width_ratios": [8, 1]})
    for ax, group in ((axes[0], [r for r in now if r["n"] < 100000]), (axes[1], [r for r in now if r["n"] >= 100000])):
        width = 0.8 / len(series)
        for i, (label, pick) in enumerate(series):
            ax.bar([j + i * width for j in range(len(group))], [pick(r) for r in group], width, label=label)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(group))], [r["shape"] for r in group], rotation=30)
        ax.set_ylabel("us per launch (CUDA graph, L2-cold)")
    axes[0].legend(ncol=2, fontsize=8)
    fig.suptitle("Quantized linear at M = 16 on the H100 (session 6)")
    fig.tight_layout()
    fig.savefig(folder / "batched_decode.png", dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", type=Path, default=DEFAULT_DIR)
    folder = ap.parse_args().dir
    one_b, eight_b = load(folder / "call4" / "model_suite.json"), load(folder / "call5" / "model_suite_8b.json")
    lines = ["# H100 results, session 6", "",
             f"Device: {one_b['device']}. Written by `benchmarks/plot_session6.py`. Plots: [batched_decode.png](batched_decode.png), "
             "[model_suite.png](model_suite.png).", ""]
    for part in (gpu_test_md, batched_md, attention_md, steps_md, host_md):
        lines += part(folder)
    lines += suite_table(one_b, f"## `opforge bench --suite model`, 1B shape (at {COMMITS['call4']}, after the GPU test)")
    lines += suite_table(eight_b, f"## `opforge bench --suite model --impls opforge`, 8B shape (at {COMMITS['call5']}; "
                                  "its first GPU run, no peers)")
    (folder / "results.md").write_text("\n".join(lines))
    plot_batched(folder)
    plot_suite_rows(one_b["rows"] + eight_b["rows"], "opforge bench --suite model, 1B and 8B shapes, H100 (session 6)",
                    folder / "model_suite.png")
    print(f"wrote {folder / 'results.md'}, batched_decode.png, model_suite.png")


if __name__ == "__main__":
    main()
