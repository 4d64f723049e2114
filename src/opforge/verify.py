"""``opforge verify``: every op on every backend this machine has, against the float64 oracle."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Optional, Sequence

import torch

from .runtime import alloc, backends, registry
from .runtime.device import device_info
from .runtime.policy import backend as force_backend
from .runtime.trace import trace
from .testing import TOLERANCE, max_rel_error


def _families():
    from .ops.activation import cases as activation_cases
    from .ops.attention import cases as attention_cases
    from .ops.norm import cases as norm_cases
    from .ops.softmax import cases as softmax_cases
    from .ops.quant import cases as quant_cases
    from .ops.rotary import cases as rotary_cases
    from .ops.delay import cases as delay_cases
    from .ops.paged import cases as paged_cases
    return [norm_cases, softmax_cases, activation_cases, attention_cases, quant_cases, rotary_cases, delay_cases,
            paged_cases]


def _device_type() -> str:
    if torch.cuda.is_available():
        return "cuda"
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return "mps"
    return "cpu"


def print_info() -> int:
    """Print the devices and which backends can run on them."""
    dtype = _device_type()
    info = device_info()
    print(f"device:   {info}")
    print(f"config:   {device_config_line()}")
    for name in ("triton", "metal", "torch"):
        reason = backends.unavailable_reason(name, dtype)
        print(f"{name:8s}  {'available' if reason is None else 'unavailable: ' + reason}")
    print(f"launch:   {launch_settings_line()}")
    print(f"torch {torch.__version__}" + (f", triton {_triton_version()}" if _triton_version() else ""))
    return 0


def launch_settings_line() -> str:
    """The settings that decide which kernel runs, each with the environment variable that sets it.

    Example:
        >>> "OPFORGE_PLANS" in launch_settings_line()
        True
    """
    from .ops.quant import problem as quant_problem
    from .runtime import plans
    try:
        from .ops.attention import triton_kernels as attention_kernels
        from .ops.quant import dense_gemv, triton_kernels as quant_kernels
        wide, dense = quant_kernels.WIDE_K, dense_gemv.DENSE_GEMV
        swap, join = quant_kernels.DOT_SWAP, quant_kernels.DOT_JOIN
        by_length = attention_kernels.DECODE_BY_LENGTH
        from .runtime import pdl
        dependent = pdl.ENABLED and pdl.HAVE_GDC
    except ImportError:       # no triton here: none of these kernels exists
        wide = dense = swap = join = by_length = dependent = None

    def state(flag: Optional[bool]) -> str:
        return "n/a" if flag is None else ("on" if flag else "off")
    return (f"plans {state(plans.enabled())} (OPFORGE_PLANS), quant tuned {state(quant_problem.TUNED)} "
            f"(OPFORGE_QUANT_TUNED), wide-K GEMV {state(wide)} (OPFORGE_QUANT_WIDE_K), dense GEMV "
            f"{state(dense)} (OPFORGE_DENSE_GEMV), swapped dot tiles {state(swap)} (OPFORGE_QUANT_SWAP), "
            f"int4 join unpack {state(join)} (OPFORGE_QUANT_JOIN), decode attention slices by length "
            f"{state(by_length)} (OPFORGE_DECODE_BY_LENGTH), programmatic dependent launch {state(dependent)} "
            f"on sm_90+ (OPFORGE_PDL)")


def device_config_line() -> str:
    """``opforge.device_config()`` in one line, with the measured copy bandwidth on a GPU."""
    from .runtime.device_config import device_config
    cfg = device_config()
    return str(cfg) + (f", copy {cfg.copy_bandwidth_gbs:.0f} GB/s" if cfg.kind != "cpu" else "")


def _triton_version() -> Optional[str]:
    try:
        import triton
        return triton.__version__
    except ImportError:
        return None


def _needs_interpreter_reexec() -> bool:
    """On a machine with no GPU, verify the Triton kernels through the interpreter (set before import)."""
    return _device_type() == "cpu" and not backends.triton_interpreting() and _triton_version() is not None \
        and os.environ.get("OPFORGE_VERIFY_CHILD") != "1"


def run_verify(ops: Optional[Sequence[str]] = None, quick: bool = False) -> int:
    """Check every op on every available backend; print a table; return 1 on any failure (2 for
    an unknown op name)."""
    unknown = sorted(set(ops or ()) - set(registry.ops()))
    if unknown:
        print(f"opforge verify: unknown op {', '.join(unknown)}; known ops: {', '.join(registry.ops())}",
              file=sys.stderr)
        return 2
    emulate_metal = _device_type() == "cpu" and not backends.metal_emulating()
    if emulate_metal:
        from .runtime.metal import emulator_unavailable_reason
        emulate_metal = emulator_unavailable_reason() is None
    if emulate_metal:
        print("no Apple GPU here: Metal kernels run in the MSL emulator (tests/metal_emu); "
              "verified by emulation, not on Apple hardware")
        os.environ["OPFORGE_METAL_EMULATE"] = "1"
        registry.clear_cache()
        try:
            return _run_verify(ops, quick)
        finally:
            del os.environ["OPFORGE_METAL_EMULATE"]
            registry.clear_cache()
    return _run_verify(ops, quick)


def _run_verify(ops: Optional[Sequence[str]], quick: bool) -> int:
    if _needs_interpreter_reexec():
        env = dict(os.environ, TRITON_INTERPRET="1", OPFORGE_VERIFY_CHILD="1")
        argv = [sys.executable, "-m", "opforge", "verify"] + (["--ops", ",".join(ops)] if ops else []) + \
            (["--quick"] if quick else [])
        print("no GPU here: running the Triton kernels through Triton's interpreter (TRITON_INTERPRET=1)")
        return subprocess.call(argv, env=env)
    device_type = _device_type()
    device = "cuda" if device_type == "cuda" else device_type
    names = [b for b in ("triton", "metal", "torch") if backends.unavailable_reason(b, device_type) is None]
    rows, failures = [], 0
    start = time.perf_counter()
    torch.manual_seed(0)
    progress = os.environ.get("OPFORGE_VERIFY_PROGRESS", "") not in ("", "0")  # set by scripts/gpu_test.sh
    for family in _families():
        if progress:
            print(f"verify: {family.__name__} from {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
        for case in family.verify_cases(device_type, quick):
            if ops and case.op not in ops:
                continue
            for name in names:
                if not any(v.backend == name for v in registry.variants(case.op)):
                    continue
                args, kwargs = case.make(device)
                try:
                    # outputs start as NaN, so an element a kernel never writes fails the check
                    with force_backend(name), trace() as t, alloc.poisoned_outputs():
                        out = case.call(*args, **kwargs)
                    err = max_rel_error(out, case.reference(args, kwargs, out))
                    variant = t[0].variant if len(t) else "?"
                    ok = err <= TOLERANCE[case.dtype] and len(t) == 1 and t[0].backend == name
                except Exception as exc:  # report and keep going: verify must show every failure
                    err, variant, ok = float("nan"), f"error: {type(exc).__name__}: {exc}", False
                failures += not ok
                rows.append((case.op, name, variant, str(case.dtype).replace("torch.", ""), case.label,
                             f"{err:.2e}", "pass" if ok else "FAIL"))
    _print_table(("op", "backend", "variant", "dtype", "shape", "rel err", "result"), rows)
    print(f"{len(rows) - failures}/{len(rows)} passed on {device_info()} in {time.perf_counter() - start:.1f} s")
    return 1 if failures else 0


def _print_table(header: tuple, rows: list[tuple]) -> None:
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
    for r in [header, tuple("-" * w for w in widths)] + rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip())
