"""Run suites: for each case, build, verify and time every implementation in one process.

Per implementation and case, in order: build (absent if it cannot run here), first
call (timed: compilation included), check against the float64 oracle (a wrong result
is flagged and never ranked), a few warm-up calls, wall time per call (loops with one
synchronize at the end), then device time (median of event-timed calls). GB/s and the
share of the copy bandwidth measured at the start of the run follow from device time.
"""

from __future__ import annotations

import math
import statistics
import time
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple, Sequence

import torch

from opforge.bench import chain as _chain
from opforge.bench import envinfo
from opforge.bench.progress import Progress
from opforge.bench.results import (
    ABSENT,
    ERROR,
    OK,
    SKIPPED,
    WRONG,
    CaseResult,
    ChainResult,
    ImplResult,
    RunResult,
    SuiteResult,
    TargetResult,
)
from opforge.bench.spec import (
    COMPILE,
    CPU,
    IMPL_ORDER,
    OPFORGE,
    TORCH,
    Absent,
    BuildContext,
    Inputs,
    OpSpec,
    Shape,
    Suite,
    dtype_name,
    shape_label,
)
from opforge.bench.catalog import get_op, get_suite, op_names, suite_names
from opforge.bench.timing import Clock, TimingConfig, clamp_reps, clock_for, copy_bandwidth_gbps, quantiles
from opforge.bench.verify import as_outputs, compare, tolerance, upcast

#: How many input sets the CPU implementation rotates over at most (copies are slow).
CPU_MAX_BUFFERS = 8


class _Timed(NamedTuple):
    """What the interleaved wall-time rounds need to call one implementation again."""

    fn: Callable[..., Any]
    args: list
    clock: Clock
    calls: int


class UsageError(ValueError):
    """Bad command-line choices (unknown suite, op, implementation, dtype, device)."""


@dataclass
class RunOptions:
    """What to run and how. ``None`` filters mean "as the suite says".

    Example:
        >>> opts = RunOptions(device=torch.device("cpu"), suites=["seed"], shapes=[(2, 64)])
    """

    device: torch.device
    suites: list[str]
    ops: list[str] | None = None
    impls: list[str] | None = None
    dtypes: list[torch.dtype] | None = None
    shapes: list[Shape] | None = None
    timing: TimingConfig = field(default_factory=TimingConfig)
    max_seconds: float | None = None
    seed: int = 0


@dataclass
class PlannedSuite:
    suite: Suite
    cases: list[tuple[OpSpec, Shape, torch.dtype]]
    impls: list[str]
    chain_impls: list[str]


def plan(options: RunOptions) -> list[PlannedSuite]:
    """Resolve names into the cases to run; raises :class:`UsageError` on bad names.

    Example:
        >>> [p.suite.name for p in plan(RunOptions(torch.device("cpu"), ["seed"]))]
        ['seed']
    """
    known_suites, known_ops = suite_names(), op_names()
    for s in options.suites:
        if s not in known_suites:
            raise UsageError(f"unknown suite {s!r}; known suites: {', '.join(known_suites)}")
    for o in options.ops or []:
        if o not in known_ops:
            raise UsageError(f"unknown op {o!r}; known ops: {', '.join(known_ops)}")
    for i in options.impls or []:
        if i not in IMPL_ORDER:
            raise UsageError(f"unknown implementation {i!r}; known: {', '.join(IMPL_ORDER)}")
    planned = []
    for name in options.suites:
        suite = get_suite(name)
        impls = [i for i in suite.impls if options.impls is None or i in options.impls]
        chain_impls = [i for i in suite.chain_impls if i in impls and i != CPU]
        cases = []
        for entry in suite.entries:
            if options.ops is not None and entry.op not in options.ops:
                continue
            op = get_op(entry.op)
            shapes = options.shapes or list(entry.shapes)
            dtypes = options.dtypes or list(entry.dtypes)
            cases += [(op, tuple(shape), dtype) for shape in shapes for dtype in dtypes]
        planned.append(PlannedSuite(suite, cases, impls, chain_impls))
    if options.ops:
        covered = {op.name for p in planned for op, _, _ in p.cases}
        missing = [o for o in options.ops if o not in covered]
        if missing:
            raise UsageError(f"op(s) {', '.join(missing)} not in suite(s) {', '.join(options.suites)}")
    return planned


def _seed(base: int, op: str, shape: Shape, dtype: torch.dtype, k: int) -> int:
    return (base * 1_000_003 + zlib.crc32(f"{op}|{shape}|{dtype}|{k}".encode())) & 0x7FFF_FFFF


