"""Check, then time, opforge.fuse on a GPU: the generated kernels against float64, and the
target fused chain ``gelu(x + b) * s + r`` at 16384 x 4096 bfloat16 against torch.

Run on the GPU machine (about 1.5-2.5 minutes on an H100, most of it torch.compile):

    PYTHONPATH=src python3 benchmarks/tools/gpu_check_fusion.py [--out DIR] [--budget SECONDS] [--no-compile]
                                                          [--no-sweep] [--keep-caches]

The caches of Triton, TorchInductor and opforge point at fresh temporary folders (unless
--keep-caches), so first calls are cold.

1. First calls, before anything else compiles in the process: opforge (trace + codegen +
   Triton compile + launch) and torch.compile, each for a cold process and again for a second
   function in the now warm process. Target: opforge >= 10x shorter than torch.compile.
2. Correctness of the compiled kernels (the tests run Triton's interpreter): the chain at
   16384 x 4096 bf16 and at odd sizes in every dtype, every broadcast class (row, column,
   0-d, 1-element, strided, expanded, a 0-d CPU tensor), Python numbers, integer and bool
   outputs, outputs of different shapes, the math functions on special values, int64 indexing
   (2**31 + elements), random expression trees; launch keys checked against Triton's own.
   The cache: repeated calls make no trace, kernel or plan, and launch directly.
3. Speed (``triton.testing.do_bench``, median, L2 flushed): the fused chain, the same function
   in torch eager and under torch.compile, and a device-to-device copy timed the same way.
   Targets: >= 90% of copy bandwidth, >= 2.5x eager, within 3% of torch.compile.
4. Wall time of a cached call (launch + GPU, synchronized) against one eager torch op of the
   same size (target: within 1.5x), and host time per call on a small tensor.
5. Sweep of block sizes (TILE_BYTES x num_warps) for the tiled and the flat kernel.

Writes ``gpu_check_fusion.json`` into --out (default: $OUT or .). ``--dry-run`` runs the same
logic on the CPU through Triton's interpreter at small sizes (no timings worth reading), to check
the script itself without a GPU.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import sys
import tempfile
import time
from typing import Any, Callable

START = time.perf_counter()


def _fresh_caches() -> str:
    root = tempfile.mkdtemp(prefix="opforge-fusion-check-")
    for var, sub in (("TRITON_CACHE_DIR", "triton"), ("TORCHINDUCTOR_CACHE_DIR", "inductor"),
                     ("OPFORGE_CACHE_DIR", "opforge")):
        os.environ[var] = os.path.join(root, sub)
    return root


if "--keep-caches" not in sys.argv:
    CACHE_ROOT = _fresh_caches()   # before torch and triton read these
else:
    CACHE_ROOT = ""
DRY_RUN = "--dry-run" in sys.argv   # the script's logic on CPU, through Triton's interpreter, small sizes
if DRY_RUN:
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402
from triton.testing import do_bench  # noqa: E402

import opforge  # noqa: E402
from opforge.fusion import config as fconfig  # noqa: E402
from opforge.fusion import (abs as fabs, clear_caches, erf, exp, fuse, log, maximum, minimum,  # noqa: E402
                            rsqrt, sigmoid, sqrt, tanh, where)
from opforge.runtime.triton import launch as launch_module  # noqa: E402

DEVICE = "cpu" if DRY_RUN else "cuda"
ROWS, COLS = (64, 256) if DRY_RUN else (16384, 4096)
BF16 = torch.bfloat16
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}
RESULTS: dict[str, Any] = {"checks": [], "targets": {}}
gelu = getattr(opforge, "gelu", None) or F.gelu


def elapsed() -> float:
    return time.perf_counter() - START


def say(text: str) -> None:
    print(f"[{elapsed():6.1f}s] {text}", flush=True)


def chain(x, b, r, s: float):
    """The target chain; ``gelu`` is opforge.gelu when the package exports it."""
    return gelu(x + b) * s + r


def chain_eager(x, b, r, s: float):
    return F.gelu(x + b) * s + r


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    out64, ref64 = out.double(), ref.double()
    if not torch.isfinite(out64).all():
        return math.inf
    return ((out64 - ref64).norm() / ref64.norm().clamp_min(1e-300)).item()


def record(name: str, ok: bool, detail: str = "") -> None:
    RESULTS["checks"].append({"name": name, "ok": bool(ok), "detail": detail})
    say(f"{'ok  ' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}")


def sync() -> None:
    if not DRY_RUN:
        torch.cuda.synchronize()


def wall(fn: Callable[[], Any]) -> float:
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - t0


# --------------------------------------------------------------------------- 1. first calls
def first_calls(x, b, r, do_compile: bool) -> None:
    say("first calls (cold caches)")
    wall(lambda: torch.add(x[:1], 1))                        # CUDA context and allocator warm
    ours_cold = wall(lambda: fuse(chain)(x, b, r, 0.5))

    def second(x, b, r, s: float):
        return gelu(x - b) * s + r * 0.5

    ours_warm = wall(lambda: fuse(second)(x, b, r, 0.5))

    def third(x, b, r, s: float):
        return gelu(x * b) * s - r

    f3 = fuse(third)      # where a first call's time goes: trace + codegen + import, then compile + launch
    prepare = wall(lambda: f3.source(DEVICE, x, b, r, 0.5))
    compile_launch = wall(lambda: f3(x, b, r, 0.5))
    out = {"opforge_cold_s": ours_cold, "opforge_warm_process_s": ours_warm,
           "opforge_trace_codegen_import_s": prepare, "opforge_compile_launch_s": compile_launch}
    if do_compile:
        torch._dynamo.reset()
        compiled_cold = wall(lambda: torch.compile(chain_eager)(x, b, r, 0.5))

        def second_eager(x, b, r, s: float):
            return F.gelu(x - b) * s + r * 0.5

        compiled_warm = wall(lambda: torch.compile(second_eager)(x, b, r, 0.5))
        out.update(torch_compile_cold_s=compiled_cold, torch_compile_warm_process_s=compiled_warm,
                   ratio_cold=compiled_cold / ours_cold, ratio_warm=compiled_warm / ours_warm)
        RESULTS["targets"]["first_call_10x_shorter_cold_process"] = out["ratio_cold"] >= 10
        RESULTS["targets"]["first_call_10x_shorter_warm_process"] = out["ratio_warm"] >= 10
    RESULTS["first_call"] = out
    say("first call: " + ", ".join(f"{k} {v:.3f}" for k, v in out.items()))


# --------------------------------------------------------------------------- 2. correctness
def check_chain(x, b, r) -> None:
    f = fuse(chain)
    out = f(x, b, r, 0.5)
    ref = chain_eager(x.double(), b.double(), r.double(), 0.5)
    err = rel_error(out, ref)
    eager_err = rel_error(chain_eager(x, b, r, 0.5), ref)
    RESULTS["chain_error"] = {"opforge": err, "torch_eager": eager_err}
    record(f"chain {ROWS}x{COLS} bf16 vs float64", err <= TOL[BF16],
           f"rel err {err:.2e} (torch eager bf16: {eager_err:.2e})")
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        m, n = (31, 97) if DRY_RUN else (1031, 997)
        args = (torch.randn(m, n, device=DEVICE).to(dtype), torch.randn(n, device=DEVICE).to(dtype),
                torch.randn(m, n, device=DEVICE).to(dtype), -1.25)
        err = rel_error(f(*args), chain_eager(*[a.double() if torch.is_tensor(a) else a for a in args]))
        record(f"chain {m}x{n} {str(dtype)[6:]}", err <= TOL[dtype], f"rel err {err:.2e}")


def check_case(name: str, fn: Callable, args: tuple, factor: float = 2.0) -> None:
    """Fused ``fn`` against ``fn`` on float64 copies: floating outputs within factor x the dtype's
    tolerance (NaNs in the same places), integer and bool outputs equal, dtypes and shapes as torch's."""
    try:
        out = fuse(fn)(*args)
        ref = fn(*[a.double() if torch.is_tensor(a) and a.is_floating_point() else a for a in args])
        expected = fn(*args)
        outs = out if isinstance(out, tuple) else (out,)
        refs = ref if isinstance(ref, tuple) else (ref,)
        exps = expected if isinstance(expected, tuple) else (expected,)
        worst = 0.0   # error / tolerance, over the outputs
        for o, rf, e in zip(outs, refs, exps):
            assert o.shape == e.shape and o.dtype == e.dtype, (o.shape, e.shape, o.dtype, e.dtype)
            if not o.dtype.is_floating_point:
                assert torch.equal(o, rf.to(o.dtype)), "integer/bool output differs"
                continue
            o64, r64 = o.double(), rf.double()
            assert torch.equal(o64.isnan(), r64.isnan()), "NaN positions differ"
            keep = ~r64.isnan() & ~(r64.isinf() & (o64 == r64))
            if keep.any():
                worst = max(worst, rel_error(o64[keep], r64[keep]) / (TOL.get(o.dtype, 1e-5) * factor))
        record(name, worst <= 1.0, f"worst error {worst:.2f} of the tolerance")
    except Exception as exc:  # report and go on: one failure must not hide the rest
        record(name, False, f"{type(exc).__name__}: {exc}"[:300])


