"""Plots and a results summary for the H100 measurements of session 7.

Reads what the eight GPU calls of session 7 left in ``benchmarks/results/h100/session7/callN/``
(and, for comparison, session 5's M = 1 sweep and session 6's sweeps and model suites) and writes
into ``benchmarks/results/h100/session7/``:

- ``pdl.png``: the 1B model's step graph, greedy graph and ``generate`` per token, bf16 and int4
  with the head quantized, programmatic dependent launch (PDL) off and on (call 2);
- ``quant_sweep.png``: speedup over cuBLAS bf16 of int4, int8 and tinygemm int4 per shape at
  M = 1, 16, 64 (call 3);
- ``model_suite.png``: decode tokens/s of ``opforge bench --suite model``, 1B and 8B shapes;
- ``results.md``: every table below, each number read from the files.

Usage (matplotlib needed, no GPU)::

    python benchmarks/plot_session7.py [--dir benchmarks/results/h100/session7]
"""
from __future__ import annotations

import argparse
from pathlib import Path

from plot_session5 import now_int4 as session5_int4, plot_suite_rows, suite_table, timings_rows
from plot_session6 import COMMITS as SESSION6_COMMITS, NOW_INT4 as SESSION6_INT4, block, cell, load

HERE = Path(__file__).resolve().parent
DEFAULT_DIR = HERE / "results" / "h100" / "session7"
SESSION5, SESSION6 = HERE / "results" / "h100" / "session5", HERE / "results" / "h100" / "session6"
#: the commit each call measured (HEAD when it ran). call1's tree is 32e6e03's (1fb3806 only adds
#: call1's results); call4 and call5 ran at fed7445, which only adds call2/call3's results to 64c615a.
COMMITS = {"call1": "32e6e03", "call2": "2c26292", "call3": "64c615a", "call4": "fed7445", "call5": "fed7445",
           "call6": "cc457c3", "call7": "6a006d6", "call8": "87c9f30"}
#: call1's M=64 candidates for session 7's int4 rule (gpu_decode_breakdown sweep labels)
OLD_RULE, DEQUANT, UNSWAPPED = "int4 linear", "int4 dequant+cublas", "int4 dot64 join (128, 128) w4 s3 pps4 combine"
#: generate-profile measurements shown per model (key, label)
PROFILE = [("step_graph_us", "step graph"), ("greedy_graph_us", "greedy graph"),
           ("generate_us_per_token", "generate, per token")]
MODELS = {"bf16": "1B bf16", "int4": "1B int4 (head int4 too)"}


def gpu_test_md(folder: Path) -> list[str]:
    log = (folder / "call4" / "call4.log").read_text().splitlines()
    end = next(i for i, t in enumerate(log) if t.startswith("gpu_test.sh:"))
    return ["## GPU test command (`scripts/gpu_test.sh`)", "", f"At {COMMITS['call4']}: `{log[end]}`", "",
            "Per shard (pass 1 with plans off and launch keys checked, pass 2 on the default launch paths):",
            "", "```", *log[:end], "```", ""]


