"""Runner behaviour on the CPU: correctness gate, absent peers, errors, budget, chains, timing."""

from __future__ import annotations

import dataclasses
import statistics

import torch

from opforge.bench.impls import configure_dynamo
from opforge.bench.results import ABSENT, ERROR, OK, SKIPPED, WRONG, RunResult
from opforge.bench.runner import RunOptions, Runner
from opforge.bench.spec import (
    OpSpec,
    Suite,
    SuiteEntry,
    numel,
    register_op,
    register_suite,
)
from opforge.bench.targets import near_fastest_peer, no_slower_than
from opforge.bench.timing import Clock, clamp_reps, quantiles
from opforge.bench.verify import compare


def _scale_op() -> OpSpec:
    """A made-up op (y = 2x) with a correct opforge, a correct torch and a fast wrong peer."""

    def wrong(ctx):
        return lambda x: x * 2.5

    def broken(ctx):
        def fn(x):
            raise RuntimeError("kernel exploded")
        return fn

    def missing(ctx):
        from opforge.bench.spec import Absent
        raise Absent("not installed here")

    return register_op(OpSpec(
        name="test_scale",
        make_inputs=lambda s, dt, dev, g: (torch.randn(s, generator=g).to(dev, dt),),
        reference=lambda x: 2 * x,
        bytes_moved=lambda s, dt: 2 * numel(s) * dt.itemsize,
        impls={"opforge": lambda ctx: (lambda x: x * 2), "torch": lambda ctx: (lambda x: x + x),
               "liger": wrong, "torch.compile": broken, "torch-cpu-missing": missing},
        feed=lambda inputs, outputs: (outputs[0],),
    ))


def _suite(chain_len: int = 0) -> Suite:
    return register_suite(Suite(
        name="test_suite", description="harness self-test", metric="gpu_us", chain_len=chain_len,
        entries=[SuiteEntry("test_scale", ((4, 32),), (torch.float32,))],
        impls=("opforge", "torch", "torch.compile", "liger", "torch-cpu"),
        targets=[near_fastest_peer(0.03), no_slower_than("torch", "gpu_us")],
    ))


def _run(tiny_timing, cpu, **kw) -> RunResult:
    opts = RunOptions(device=cpu, suites=["test_suite"], timing=tiny_timing, **kw)
    return Runner(opts).run()


def test_wrong_peer_is_flagged_not_ranked(tiny_timing, cpu):
    _scale_op()
    _suite()
    run = _run(tiny_timing, cpu)
    case = run.suites[0].cases[0]
    res = case.results
    assert res["opforge"].status == OK and res["opforge"].rel_err == 0.0
    assert res["torch"].status == OK
    assert res["liger"].status == WRONG and "relative error" in res["liger"].reason
    assert res["liger"].gpu_us is not None  # timed, shown...
    assert case.best_peer("gpu_us")[0] == "torch"  # ...but never ranked
    assert set(case.speedups) == {"torch"}
    assert res["torch.compile"].status == ERROR and "kernel exploded" in res["torch.compile"].reason
    assert res["torch-cpu"].status == ABSENT  # the device is the CPU itself
    for name in ("torch.compile", "torch-cpu"):
        assert res[name].gpu_us is None and res[name].gbps is None  # absent is never zero
    ok = res["opforge"]
    assert ok.gpu_us > 0 and ok.wall_us > 0 and ok.gbps > 0 and ok.pct_copy > 0
    assert {t.target for t in run.suites[0].targets}  # targets judged
    assert run.copy_gbps and run.copy_gbps > 0


def test_time_budget_marks_the_rest_skipped(tiny_timing, cpu):
    _scale_op()
    _suite()
    run = _run(tiny_timing, cpu, max_seconds=1e-9)
    assert all(r.status == SKIPPED for r in run.suites[0].cases[0].results.values())