def battery() -> None:
    say("correctness of the compiled kernels (launch keys checked)")
    dev = DEVICE
    rn = lambda *s, dtype=torch.float32: torch.randn(s, device=dev).to(dtype)  # noqa: E731
    g3 = lambda x, y, z: (x * y + z, exp(x) - z)  # noqa: E731
    for shapes in [((64, 96), (96,), ()), ((64, 96), (64, 1), (1, 96)), ((2, 30, 96), (30, 1), (96,)),
                   ((3, 1, 50), (40, 1), (1,)), ((), (), ()), ((5000,), (1,), (5000,))]:
        check_case("broadcast " + " ".join("x".join(map(str, s)) or "0d" for s in shapes), g3,
                   tuple(rn(*s) for s in shapes))
    check_case("strided / transposed / expanded", lambda x, y, z: (x * y + z, x - y * z),
               (rn(80, 60).t(), rn(60, 160)[:, ::2], rn(60, 1).expand(60, 80)))
    check_case("3-d strided last dim", g3, (rn(3, 40, 100)[:, :, ::2], rn(40, 50), rn(3, 1, 50)))
    check_case("0-d CPU tensor beside CUDA tensors", lambda x, s: x * s, (rn(64, 64), torch.tensor(3.0)))
    check_case("python numbers", lambda x, s, n, flag: where(flag, x * s + n, x / n), (rn(64, 64), 0.3, 3, True))
    check_case("int and bool tensors", lambda i, m: (i * 3 - 1, i / 2, where(m, i, -i), maximum(i, 0), m * 2),
               (torch.randint(-5, 5, (64, 64), device=dev, dtype=torch.int32), rn(64, 64) > 0))
    check_case("promotion bf16+f16, int32+f32", lambda a, b, c, d: (a + b, c * d, a > b),
               (rn(64, 64, dtype=BF16), rn(64, dtype=torch.float16), torch.arange(64, device=dev, dtype=torch.int32),
                rn(64, 64)))
    check_case("outputs of different shapes", lambda x, b: (x + b, b * 2, sigmoid(x)), (rn(64, 96), rn(96)))
    x = torch.cat([torch.linspace(-12, 12, 4001), torch.logspace(-8, 1, 500), -torch.logspace(-8, 1, 500),
                   torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0])]).to(dev)
    check_case("math functions incl. special values",
               lambda x: (erf(x), tanh(x), sigmoid(x), exp(x * 0.1), log(fabs(x)), sqrt(fabs(x)), rsqrt(fabs(x)),
                          minimum(x, 0.25), maximum(x, float("nan")), x ** 3, fabs(x) ** 1.7, x / 0.0,
                          where(x > 0, x, -float("inf")), F.relu(x), F.silu(x), F.gelu(x, approximate="tanh")),
               (x,), factor=5)
    # (the interpreter's bf16 conversions truncate: a dry run allows that)
    check_case("casts", lambda x: (x.to(BF16).float() * 3, x.int(), x.half()), (rn(64, 64) * 4,),
               factor=1000 if DRY_RUN else 2)
    random_trees(12)
    int64_indexing()
    cache_behaviour()