def pdl_md(folder: Path) -> list[str]:
    probe = load(folder / "call1" / "pdl_probe.json")
    pairs = round(probe["off"]["chain_us"] / probe["off"]["per_pair_us"])
    lines = ["## Programmatic dependent launch (PDL)", "",
             f"Probe (`gpu_pdl_probe.py`, at {COMMITS['call1']}): a CUDA graph of {pairs} norm -> GEMV pairs over "
             "different bf16 weights (L2-cold); *pdl*: each kernel launched with PDL, waiting on its "
             "predecessor at its start; *pdl+early weights*: the GEMV loads its weight tile before the wait.", "",
             "| launch | chain us | us per pair | GB/s | x off | rel err eager | rel err graph |",
             "|---|---|---|---|---|---|---|"]
    for name, e in probe.items():
        lines.append(f"| {name} | {e['chain_us']:.1f} | {e['per_pair_us']:.2f} | {e['bytes_GBps']:.0f} | "
                     f"{probe['off']['chain_us'] / e['chain_us']:.2f} | {e['eager_rel_err']:.2e} | "
                     f"{e['graph_rel_err']:.2e} |")
    off, on = (load(folder / "call2" / s / "generate_profile.json") for s in ("off", "on"))
    lines += ["", f"The 1B decode at batch 1, context 512 (`gpu_generate_profile.py`, at {COMMITS['call2']}, where "
              "the decode step's Triton kernels launch with PDL; *off*: `OPFORGE_PDL=0`; both with the two-stage "
              "greedy argmax of cca29c4). us per step or token; "
              "tokens/s = 1e6 / generate us per token.", "",
              "| model | measure | PDL off | PDL on | on - off | on / off |", "|---|---|---|---|---|---|"]
    for model, label in MODELS.items():
        for key, what in PROFILE:
            a, b = off[model][key], on[model][key]
            lines.append(f"| {label} | {what} us | {a:.1f} | {b:.1f} | {b - a:+.1f} | {b / a:.3f} |")
        a, b = 1e6 / off[model]["generate_us_per_token"], 1e6 / on[model]["generate_us_per_token"]
        lines.append(f"| {label} | generate tokens/s | {a:.0f} | {b:.0f} | {b - a:+.0f} | {b / a:.3f} |")
    log = (folder / "call2" / "call2.log").read_text().splitlines()
    tests = [t for t in log if " passed" in t]
    lines += ["", f"Same call: the PDL GPU tests `{tests[0]}`; `opforge verify --quick`: `{tests[-1]}`.", ""]
    return lines


def argmax_md(folder: Path) -> list[str]:
    before, after = load(folder / "call1" / "generate_profile.json"), load(folder / "call3" / "generate_profile.json")
    off = load(folder / "call2" / "off" / "generate_profile.json")
    lines = ["## Greedy argmax", "",
             f"One row of logits (the 1B vocabulary), CUDA graph: torch's `argmax` (call 1, at {COMMITS['call1']}) vs the "
             f"two-stage argmax over rows (call 3, at {COMMITS['call3']}, `argmax_rows_graph_us`); and what the greedy "
             "graph (step + argmax + lengths + next tokens) costs over the plain step graph, before (call 1: torch "
             "argmax and a float copy of the logits) and after (call 2 with `OPFORGE_PDL=0`: two-stage argmax, no "
             "float copy; call 3: the same with PDL on).", "",
             "| model | torch argmax us (call 1) | two-stage argmax us (call 3) | greedy - step us (call 1) | "
             "greedy - step us (call 2, PDL off) | greedy - step us (call 3) |", "|---|---|---|---|---|---|"]
    for model, label in MODELS.items():
        b, o, a = before[model], off[model], after[model]
        lines.append(f"| {label} | {b['argmax_graph_us']:.1f} | {a['argmax_rows_graph_us']:.1f} | "
                     + " | ".join(f"{e['greedy_graph_us'] - e['step_graph_us']:.1f}" for e in (b, o, a)) + " |")
    return lines + [""]


def previous_int4(m: int) -> tuple[str, dict]:
    """The int4 speedup over cuBLAS bf16 per shape at M = m before this session: session 5's M = 1
    sweep (its final wide-K choice), session 6's call 2 (the swapped JOIN tiles) for M > 1."""
    if m == 1:
        rows = load(SESSION5 / "sweep_round2.json")["sweep"]
        return "session 5", {r["shape"]: r["us"]["cublas bf16"] / r["us"][session5_int4(r["n"])] for r in rows}
    rows = [r for r in load(SESSION6 / "call2" / "rows" / "decode_breakdown.json")["sweep"] if r["m"] == m]
    name = SESSION6_INT4.format(b=block(m))
    return "session 6", {r["shape"]: r["us"]["cublas bf16"] / r["us"][name] for r in rows if name in r["us"]}


def dense_best(us: dict) -> str:
    name = min((k for k in us if k.startswith("dense gemv")), key=us.get)
    return f"{cell(us, name, us['cublas bf16'])} `{name[len('dense gemv '):]}`"