def _nbytes(args: Inputs) -> int:
    return sum(a.numel() * a.element_size() for a in args if isinstance(a, torch.Tensor))


def _to(args: Inputs, device: torch.device) -> Inputs:
    return tuple(a.to(device) if isinstance(a, torch.Tensor) else a for a in args)


def trace_backend(fn: Callable[..., Any], args: Inputs) -> str | None:
    """Which kernel(s) ``opforge.trace()`` saw ``fn`` run, e.g. ``"triton/multirow"``.

    A torch-path event keeps its note (why no GPU kernel ran). None if nothing was traced.
    """
    try:
        import opforge

        with opforge.trace() as t:
            fn(*args)
        seen: list[str] = []
        for e in t:
            label = f"{e.backend}/{e.variant}"
            if e.backend == "torch" and getattr(e, "note", ""):
                label += f" ({e.note})"
            if label not in seen:
                seen.append(label)
        return ", ".join(seen) or None
    except Exception as exc:
        return f"trace failed ({type(exc).__name__}: {exc})"[:200]


class Runner:
    """Runs planned suites and returns a :class:`RunResult`.

    Example:
        >>> # run = Runner(RunOptions(torch.device("cpu"), ["seed"]), Progress()).run()
    """

    def __init__(self, options: RunOptions, progress: Progress | None = None,
                 on_suite_done: Callable[[RunResult], None] | None = None):
        self.opts = options
        self.progress = progress or Progress()
        self.on_suite_done = on_suite_done
        self.device = options.device
        self.cfg = options.timing
        self._t0 = time.perf_counter()
        self._clock: Clock | None = None
        self._cpu_clock = Clock(torch.device("cpu"))
        self.copy_gbps: float | None = None

    # -- budget -----------------------------------------------------------------------
    def _out_of_time(self) -> bool:
        return self.opts.max_seconds is not None and time.perf_counter() - self._t0 > self.opts.max_seconds

    # -- top level --------------------------------------------------------------------
    def run(self) -> RunResult:
        planned = plan(self.opts)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        self._clock = clock_for(self.device)
        meta = envinfo.collect(self.device)
        meta["timing"] = {k: v for k, v in vars(self.cfg).items()}
        run = RunResult(meta=meta, copy_gbps=None)
        total = sum(len(p.cases) * len(p.impls) for p in planned)
        total += sum(len(p.cases) * len(p.chain_impls) for p in planned if p.suite.chain_len > 0)
        self.progress.start(total)
        try:
            with torch.inference_mode():
                self.progress.step("copy bandwidth")
                self.copy_gbps = copy_bandwidth_gbps(self.device, self.cfg)
                run.copy_gbps = self.copy_gbps
                self.progress.note(f"copy bandwidth on {meta.get('device_name')}: {self.copy_gbps:.0f} GB/s")
                for p in planned:
                    run.suites.append(self._run_suite(p))
                    if self.on_suite_done is not None:
                        self.on_suite_done(run)
        finally:
            self.progress.stop()
        run.meta["seconds"] = round(time.perf_counter() - self._t0, 1)
        return run

    def _run_suite(self, p: PlannedSuite) -> SuiteResult:
        t0 = time.perf_counter()
        res = SuiteResult(p.suite.name, p.suite.description, p.suite.metric, list(p.impls))
        for op, shape, dtype in p.cases:
            case = self._run_case(p.suite, op, shape, dtype, p.impls)
            res.cases.append(case)
            self.progress.note(_case_line(case, p.suite.metric))
        if p.suite.chain_len > 0:
            for op, shape, dtype in p.cases:
                for impl in p.chain_impls:
                    label = f"{op.name} {shape_label(shape)} {dtype_name(dtype)}"
                    self.progress.step(f"{p.suite.name} chain {label} {impl}")
                    res.chains.append(self._run_chain(p.suite, op, shape, dtype, impl))
                    self.progress.advance()
        for target in p.suite.targets:
            for case in res.cases:
                verdict = target.check(case)
                if verdict is not None:
                    res.targets.append(TargetResult(target.name, case.label, bool(verdict[0]), verdict[1]))
        res.seconds = round(time.perf_counter() - t0, 1)
        return res

    # -- one case ---------------------------------------------------------------------
    def _input_sets(self, op: OpSpec, shape: Shape, dtype: torch.dtype) -> list[Inputs]:
        gen = torch.Generator(device=self.device)
        gen.manual_seed(_seed(self.opts.seed, op.name, shape, dtype, 0))
        first = op.make_inputs(shape, dtype, self.device, gen)
        size = max(1, _nbytes(first))
        window = self.cfg.rotate_cache_factor * envinfo.l2_bytes(self.device)
        n = 1 if size >= window else min(self.cfg.rotate_max_buffers, math.ceil(window / size))
        # Copies, not fresh draws: only distinct memory matters for the cache, and a clone is
        # one kernel where drawing is several (thousands of sets for the smallest shapes).
        return [first] + [tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in first)
                          for _ in range(n - 1)]

    def _run_case(self, suite: Suite, op: OpSpec, shape: Shape, dtype: torch.dtype,
                  impls: Sequence[str]) -> CaseResult:
        case = CaseResult(suite.name, op.name, list(shape), dtype_name(dtype), int(op.bytes_moved(shape, dtype)))
        if self._out_of_time():
            for impl in impls:
                case.results[impl] = ImplResult(impl, SKIPPED, "time budget (--max-seconds) spent")
            self.progress.advance(len(impls))
            return case
        sets = self._input_sets(op, shape, dtype)
        case.buffers = len(sets)
        refs: dict[str, tuple[torch.Tensor, ...]] = {}

        def reference(device: torch.device) -> tuple[torch.Tensor, ...]:
            if "home" not in refs:
                home = torch.device("cpu") if self.device.type == "mps" else self.device
                refs["home"] = as_outputs(op.reference(*upcast(_to(sets[0], home))))
            key = str(device)
            if key not in refs:
                refs[key] = tuple(t.to(device) for t in refs["home"])
            return refs[key]

        timed: dict[str, _Timed] = {}
        for impl in impls:
            self.progress.step(f"{suite.name} {case.label} {impl}")
            if self._out_of_time():
                case.results[impl] = ImplResult(impl, SKIPPED, "time budget (--max-seconds) spent")
            else:
                case.results[impl] = self._run_impl(op, shape, dtype, impl, sets, reference, case.bytes, timed)
            self.progress.advance()
        if suite.metric == "wall_us" and self.cfg.wall_rounds > 0 and len(timed) > 1:
            self._interleaved_wall(case, timed)
        del timed
        case.fill_speedups(suite.metric)
        del sets, refs
        if self.device.type == "cuda" and case.bytes > (1 << 30):
            torch.cuda.empty_cache()
        return case

    def _build(self, op: OpSpec, impl: str, shape: Shape, dtype: torch.dtype,
               device: torch.device) -> Callable[..., Any]:
        factory = op.impls.get(TORCH if impl == CPU else impl)
        if factory is None:
            raise Absent(f"no {impl} implementation of {op.name} is registered")
        return factory(BuildContext(op.name, shape, dtype, device))

    def _run_impl(self, op: OpSpec, shape: Shape, dtype: torch.dtype, impl: str, sets: list[Inputs],
                  reference: Callable[[torch.device], tuple[torch.Tensor, ...]], nbytes: int,
                  timed: dict[str, "_Timed"]) -> ImplResult:
        """Build, check and time one implementation; a correct one timed on the benchmark device is
        left in ``timed`` for the interleaved wall-time rounds."""
        on_cpu = impl == CPU
        if on_cpu and self.device.type == "cpu":
            return ImplResult(impl, ABSENT, "the benchmark device is the CPU itself")
        device = torch.device("cpu") if on_cpu else self.device
        clock = self._cpu_clock if on_cpu else self._clock
        assert clock is not None
        try:
            fn = self._build(op, impl, shape, dtype, device)
        except Absent as exc:
            return ImplResult(impl, ABSENT, str(exc))
        except Exception as exc:
            return ImplResult(impl, ERROR, _why(exc))
        args = [_to(s, device) for s in sets[:CPU_MAX_BUFFERS]] if on_cpu else sets
        r = ImplResult(impl)
        try:
            t0 = time.perf_counter()
            out = fn(*args[0])
            clock.sync()
            r.first_call_s = time.perf_counter() - t0
            if impl == COMPILE:
                r.compile_s = r.first_call_s
            err, problem = compare(out, reference(device), dtype)
            del out
            r.rel_err, r.tol = err, tolerance(dtype, op.tolerance)
            if problem is not None or err is None or err > r.tol:
                r.status = WRONG
                r.reason = problem or f"relative error {err:.2e} > tolerance {r.tol:.0e}"
            if impl == OPFORGE:
                r.backend = trace_backend(fn, args[0])
                if device.type != "cpu" and r.backend and r.backend.split("/")[0] == "torch":
                    r.reason = f"opforge ran its torch path on {device.type} ({r.backend})"
            self._time(fn, args, clock, r, on_cpu)
            if r.status == OK and not on_cpu and r.calls:
                timed[impl] = _Timed(fn, args, clock, r.calls)
        except Exception as exc:
            r.status, r.reason = ERROR, _why(exc)
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            return r
        if r.gpu_us:
            r.gbps = nbytes / (r.gpu_us * 1e-6) / 1e9
            if self.copy_gbps:
                r.pct_copy = 100.0 * r.gbps / self.copy_gbps
        elif on_cpu and r.wall_us:
            r.gbps = nbytes / (r.wall_us * 1e-6) / 1e9
        return r

    def _time(self, fn: Callable[..., Any], args: list[Inputs], clock: Clock, r: ImplResult, on_cpu: bool) -> None:
        cfg = self.cfg
        for i in range(cfg.warmup):
            fn(*args[i % len(args)])
        clock.sync()
        t0 = time.perf_counter()
        fn(*args[0])
        clock.sync()
        one = (time.perf_counter() - t0) * 1e6
        if on_cpu:
            reps = clamp_reps(one, cfg.cpu_target_ms, cfg.cpu_reps_min, cfg.cpu_reps_max)
            _, r.wall_us, _ = quantiles(clock.device_times(fn, args, reps, one))
            r.reps = reps
            return
        calls = clamp_reps(one, cfg.wall_target_ms, cfg.wall_calls_min, cfg.wall_calls_max)
        r.wall_us = statistics.median(clock.wall_per_call(fn, args, calls) for _ in range(max(1, cfg.wall_loops)))
        r.calls = calls
        reps = clamp_reps(min(one, r.wall_us), cfg.gpu_target_ms, cfg.gpu_reps_min, cfg.gpu_reps_max)
        r.gpu_us_p20, r.gpu_us, r.gpu_us_p80 = quantiles(clock.device_times(fn, args, reps, r.wall_us))
        r.reps = reps

    def _interleaved_wall(self, case: CaseResult, timed: dict[str, "_Timed"]) -> None:
        """Wall time per call again, in rounds that take every implementation in turn (starting
        with a different one each round), so host noise lands on all of them alike; each
        implementation's median over the rounds replaces its own loops' figure."""
        names = list(timed)
        samples: dict[str, list[float]] = {name: [] for name in names}
        for k in range(self.cfg.wall_rounds):
            for name in names[k % len(names):] + names[:k % len(names)]:
                t = timed[name]
                samples[name].append(t.clock.wall_per_call(t.fn, t.args, t.calls))
        for name, values in samples.items():
            case.results[name].wall_us = statistics.median(values)

    # -- chains -----------------------------------------------------------------------
    def _run_chain(self, suite: Suite, op: OpSpec, shape: Shape, dtype: torch.dtype, impl: str) -> ChainResult:
        res = ChainResult(op.name, list(shape), dtype_name(dtype), impl, suite.chain_len)
        if op.feed is None:
            res.status, res.reason = ABSENT, f"{op.name} cannot be chained"
            return res
        if self._out_of_time():
            res.status, res.reason = SKIPPED, "time budget (--max-seconds) spent"
            return res
        try:
            fn = self._build(op, impl, shape, dtype, self.device)
        except Absent as exc:
            res.status, res.reason = ABSENT, str(exc)
            return res
        except Exception as exc:
            res.status, res.reason = ERROR, _why(exc)
            return res
        gen = torch.Generator(device=self.device)
        gen.manual_seed(_seed(self.opts.seed, op.name, shape, dtype, 1))
        inputs = op.make_inputs(shape, dtype, self.device, gen)
        try:
            assert self._clock is not None
            _chain.measure_chain(op, fn, inputs, res, self._clock, self.cfg)
        except Exception as exc:
            res.status, res.reason = ERROR, _why(exc)
        return res


def _why(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    first = text.splitlines()[0] if text else type(exc).__name__
    return first[:300]


def _case_line(case: CaseResult, metric: str) -> str:
    parts = [f"{case.suite:8s} {case.op:15s} {shape_label(case.shape):>12s} {case.dtype:5s}"]
    for name, r in case.results.items():
        if r.ok:
            t = r.wall_us if name == CPU or metric == "wall_us" else r.gpu_us
            pct = f" {r.pct_copy:.0f}%" if r.pct_copy is not None and metric == "gpu_us" else ""
            parts.append(f"{name} {t:.1f}us{pct}")
        else:
            parts.append(f"{name} {r.status.upper()}")
    return " | ".join(parts)