UNARY = {"neg": lambda a: -a, "abs": fabs, "tanh": tanh, "erf": erf, "sigmoid": sigmoid,
         "exp": lambda a: exp(tanh(a) * 3), "log": lambda a: log(fabs(a) + 1), "sqrt": lambda a: sqrt(fabs(a)),
         "rsqrt": lambda a: rsqrt(fabs(a) + 0.5), "cube": lambda a: tanh(a) ** 3, "gelu": F.gelu, "silu": F.silu}
BINARY = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
          "div": lambda a, b: a / (fabs(b) + 1), "min": minimum, "max": maximum,
          "where": lambda a, b: where(a > b, a - b, (b - a) * 0.5)}


def random_tree(rng: random.Random, depth: int) -> tuple:
    if depth == 0 or rng.random() < 0.25:
        return ("input", rng.randrange(3))
    if rng.random() < 0.4:
        return (rng.choice(sorted(UNARY)), random_tree(rng, depth - 1))
    return (rng.choice(sorted(BINARY)), random_tree(rng, depth - 1), random_tree(rng, depth - 1))


def evaluate(tree: tuple, xs: tuple) -> Any:
    if tree[0] == "input":
        return xs[tree[1]]
    if tree[0] in UNARY:
        return UNARY[tree[0]](evaluate(tree[1], xs))
    return BINARY[tree[0]](evaluate(tree[1], xs), evaluate(tree[2], xs))