def sweep_md(folder: Path) -> list[str]:
    rows = load(folder / "call3" / "decode_breakdown.json")["sweep"]
    lines = [f"## Quantized linear at M = 1, 16, 64 (`gpu_decode_breakdown.py --part sweep`, at {COMMITS['call3']})", "",
             "Time per launch in us (a CUDA graph of L launches over L different weights, L2-cold), speedup over "
             "cuBLAS bf16 in brackets; *int4 linear* / *int8 linear*: opforge's launch choice (int4 g128 asymmetric, "
             "int8 per-channel symmetric); the last column: the int4 launch choice's speedup over cuBLAS in the "
             "earlier session's sweep of the same shape and M. This call ran with PDL on (the default since "
             f"{COMMITS['call2']}): opforge's Triton GEMV/dot kernels may start while the launch before them in the "
             "graph finishes, which is the setting of a decode step (a chain of dependent launches); cuBLAS and "
             "tinygemm launch without PDL, so part of the ratios below is that overlap, not the kernel alone, and the "
             "earlier sessions' ratios (PDL off) compare the same way only roughly.", ""]
    for m in sorted({r["m"] for r in rows}):
        prev_name, prev = previous_int4(m)
        dense = m == 1
        lines += [f"M = {m}:", "", "| shape | cuBLAS bf16 | int4 linear | tinygemm int4 | int8 linear | "
                  + ("dense GEMV, best config | " if dense else "") + f"int4 x bf16, {prev_name} |",
                  "|---|---|---|---|---|---|" + ("---|" if dense else "")]
        for r in (r for r in rows if r["m"] == m):
            us, base = r["us"], r["us"]["cublas bf16"]
            cells = [cell(us, n, base) for n in ("int4 linear", "tinygemm int4", "int8 linear")]
            cells += [dense_best(us)] if dense else []
            p = prev.get(r["shape"])
            lines.append(f"| {r['shape']} | {base:.1f} | {' | '.join(cells)} | {'-' if p is None else f'{p:.2f}x'} |")
        lines.append("")
    # at M = 1 the sweep times opforge.linear twice, as `intB linear` and with WIDE_K forced on (`intB linear
    # wide`); WIDE_K is on by default, so the two are one launch timed twice
    gaps = [(abs(r["us"][f"int{b} linear"] / r["us"][f"int{b} linear wide"] - 1), b, r["shape"])
            for r in rows if r["m"] == 1 for b in (4, 8)]
    gap, bits, shape = max(gaps)
    return lines + [f"Repeatability: at M = 1 each `opforge.linear` is timed twice (`intB linear`, then `intB linear wide` with "
                    f"WIDE_K forced on, its default); the two times differ by up to {gap:.0%} (int{bits}, {shape}) and "
                    f"by more than 5% in {sum(g > 0.05 for g, _, _ in gaps)} of {len(gaps)} pairs.", ""]


