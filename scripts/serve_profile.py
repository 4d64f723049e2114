"""Where the serving engine's time goes on a GPU: per-step wall times (synchronized), time in the
engine's phases, Triton compiles during the timed run, and torch.profiler tops of chosen steps.

Run on a CUDA machine: ``PYTHONPATH=src python3 scripts/serve_profile.py [batch1 ragged-64 ...]``
(writes serve_profile.json and the profiler tables to ``$OUT`` or /tmp). Each workload runs twice
in one process after the bench's warm-up: a second run that is much faster means the first one
compiled kernels.
"""
import collections
import json
import os
import sys
import tempfile
import time

import torch

OUT = os.environ.get("OUT", "/tmp")
compiles: list = []          # (time, kernel name)


def _hook(*args, **kw):
    fn = kw.get("fn")
    name = getattr(fn, "name", None) or (kw.get("repr") or "?").split("[")[0]
    compiles.append((time.perf_counter(), name))
    return None              # never skip the compile


try:
    import triton
    triton.knobs.runtime.jit_cache_hook = _hook
except Exception as exc:     # noqa: BLE001
    print("no compile hook:", exc)

from opforge.bench.suites.model_grid import _config  # noqa: E402
from opforge.bench.suites.serve import workloads  # noqa: E402
from opforge.models import load  # noqa: E402
from opforge.models.testing import write_random_checkpoint  # noqa: E402
from opforge.serve import Engine, SamplingParams  # noqa: E402

phase: dict = collections.defaultdict(float)


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _timed(name):
    orig = getattr(Engine, name)

    def f(self, *a, **k):
        t = time.perf_counter()
        try:
            return orig(self, *a, **k)
        finally:
            phase[name] += time.perf_counter() - t
    setattr(Engine, name, f)


for _n in ("_plan", "_launch", "_read", "_append"):
    _timed(_n)
_orig_launch = Engine._launch


def _launch_note(self, plan):
    cu = plan["cu"]
    graph = self._graphs is not None and plan["decode_only"] and self._graphs.size_for(len(plan["chunks"])) is not None
    self._last_shape = (len(plan["chunks"]), cu[-1], "graph" if graph else "eager")
    return _orig_launch(self, plan)


Engine._launch = _launch_note


def timed_run(model, cfg, report, label, w, max_num_seqs, overlap=False, profile_steps=(), host_profile=False):
    engine = Engine(model, max_num_seqs=max_num_seqs, enable_prefix_caching=w.prefix_caching, overlap=overlap)
    tw, nc0 = time.perf_counter(), len(compiles)
    engine.warm_up()
    _sync()
    warm_s, warm_compiles = time.perf_counter() - tw, len(compiles) - nc0
    phase.clear()
    nc, steps = len(compiles), []
    t0 = time.perf_counter()
    streams = [engine.add_request(f"{label}-{i}", p, SamplingParams(max_tokens=n, ignore_eos=True))
               for i, (p, n) in enumerate(zip(w.prompts, w.outputs))]
    i = 0
    if host_profile:
        import cProfile
        host = cProfile.Profile()
        host.enable()
    while engine.has_unfinished():
        c0, ts = len(compiles), time.perf_counter()
        if i in profile_steps:
            from torch.profiler import ProfilerActivity, profile
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                engine.step()
                _sync()
            avg = prof.key_averages()
            text = (f"--- {label} step {i} {getattr(engine, '_last_shape', None)} by cuda time\n"
                    + avg.table(sort_by="cuda_time_total", row_limit=16, max_name_column_width=50)
                    + "\n--- by self cpu time\n"
                    + avg.table(sort_by="self_cpu_time_total", row_limit=16, max_name_column_width=50))
            with open(f"{OUT}/prof_{label}_step{i}.txt", "w") as fh:
                fh.write(text)
        else:
            engine.step()
            _sync()
        steps.append({"i": i, "s": time.perf_counter() - ts, "compiles": len(compiles) - c0,
                      "shape": getattr(engine, "_last_shape", None)})
        i += 1
    wall = time.perf_counter() - t0
    if host_profile:
        import io
        import pstats
        host.disable()
        buf = io.StringIO()
        stats = pstats.Stats(host, stream=buf)
        stats.sort_stats("tottime").print_stats(30)
        stats.sort_stats("cumulative").print_stats(45)
        with open(f"{OUT}/host_{label}.txt", "w") as fh:
            fh.write(buf.getvalue())
        print(buf.getvalue()[:6000], flush=True)
    outs = [list(s) for s in streams]
    gen = sum(o[-1].completion_tokens for o in outs)
    ttft = sorted(o[-1].time_to_first_token for o in outs)
    run_compiles = collections.Counter(c[1] for c in compiles[nc:])
    by_kind = collections.defaultdict(lambda: [0, 0.0])
    for s in steps:
        k = "compile" if s["compiles"] else (s["shape"] or ("?",))[-1]
        by_kind[k][0] += 1
        by_kind[k][1] += s["s"]
    r = {"tok_s": gen / wall, "wall": wall, "steps": len(steps), "ttft_p50_ms": 1e3 * ttft[len(ttft) // 2],
         "warm_s": warm_s, "warm_compiles": warm_compiles, "run_compiles": dict(run_compiles),
         "phases": dict(phase), "by_kind": {k: v for k, v in by_kind.items()},
         "slowest": sorted(steps, key=lambda s: -s["s"])[:20], "steps_detail": steps}
    report[label] = r
    print(f"=== {label}: {r['tok_s']:.0f} tok/s wall {wall:.2f}s steps {len(steps)} ttft p50 {r['ttft_p50_ms']:.0f}ms "
          f"warm {warm_s:.1f}s ({warm_compiles} compiles); run compiles {sum(run_compiles.values())}", flush=True)
    print("   by kind (n, s):", {k: (v[0], round(v[1], 3)) for k, v in by_kind.items()}, flush=True)
    print("   phases:", {k: round(v, 3) for k, v in phase.items()}, flush=True)
    print("   compiled:", dict(run_compiles), flush=True)
    print("   slowest:", [(s["i"], round(s["s"], 3), s["compiles"], s["shape"]) for s in r["slowest"][:8]], flush=True)
    with open(f"{OUT}/serve_profile.json", "w") as fh:
        json.dump(report, fh, indent=1, default=str)


def main(names):
    gpu = torch.cuda.is_available()
    dev = torch.device("cuda" if gpu else "cpu")
    cfg = _config("1b" if gpu else "tiny")
    d = tempfile.mkdtemp()
    write_random_checkpoint(cfg, d, dev)
    ws = {w.name: w for w in workloads(cfg["vocab_size"], 1 if gpu else 8)}
    model = load(d, device=dev, dtype=torch.bfloat16 if gpu else torch.float32, max_seq_len=1300, max_batch=1)
    report: dict = {}
    for name in names:
        overlap = name.endswith("+overlap")
        w = ws[name.removesuffix("+overlap")]
        seqs = (256 if torch.cuda.is_available() else 16) if w.name == "batch1" else len(w.prompts)
        timed_run(model, cfg, report, name + "-first", w, seqs, overlap, (0, 3, 40))
        timed_run(model, cfg, report, name + "-second", w, seqs, overlap)
        if os.environ.get("HOST_PROFILE"):
            timed_run(model, cfg, report, name + "-cprofile", w, seqs, overlap, host_profile=True)


if __name__ == "__main__":
    main(sys.argv[1:] or ["batch1", "ragged-64"])