def random_trees(n: int) -> None:
    rng = random.Random(1234)
    for i in range(n):
        tree = ("add", random_tree(rng, 4), ("input", 0))
        shapes = [(48, 80), rng.choice([(80,), (48, 1), (48, 80), ()]), rng.choice([(80,), (48, 80), (1, 1)])]
        dtype = rng.choice([torch.float32, BF16])
        args = tuple((torch.randn(s, device=DEVICE) * 2).to(dtype) for s in shapes)
        check_case(f"random tree {i} {str(dtype)[6:]}", lambda a, b, c, t=tree: evaluate(t, (a, b, c)), args,
                   factor=8)


def int64_indexing() -> None:
    if DRY_RUN:
        return
    n = 2**31 + 4096
    try:
        x = torch.empty(n, device="cuda", dtype=BF16)
        x[:4096] = 1.5
        x[-4096:] = -2.0
        y = fuse(lambda x: x * 2 + 1)(x)
        ok = bool((y[:4096] == 4.0).all() and (y[-4096:] == -3.0).all())
        record("int64 indexing (2**31 + 4096 elements)", ok, "")
        del x, y
    except torch.cuda.OutOfMemoryError:
        record("int64 indexing (2**31 + 4096 elements)", True, "skipped: not enough memory")
    torch.cuda.empty_cache()


def cache_behaviour() -> None:
    f = fuse(chain)
    x, b, r = (torch.randn(256, 512, device=DEVICE, dtype=BF16), torch.randn(512, device=DEVICE, dtype=BF16),
               torch.randn(256, 512, device=DEVICE, dtype=BF16))
    f(x, b, r, 0.5)
    before = f.cache_info()
    for s in (0.25, 1.0, 2.0):
        f(torch.randn_like(x), b, r, s)
    after = f.cache_info()
    launcher = next(iter(f._kernels.values())).launcher
    record("second call: no trace, kernel or plan; direct launch",
           before == after and (launcher.fast_path or DRY_RUN),
           f"{after}, fast path {launcher.fast_path}")


# --------------------------------------------------------------------------- 3. speed
def bench(fn: Callable[[], Any]) -> float:
    """Median GPU milliseconds of ``fn`` (L2 flushed between runs)."""
    if DRY_RUN:
        return 1e3 * min(wall(fn) for _ in range(3))
    return do_bench(fn, warmup=25, rep=200, return_mode="median")