def rule_md(folder: Path) -> list[str]:
    rows = [r for r in load(folder / "call1" / "decode_breakdown.json")["sweep"] if r["m"] == 64]
    three = {r["shape"]: r["us"] for r in load(folder / "call3" / "decode_breakdown.json")["sweep"] if r["m"] == 64}
    lines = ["## int4 at M = 64: the M 17..64 rule", "",
             f"Call 1 (at {COMMITS['call1']}, before PDL): *old rule*: the launch choice then (`{OLD_RULE}`: the "
             f"swapped JOIN dot tiles), *dequant+cuBLAS* (`{DEQUANT}`), *unswapped JOIN* (`{UNSWAPPED}`). Session 7's "
             "rule (e1b761a) takes dequant+cuBLAS on small weights (N*K up to `problem.DEQUANT_SMALL_NK`), the "
             "unswapped JOIN tiles on large ones (N*K from `triton_kernels.UNSWAPPED_JOIN_MIN_NK`, M from 33) and "
             f"keeps the swapped tiles between; *new rule*: its `int4 linear` in call 3 (at {COMMITS['call3']}, PDL "
             "on). us per launch, speedup over call 1's cuBLAS bf16 in brackets; N*K in units of 2**20.", "",
             "| shape | N*K | cuBLAS bf16 (call 1) | old rule (call 1) | dequant+cuBLAS (call 1) | "
             "unswapped JOIN (call 1) | new rule (call 3) |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        us, base = r["us"], r["us"]["cublas bf16"]
        cells = " | ".join(cell(us, n, base) for n in (OLD_RULE, DEQUANT, UNSWAPPED))
        lines.append(f"| {r['shape']} | {r['n'] * r['k'] / 2 ** 20:.0f} | {base:.1f} | {cells} | "
                     f"{cell(three[r['shape']], 'int4 linear', base)} |")
    return lines + [""]


def loader_md(folder: Path) -> list[str]:
    d = load(folder / "call1" / "io.json")
    f = d["file"]
    lines = [f"## Loader (`gpu_check_io.py`, at {COMMITS['call1']})", "",
             f"A {f['bytes'] / 1e9:.2f} GB safetensors file of {f['tensors']} tensors (largest "
             f"{f['largest_tensor_MB']:.0f} MB); file read {f['read_GBps_pageable']:.2f} GB/s pageable, "
             f"{f['read_into_pinned_GBps']:.2f} GB/s into pinned memory; host to device {f['h2d_pinned_GBps']:.1f} GB/s. "
             "*quantize warmed*: the int4 load again after the quantize path ran once before the RSS baseline "
             "(the loader's own growth, without one-time compile cost). Checks: "
             + ", ".join(f"{c['case']} {c['status']}" for c in d["cases"]) + ".", "",
             "| load | s | GB/s | RSS growth MB | RSS / largest tensor | check |", "|---|---|---|---|---|---|"]
    for r in d["loads"]:
        lines.append(f"| {r['load']} | {r['seconds']:.2f} | {r['GBps']:.2f} | {r['rss_growth_MB']:.0f} | "
                     f"{r['rss_vs_largest']:.2f} | {r['check']} |")
    return lines + [""]


def b1(rows: list[dict]) -> dict:
    """opforge's batch-1 context-512 decode rows by (shape, precision)."""
    return {(r["shape"], r["precision"]): r for r in rows if r["impl"] == "opforge" and r["what"] == "decode b1 ctx512"}


def summary_md(rows: list[dict], old_rows: list[dict]) -> list[str]:
    now, old = b1(rows), b1(old_rows)
    order = list(dict.fromkeys(prec for _, prec in now))   # the 1B suite's order of precisions
    lines = ["## Decode at batch 1, context 512: session 7 vs session 6", "",
             "opforge only. *x bf16*: tokens/s over bf16 of the same shape and session; % of the weight-bandwidth "
             "limit of that precision. *-head*: the output head quantized too (session 7's new precisions; session "
             f"6 had bf16, int8, int4 with a bf16 head). Session 6: its calls 4 and 5 (at {SESSION6_COMMITS['call4']}).",
             "",
             "| shape | precision | tokens/s | % of limit | x bf16 | session 6 tokens/s | session 6 % of limit | "
             "session 6 x bf16 | session 7 / 6 |", "|---|---|---|---|---|---|---|---|---|"]
    for (shape, prec), r in sorted(now.items(), key=lambda kv: (kv[0][0], order.index(kv[0][1]))):
        o, tps = old.get((shape, prec)), r["tokens_per_s"]
        line = f"| {shape} | {prec} | {tps:.0f} | {r['pct_of_limit']:.1f} | {tps / now[(shape, 'bf16')]['tokens_per_s']:.2f} | "
        if o is None:
            line += "- | - | - | - |"
        else:
            line += (f"{o['tokens_per_s']:.0f} | {o['pct_of_limit']:.1f} | "
                     f"{o['tokens_per_s'] / old[(shape, 'bf16')]['tokens_per_s']:.2f} | {tps / o['tokens_per_s']:.3f} |")
        lines.append(line)
    return lines + [""]


def bars(ax, groups: list[str], series: dict[str, list[float]]) -> None:
    width = 0.8 / len(series)
    for i, (label, vals) in enumerate(series.items()):
        ax.bar([j + i * width for j in range(len(groups))], vals, width, label=label)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(groups))], groups, rotation=30, ha="right")