def test_chain_runs_eagerly_and_reports_graph_absent_off_cuda(tiny_timing, cpu):
    _scale_op()
    _suite(chain_len=3)
    run = _run(tiny_timing, cpu, impls=["opforge", "torch"])
    chains = run.suites[0].chains
    assert [c.impl for c in chains] == ["opforge", "torch"]
    for c in chains:
        assert c.status == OK and c.eager_us > 0
        assert c.graph_status == ABSENT and c.graph_us is None and "CUDA" in c.graph_reason


def test_compare_catches_what_no_tolerance_excuses():
    ref = torch.ones(3, 4, dtype=torch.float64)
    assert compare(torch.ones(3, 4), ref, torch.float32) == (0.0, None)
    assert "NaN" in compare(torch.full((3, 4), float("nan")), ref, torch.float32)[1]
    assert "shape" in compare(torch.ones(4, 3), ref, torch.float32)[1]
    assert "dtype" in compare(torch.ones(3, 4, dtype=torch.float16), ref, torch.float32)[1]
    assert "output" in compare((torch.ones(3, 4), torch.ones(3, 4)), ref, torch.float32)[1]
    err, problem = compare(torch.ones(3, 4) * 1.01, ref, torch.float32)
    assert problem is None and abs(err - 0.01) < 1e-6


def test_timing_helpers():
    assert clamp_reps(100.0, 10.0, 5, 1000) == 100
    assert clamp_reps(1e9, 10.0, 5, 1000) == 5
    assert clamp_reps(0.0, 10.0, 5, 1000) == 1000
    assert quantiles([3.0]) == (3.0, 3.0, 3.0)
    lo, med, hi = quantiles([float(i) for i in range(1, 11)])
    assert lo <= med <= hi and med == 5.5
    clock = Clock(torch.device("cpu"))
    x = torch.randn(64)
    assert clock.wall_per_call(torch.neg, [(x,)], 5) > 0
    assert len(clock.device_times(torch.neg, [(x,), (x,)], 3, 1.0)) == 3


def test_dynamo_never_silently_falls_back():
    configure_dynamo()
    cfg = torch._dynamo.config
    assert getattr(cfg, "recompile_limit", getattr(cfg, "cache_size_limit", 0)) >= 1024
    if hasattr(cfg, "fail_on_recompile_limit_hit"):
        assert cfg.fail_on_recompile_limit_hit is True


def test_wall_time_suites_interleave_rounds_over_implementations(tiny_timing, cpu, monkeypatch):
    _scale_op()
    register_suite(Suite(
        name="test_wall_suite", description="harness self-test, wall time", metric="wall_us",
        entries=[SuiteEntry("test_scale", ((4, 32),), (torch.float32,))], impls=("opforge", "torch", "liger"),
    ))
    order = []
    fake_times = iter(range(1, 1000))

    def fake_wall(self, fn, args, calls):
        order.append(id(fn))
        return float(next(fake_times))
    monkeypatch.setattr(Clock, "wall_per_call", fake_wall)
    timing = dataclasses.replace(tiny_timing, wall_rounds=4, wall_loops=1)
    run = Runner(RunOptions(device=cpu, suites=["test_wall_suite"], timing=timing)).run()
    res = run.suites[0].cases[0].results
    assert res["liger"].status == WRONG and res["liger"].wall_us is not None  # timed alone, not in the rounds
    # one sequential loop each (opforge, torch, liger: times 1, 2, 3), then 4 rounds of the two
    # correct ones, starting with a different one each round: (4, 5), (6, 7), (8, 9), (10, 11)
    assert len(order) == 3 + 2 * 4
    fns = order[3:]
    assert fns[0] == fns[3] == fns[4] == fns[7] and fns[1] == fns[2] == fns[5] == fns[6] and fns[0] != fns[1]
    assert res["opforge"].wall_us == statistics.median([4, 7, 8, 11])
    assert res["torch"].wall_us == statistics.median([5, 6, 9, 10])
    assert res["liger"].wall_us == 3