def copy_bandwidth() -> float:
    src = torch.empty(1 << (20 if DRY_RUN else 29), device=DEVICE, dtype=torch.float16)   # 1 GiB on the GPU
    dst = torch.empty_like(src)
    ms = bench(lambda: dst.copy_(src))
    gbs = 2 * src.numel() * src.element_size() / (ms * 1e-3) / 1e9
    del src, dst
    if not DRY_RUN:
        torch.cuda.empty_cache()
    return gbs


def speed(x, b, r, do_compile: bool) -> None:
    say(f"speed at {ROWS} x {COLS} bf16")
    copy_gbs = copy_bandwidth()
    try:
        cached = opforge.device_info(DEVICE).copy_bandwidth_gbs
    except Exception:   # pragma: no cover - informational only
        cached = float("nan")
    bytes_moved = 3 * x.numel() * x.element_size() + b.numel() * b.element_size()
    f = fuse(chain)
    f(x, b, r, 0.5)
    ms = {"opforge": bench(lambda: f(x, b, r, 0.5)), "torch_eager": bench(lambda: chain_eager(x, b, r, 0.5))}
    if do_compile:
        compiled = torch.compile(chain_eager)
        compiled(x, b, r, 0.5)
        ms["torch_compile"] = bench(lambda: compiled(x, b, r, 0.5))
    gbs = {k: bytes_moved / (v * 1e-3) / 1e9 for k, v in ms.items()}
    pct = {k: 100 * v / copy_gbs for k, v in gbs.items()}
    RESULTS["speed"] = {"copy_gbs": copy_gbs, "device_info_copy_gbs": cached, "bytes": bytes_moved, "ms": ms,
                        "gbs": gbs, "pct_of_copy": pct}
    for k in ms:
        say(f"  {k:13s} {ms[k] * 1e3:8.1f} us  {gbs[k]:7.0f} GB/s  {pct[k]:5.1f}% of copy ({copy_gbs:.0f} GB/s)")
    t = RESULTS["targets"]
    t["pct_of_copy_ge_90"] = pct["opforge"] >= 90
    t["speedup_vs_eager_ge_2.5"] = ms["torch_eager"] / ms["opforge"] >= 2.5
    if "torch_compile" in ms:
        t["within_3pct_of_torch_compile"] = ms["opforge"] <= 1.03 * ms["torch_compile"]
    say(f"  speedup vs eager {ms['torch_eager'] / ms['opforge']:.2f}x" +
        (f", vs torch.compile {ms['torch_compile'] / ms['opforge']:.3f}x" if "torch_compile" in ms else ""))


# --------------------------------------------------------------------------- 4. wall time per call
def call_wall_times(x, b, r) -> None:
    say("wall time of a cached call")
    f = fuse(chain)
    f(x, b, r, 0.5)

    def median_wall(fn: Callable[[], Any], n: int = 100) -> float:
        for _ in range(10):
            fn()
        return statistics.median(wall(fn) for _ in range(n))

    fused = median_wall(lambda: f(x, b, r, 0.5))
    one_op = median_wall(lambda: torch.add(x, r))
    small = [t[:1, :4096].contiguous() for t in (x, r)]
    sb = b[:4096]
    f(small[0], sb, small[1], 0.5)

    def host_per_call(fn: Callable[[], Any], n: int = 2000) -> float:
        for _ in range(50):
            fn()
        sync()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        t1 = time.perf_counter()
        sync()
        return (t1 - t0) / n

    host_fused = host_per_call(lambda: f(small[0], sb, small[1], 0.5))
    host_op = host_per_call(lambda: torch.add(small[0], small[1]))
    RESULTS["wall"] = {"fused_call_s": fused, "one_eager_op_s": one_op, "ratio": fused / one_op,
                       "host_us_per_fused_call_1x4096": host_fused * 1e6,
                       "host_us_per_eager_add_1x4096": host_op * 1e6}
    RESULTS["targets"]["cached_call_within_1.5x_of_one_op"] = fused <= 1.5 * one_op
    say(f"  fused call {fused * 1e6:.1f} us vs one eager op {one_op * 1e6:.1f} us ({fused / one_op:.2f}x); "
        f"host per call at 1x4096: fused {host_fused * 1e6:.1f} us, torch.add {host_op * 1e6:.1f} us")


