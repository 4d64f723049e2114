"""Launch plans on a GPU (issue 8, section 2): correct on real kernels, and wall time per call
against torch eager's for every op with a Triton kernel.

1. Correctness, per op and shape (bf16): the plan exists after two calls; a planned call on
   fresh data (outputs NaN-poisoned first) matches the float64 reference, and equals, bit for
   bit, the general path's output on the same data. Then 8 threads race on a first call.
2. Wall time per call: a loop of CALLS calls, host clock read after one synchronize, ROUNDS
   rounds with the implementations interleaved round by round, median: torch eager, opforge
   with plans off, opforge with plans on (C launch function under Triton's wrapper where
   ``launch.c_launch`` recognizes it), and ``torch.empty_like`` (the allocation alone) as a floor.

    PYTHONPATH=src python3 benchmarks/gpu_check_plans.py            # ~40-80 s on an H100
    PYTHONPATH=src python3 benchmarks/gpu_check_plans.py --cpu-smoke  # interpreter, tiny, no plans
    PYTHONPATH=src python3 benchmarks/gpu_check_plans.py --cuda-launch  # plans through ctypes cuLaunchKernel

``--cuda-launch`` runs the same checks and table with the experimental ``runtime.cuda_launch``
(off by default, never run on a GPU before): its ``plans_on`` column is then that launcher.
Run it as a separate command, after the plain one: a wrong parameter layout would fault.

Writes ``$OUT/gpu_check_plans.json`` (``..._cuda_launch.json`` with ``--cuda-launch``; ``OUT``
defaults to ./gpu-out).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
import traceback

if "--cpu-smoke" in sys.argv:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import opforge  # noqa: E402
from opforge.ops.activation import problem as act_problem, reference as act_ref  # noqa: E402
from opforge.ops.norm import problem as norm_problem, reference as norm_ref  # noqa: E402
from opforge.ops.softmax import problem as sm_problem, reference as sm_ref  # noqa: E402
from opforge.runtime import alloc, cuda_launch, launch, plans  # noqa: E402
from opforge.testing import TOLERANCE, max_rel_error  # noqa: E402

SHAPES = [(2, 32, 256), (8, 128, 768), (1, 1, 4096), (1, 1, 8192)]
SMOKE_SHAPES = [(2, 3, 64)]


class Case:
    """One op: how to make inputs, call opforge and eager, the float64 reference, the plan key."""

    def __init__(self, op, make, mine, eager, ref, signature):
        self.op, self.make, self.mine, self.eager, self.ref, self.signature = op, make, mine, eager, ref, signature


def _one(shape, dev, dtype, scale=1.0):
    return {"x": torch.randn(shape, device=dev, dtype=dtype) * scale}


def _two(shape, dev, dtype):
    return {"x": torch.randn(shape, device=dev, dtype=dtype), "u": torch.randn(shape, device=dev, dtype=dtype)}


def _norm_inputs(residual, bias):
    def make(shape, dev, dtype):
        n = shape[-1]
        d = {"x": torch.randn(shape, device=dev, dtype=dtype), "w": torch.randn(n, device=dev, dtype=dtype)}
        if residual:
            d["r"] = torch.randn(shape, device=dev, dtype=dtype)
        if bias:
            d["b"] = torch.randn(n, device=dev, dtype=dtype)
        return d
    return make


def _d(t):
    return None if t is None else t.double()


def cases() -> list[Case]:
    out = []
    for op, eager in (("softmax", lambda a: torch.softmax(a["x"], -1)),
                      ("log_softmax", lambda a: torch.log_softmax(a["x"], -1))):
        out.append(Case(op, lambda s, dv, dt: _one(s, dv, dt, 4.0), lambda a, op=op: getattr(opforge, op)(a["x"]),
                        eager, lambda a, op=op: sm_ref.run(op, a["x"].double(), -1),
                        lambda a, op=op: (sm_problem.PLANS, sm_problem.signature(op, a["x"], -1))))
    unary = {"silu": F.silu, "gelu": F.gelu, "relu": torch.relu}
    for op, fn in unary.items():
        approx = "none" if op == "gelu" else None
        out.append(Case(op, _one, lambda a, op=op: getattr(opforge, op)(a["x"]), lambda a, fn=fn: fn(a["x"]),
                        lambda a, op=op, ap=approx: act_ref.run(op, a["x"].double(), None, ap),
                        lambda a, op=op, ap=approx: (act_problem.PLANS, act_problem.signature(op, a["x"], None, ap))))
    for op, fn in (("swiglu", F.silu), ("geglu", F.gelu)):
        approx = "none" if op == "geglu" else None
        out.append(Case(op, _two, lambda a, op=op: getattr(opforge, op)(a["x"], a["u"]),
                        lambda a, fn=fn: fn(a["x"]) * a["u"],
                        lambda a, op=op, ap=approx: act_ref.run(op, a["x"].double(), a["u"].double(), ap),
                        lambda a, op=op, ap=approx: (act_problem.PLANS,
                                                     act_problem.signature(op, a["x"], a["u"], ap))))
    out.append(Case("rms_norm", _norm_inputs(False, False), lambda a: opforge.rms_norm(a["x"], a["w"]),
                    lambda a: F.rms_norm(a["x"], (a["x"].shape[-1],), a["w"], 1e-6),
                    lambda a: norm_ref.run("rms_norm", a["x"].double(), None, a["w"].double(), None, 1e-6),
                    lambda a: (norm_problem.PLANS, norm_problem.signature("rms_norm", a["x"], None, a["w"], None))))
    out.append(Case("layer_norm", _norm_inputs(False, True), lambda a: opforge.layer_norm(a["x"], a["w"], a["b"]),
                    lambda a: F.layer_norm(a["x"], (a["x"].shape[-1],), a["w"], a["b"], 1e-5),
                    lambda a: norm_ref.run("layer_norm", a["x"].double(), None, a["w"].double(), a["b"].double(),
                                           1e-5),
                    lambda a: (norm_problem.PLANS,
                               norm_problem.signature("layer_norm", a["x"], None, a["w"], a["b"]))))

    def eager_add_rms(a):
        s = a["x"] + a["r"]
        return F.rms_norm(s, (s.shape[-1],), a["w"], 1e-6), s
    out.append(Case("add_rms_norm", _norm_inputs(True, False), lambda a: opforge.add_rms_norm(a["x"], a["r"], a["w"]),
                    eager_add_rms,
                    lambda a: norm_ref.run("add_rms_norm", a["x"].double(), a["r"].double(), a["w"].double(), None,
                                           1e-6),
                    lambda a: (norm_problem.PLANS,
                               norm_problem.signature("add_rms_norm", a["x"], a["r"], a["w"], None))))
    return out


def _sync(dev):
    if dev == "cuda":
        torch.cuda.synchronize()


def _set_plans(flag: bool) -> None:
    """Plans on/off for the next calls without dropping existing plans (``set_enabled`` drops
    them), so rounds of both can interleave."""
    plans._enabled = flag and not plans._CHECKING_KEYS


def _outputs(out):
    return out if isinstance(out, tuple) else (out,)


def check(case: Case, shape, dev, dtype) -> dict:
    row = {"op": case.op, "shape": "x".join(map(str, shape))}
    a = case.make(shape, dev, dtype)
    _set_plans(False)
    general = case.mine(a)
    _set_plans(True)
    for _ in range(2):
        case.mine(a)
    cache, sig = case.signature(a)
    row["plan"] = sig in cache
    with alloc.poisoned_outputs():
        planned = case.mine(a)
        fresh = case.make(shape, dev, dtype)
        out = case.mine(fresh)
    _sync(dev)
    row["bitwise_equal_general"] = all(torch.equal(g, p) for g, p in zip(_outputs(general), _outputs(planned)))
    row["rel_err"] = max_rel_error(out, case.ref(fresh))
    ok = row["rel_err"] <= TOLERANCE[dtype] and row["bitwise_equal_general"] and (row["plan"] or dev != "cuda")
    row["status"] = "PASS" if ok else "FAIL"
    return row


def race(dev, dtype) -> dict:
    """8 threads on a first call of a fresh signature, each its own data."""
    shape = (3, 1000 + 8 * int(time.time()) % 64)
    xs = [torch.randn(shape, device=dev, dtype=dtype) * 4 for _ in range(8)]
    outs = [None] * 8
    barrier = threading.Barrier(8)
    errors = []

    def work(i):
        try:
            barrier.wait()
            outs[i] = opforge.softmax(xs[i])
            _sync(dev)
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    worst = max((max_rel_error(y, sm_ref.run("softmax", x.double(), -1)) for x, y in zip(xs, outs) if y is not None),
                default=float("inf"))
    ok = not errors and worst <= TOLERANCE[dtype]
    return {"status": "PASS" if ok else "FAIL", "worst_rel_err": worst, "errors": errors}


def wall(fns: dict, dev, calls: int, rounds: int) -> dict:
    """Median over ``rounds`` of the wall time per call (us) of a loop of ``calls``; fns are
    (setup, call) pairs, setup run before each loop (it switches plans on or off)."""
    samples = {k: [] for k in fns}
    for setup, fn in fns.values():
        setup()
        for _ in range(20):
            fn()
    _sync(dev)
    for _ in range(rounds):
        for name, (setup, fn) in fns.items():
            setup()
            _sync(dev)
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            _sync(dev)
            samples[name].append((time.perf_counter() - t0) / calls * 1e6)
    _set_plans(True)
    return {k: statistics.median(v) for k, v in samples.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny shapes under the interpreter (no plans)")
    ap.add_argument("--cuda-launch", action="store_true", help="plans launch through ctypes cuLaunchKernel")
    ap.add_argument("--calls", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    dev = "cpu" if args.cpu_smoke else "cuda"
    if dev == "cuda" and not torch.cuda.is_available():
        sys.exit("no CUDA device; use --cpu-smoke")
    shapes = SMOKE_SHAPES if args.cpu_smoke else SHAPES
    calls, rounds = (20, 2) if args.cpu_smoke else (args.calls, args.rounds)
    dtype = torch.bfloat16
    out_dir = os.environ.get("OUT", "./gpu-out")
    os.makedirs(out_dir, exist_ok=True)
    t_start = time.time()
    cuda_launch.set_enabled(args.cuda_launch)
    previous = plans.set_enabled(True)
    result = {"device": torch.cuda.get_device_name() if dev == "cuda" else "cpu", "torch": torch.__version__,
              "plans_default": plans.DEFAULT_ENABLED, "checking_keys": plans._CHECKING_KEYS,
              "calls": calls, "rounds": rounds, "cuda_launch": args.cuda_launch, "checks": [], "timing": []}
    try:
        import triton
        result["triton"] = triton.__version__
    except ImportError:
        pass
    print(f"== correctness (bf16; plan exists, planned output == general path bit for bit, fresh data vs float64)")
    for case in cases():
        for shape in shapes:
            try:
                row = check(case, shape, dev, dtype)
            except Exception as e:  # noqa: BLE001
                row = {"op": case.op, "shape": "x".join(map(str, shape)), "status": "FAIL", "error": repr(e)}
                traceback.print_exc()
            result["checks"].append(row)
            print(f"{row['status']} {row['op']:13s} {row['shape']:10s} plan={row.get('plan')} "
                  f"equal={row.get('bitwise_equal_general')} rel_err={row.get('rel_err', float('nan')):.2e}",
                  flush=True)
    try:
        result["race"] = race(dev, dtype)
    except Exception as e:  # noqa: BLE001
        result["race"] = {"status": "FAIL", "errors": [repr(e)]}
    print(f"{result['race']['status']} 8 threads racing on a first softmax call: {result['race']}")

    # Whether plans call the C launch function directly (launch.c_launch) on this Triton.
    c_direct = None
    try:
        from opforge.ops.softmax import triton_kernels as smk
        compiled = [v for v in smk._tile._compiled.values() if v]
        c_direct = bool(compiled) and launch.c_launch(compiled[0][2]) is not None
        if args.cuda_launch:
            kernels = [v[4] for v in compiled]   # the prepared tuple keeps Triton's compiled kernel last
            result["cuda_launch_applies"] = bool(kernels) and cuda_launch.launcher_for(kernels[0]) is not None
            print(f"cuda_launch applies to softmax's tile kernel: {result['cuda_launch_applies']}")
    except Exception:  # noqa: BLE001
        traceback.print_exc()
    result["c_launch_direct"] = c_direct

    print(f"\n== wall time per call, us (median of {rounds} interleaved loops of {calls}; "
          f"plans call the C launch directly: {c_direct}; through ctypes cuLaunchKernel: {args.cuda_launch})")
    on, off = (lambda: _set_plans(True)), (lambda: _set_plans(False))
    for case in cases():
        for shape in shapes:
            try:
                a = case.make(shape, dev, dtype)
                x = a["x"]
                fns = {"eager": (on, lambda: case.eager(a)),
                       "plans_off": (off, lambda: case.mine(a)),
                       "plans_on": (on, lambda: case.mine(a)),
                       "empty_like": (on, lambda: torch.empty_like(x))}
                t = wall(fns, dev, calls, rounds)
                row = {"op": case.op, "shape": "x".join(map(str, shape)), **{k: round(v, 2) for k, v in t.items()},
                       "ratio_off": round(t["eager"] / t["plans_off"], 3),
                       "ratio_on": round(t["eager"] / t["plans_on"], 3)}
                row["met"] = t["plans_on"] <= t["eager"]
            except Exception as e:  # noqa: BLE001
                row = {"op": case.op, "shape": "x".join(map(str, shape)), "error": repr(e)}
                traceback.print_exc()
            result["timing"].append(row)
    plans.set_enabled(previous)
    result["seconds"] = round(time.time() - t_start, 1)

    print(f"\n{'op':13s} {'shape':10s} {'eager':>7s} {'off':>7s} {'on':>7s} {'empty':>7s}  "
          f"{'eager/off':>9s} {'eager/on':>9s}  met")
    for r in result["timing"]:
        if "error" in r:
            print(f"{r['op']:13s} {r['shape']:10s} ERROR {r['error']}")
            continue
        print(f"{r['op']:13s} {r['shape']:10s} {r['eager']:7.2f} {r['plans_off']:7.2f} {r['plans_on']:7.2f} "
              f"{r['empty_like']:7.2f}  {r['ratio_off']:8.2f}x {r['ratio_on']:8.2f}x  {'yes' if r['met'] else 'NO'}")
    met = sum(1 for r in result["timing"] if r.get("met"))
    passed = sum(1 for r in result["checks"] if r["status"] == "PASS")
    print(f"\nchecks {passed}/{len(result['checks'])} PASS, race {result['race']['status']}; "
          f"plans on <= eager in {met}/{len(result['timing'])} cells; {result['seconds']} s")
    path = os.path.join(out_dir, "gpu_check_plans_cuda_launch.json" if args.cuda_launch else "gpu_check_plans.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=1, default=str)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