def plot_pdl(folder: Path) -> None:
    import matplotlib.pyplot as plt
    prof = {s: load(folder / "call2" / s / "generate_profile.json") for s in ("off", "on")}
    fig, axes = plt.subplots(1, len(MODELS), figsize=(11, 4.5))
    for ax, (model, label) in zip(axes, MODELS.items()):
        bars(ax, [what for _, what in PROFILE],
             {f"PDL {s}": [prof[s][model][key] for key, _ in PROFILE] for s in prof})
        for bar_set in ax.containers:
            ax.bar_label(bar_set, fmt="%.0f", fontsize=8)
        ax.set_ylim(0, ax.get_ylim()[1] * 1.15)
        ax.set_title(label)
        ax.set_ylabel("us per step / token")
        ax.legend(fontsize=8, ncol=2, loc="upper center")
    fig.suptitle("1B decode at batch 1, context 512, PDL off vs on (H100, session 7 call 2)")
    fig.tight_layout()
    fig.savefig(folder / "pdl.png", dpi=110)
    plt.close(fig)


def plot_sweep(folder: Path) -> None:
    import matplotlib.pyplot as plt
    rows = load(folder / "call3" / "decode_breakdown.json")["sweep"]
    ms = sorted({r["m"] for r in rows})
    fig, axes = plt.subplots(1, len(ms), figsize=(16, 4.8), sharey=True)
    for ax, m in zip(axes, ms):
        group = [r for r in rows if r["m"] == m]
        bars(ax, [r["shape"] for r in group], {name: [r["us"]["cublas bf16"] / r["us"][name] for r in group]
                                               for name in ("int4 linear", "int8 linear", "tinygemm int4")})
        ax.axhline(1.0, color="gray", lw=0.8)
        ax.set_title(f"M = {m}")
    axes[0].set_ylabel("speedup over cuBLAS bf16 (CUDA graph, L2-cold)")
    axes[0].legend(fontsize=8)
    fig.suptitle("Quantized linear on the H100, session 7 call 3 (opforge's kernels with PDL)")
    fig.tight_layout()
    fig.savefig(folder / "quant_sweep.png", dpi=110)
    plt.close(fig)


def checks_md(folder: Path) -> list[str]:
    """Call 6: ``gpu_check_models.py`` (1B) checks and timings, and the ``decode_gemv`` suite."""
    d = load(folder / "call6" / "models.json")
    lines = [f"## `gpu_check_models.py`, 1B (at {COMMITS['call6']}, PDL on)", "", "| check | result | detail |",
             "|---|---|---|"]
    lines += [f"| {c['name']} | {'PASS' if c['pass'] else 'FAIL'} | {c['detail']} |" for c in d["checks"]]
    lines += ["", "| timing | tokens/s | % of limit |", "|---|---|---|"] + timings_rows(d["timings"])
    first = d["first_token_s"]
    lines += ["", f"First token, 512-token prompt: {first['total_wall'] * 1e3:.0f} ms (prefill {first['prefill'] * 1e3:.0f}, "
              f"graph capture {first['capture'] * 1e3:.0f}).", "",
              f"## `opforge bench --suite decode_gemv` (at {COMMITS['call6']}; eager calls, GPU time by events: the "
              "small shapes are host-bound here)", "", "| op | shape | opforge us | torch (cuBLAS bf16) us | speedup |",
              "|---|---|---|---|---|"]
    for c in load(folder / "call6" / "decode_gemv.json")["suites"][0]["cases"]:
        ours, peer = c["results"]["opforge"], c["results"]["torch"]
        lines.append(f"| {c['op']} | {'x'.join(map(str, c['shape']))} | {ours['gpu_us']:.1f} | {peer['gpu_us']:.1f} | "
                     f"{peer['gpu_us'] / ours['gpu_us']:.2f}x |")
    return lines + [""]