# --------------------------------------------------------------------------- 5. sweep
def sweep(x, b, r, budget: float) -> None:
    say("block-size sweep (tiled chain; flat chain without the bias)")
    flat_chain = fuse(lambda x, r, s: gelu(x) * s + r)
    tiled = fuse(chain)
    rows = []
    default = (fconfig.TILE_BYTES, fconfig.NUM_WARPS)
    try:
        for tile_bytes in (2048, 4096, 8192, 16384):
            for warps in (4, 8):
                if elapsed() > budget:
                    say("  (budget reached: sweep cut short)")
                    return
                fconfig.TILE_BYTES, fconfig.NUM_WARPS = tile_bytes, warps
                clear_caches()
                tiled(x, b, r, 0.5)
                flat_chain(x, r, 0.5)
                rows.append({"tile_bytes": tile_bytes, "num_warps": warps,
                             "tiled_us": bench(lambda: tiled(x, b, r, 0.5)) * 1e3,
                             "flat_us": bench(lambda: flat_chain(x, r, 0.5)) * 1e3})
                say(f"  TILE_BYTES {tile_bytes:5d} warps {warps}: tiled {rows[-1]['tiled_us']:7.1f} us, "
                    f"flat {rows[-1]['flat_us']:7.1f} us")
    finally:
        fconfig.TILE_BYTES, fconfig.NUM_WARPS = default
        clear_caches()
        RESULTS["sweep"] = rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--budget", type=float, default=170.0, help="seconds; the sweep stops past it")
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    parser.add_argument("--no-sweep", action="store_true")
    parser.add_argument("--keep-caches", action="store_true", help="use the usual cache folders (warm first calls)")
    parser.add_argument("--dry-run", action="store_true", help="CPU, Triton interpreter, small sizes (no GPU)")
    args = parser.parse_args()
    if args.dry_run:
        args.no_compile = True
        with opforge.backend("triton"):
            run(args)
        return
    if not torch.cuda.is_available():
        sys.exit("needs a CUDA GPU (or --dry-run)")
    run(args)


def run(args: argparse.Namespace) -> None:
    gpu = "cpu (dry run)" if DRY_RUN else torch.cuda.get_device_name()
    RESULTS["env"] = {"gpu": gpu, "torch": torch.__version__, "triton": triton.__version__,
                      "opforge_gelu": gelu is not F.gelu, "cache_root": CACHE_ROOT,
                      "tile_bytes": fconfig.TILE_BYTES, "num_warps": fconfig.NUM_WARPS}
    say(f"{RESULTS['env']}")
    torch.manual_seed(0)
    x = torch.randn(ROWS, COLS, device=DEVICE, dtype=BF16)
    b = torch.randn(COLS, device=DEVICE, dtype=BF16)
    r = torch.randn(ROWS, COLS, device=DEVICE, dtype=BF16)
    first_calls(x, b, r, not args.no_compile)
    launch_module._CHECK_KEYS = True        # every launch key checked against Triton's generic one
    try:
        check_chain(x, b, r)
        battery()
    finally:
        launch_module._CHECK_KEYS = False
    speed(x, b, r, not args.no_compile)
    call_wall_times(x, b, r)
    if not args.no_sweep:
        sweep(x, b, r, args.budget)
    failed = [c["name"] for c in RESULTS["checks"] if not c["ok"]]
    RESULTS["summary"] = {"checks_failed": failed, "targets": RESULTS["targets"], "seconds": elapsed()}
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "gpu_check_fusion.json")
    with open(path, "w") as handle:
        json.dump(RESULTS, handle, indent=1, default=str)
    say(f"checks: {len(RESULTS['checks']) - len(failed)}/{len(RESULTS['checks'])} ok" +
        (f"; FAILED: {failed}" if failed else ""))
    for name, ok in RESULTS["targets"].items():
        say(f"target {name}: {'PASS' if ok else 'MISS'}")
    say(f"wrote {path}")


if __name__ == "__main__":
    main()