def probe_md(folder: Path) -> list[str]:
    """Call 7: the same launch timed three times in a row, and the 8B decode step by kernel."""
    lines = [f"## Repeat timings (`gpu_timing_probe.py`, at {COMMITS['call7']})", "",
             "us per launch, CUDA graph over L2-cold weights, each variant three times in a row on the same weights:",
             "", "| shape | variant | 1st | 2nd | 3rd |", "|---|---|---|---|---|"]
    for shape, row in load(folder / "call7" / "timing_probe.json").items():
        for name, vals in row.items():
            cells = [f"{v:.1f}" for v in vals] + [""] * (3 - len(vals))
            lines.append(f"| {shape} | {name} | " + " | ".join(cells) + " |")
    steps = load(folder / "call7" / "decode_breakdown.json")["step"]
    lines += ["", f"## The 8B decode step by kernel (`gpu_decode_breakdown.py --part step --shape 8b`, at "
              f"{COMMITS['call7']})", "",
              "Graph-replayed step, and the profiler's GPU time per kernel name over eager steps. With PDL a kernel's "
              "time includes its wait at `gdc_wait` for the kernel before it, so the kernel sum exceeds the step and "
              "a short kernel after a long one (swiglu after the gate_up GEMV) looks long.", "",
              "| model | graph step us | kernel sum us | top kernels (us per step, launches) |", "|---|---|---|---|"]
    for label, e in steps.items():
        top = ", ".join(f"{k.split('(')[0][:28]} {us:.0f} (x{e['launches_per_step'][k]:.0f})"
                        for k, us in list(e["kernels_us_per_step"].items())[:6])
        lines.append(f"| {label} | {e['graph_step_us']:.0f} | {e['kernel_sum_us']:.0f} | {top} |")
    return lines + [""]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", type=Path, default=DEFAULT_DIR)
    folder = ap.parse_args().dir
    one_b, eight_b = load(folder / "call4" / "model_1b.json"), load(folder / "call5" / "model_8b.json")
    old = load(SESSION6 / "call4" / "model_suite.json")["rows"] + load(SESSION6 / "call5" / "model_suite_8b.json")["rows"]
    lines = ["# H100 results, session 7", "",
             f"Device: {one_b['device']}. Written by `benchmarks/plot_session7.py`. Plots: [pdl.png](pdl.png), "
             "[quant_sweep.png](quant_sweep.png), [model_suite.png](model_suite.png).", "",
             "Commits measured (HEAD when each call ran): " + ", ".join(f"{c} {h}" for c, h in COMMITS.items())
             + ". call1's code is that of 32e6e03 (1fb3806 adds only its results); fed7445 adds only call2/call3's "
             "results to 64c615a.", ""]
    for part in (gpu_test_md, pdl_md, argmax_md, sweep_md, rule_md, loader_md):
        lines += part(folder)
    lines += summary_md(one_b["rows"] + eight_b["rows"], old)
    lines += suite_table(one_b, f"## `opforge bench --suite model`, 1B shape (at {COMMITS['call4']}, after the GPU test)")
    lines += suite_table(eight_b, f"## `opforge bench --suite model --impls opforge`, 8B shape (at {COMMITS['call5']})")
    lines += checks_md(folder) + probe_md(folder)
    lines += suite_table(load(folder / "call8" / "model_8b_peers.json"),
                         f"## `opforge bench --suite model --dtypes bf16`, 8B shape with the transformers peers (at "
                         f"{COMMITS['call8']}; their first run at 8B)")
    (folder / "results.md").write_text("\n".join(lines))
    plot_pdl(folder)
    plot_sweep(folder)
    plot_suite_rows(one_b["rows"] + eight_b["rows"], "opforge bench --suite model, 1B and 8B shapes, H100 (session 7)",
                    folder / "model_suite.png")
    print(f"wrote {folder / 'results.md'}, pdl.png, quant_sweep.png, model_suite.png")


if __name__ == "__main__":
    main()
