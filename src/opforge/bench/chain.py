"""A chain of calls of one op (each output feeding the next), eager vs CUDA-graph replay.

This is what a decode step looks like to the host: many small kernels. Eager time
is a loop of chains with one synchronize at the end; graph time is a loop of replays
of one captured chain. The replayed result is checked against an eager run.
"""

from __future__ import annotations

import statistics
from typing import Any, Callable

import torch

from opforge.bench.results import ABSENT, ERROR, WRONG, ChainResult
from opforge.bench.spec import Inputs, OpSpec
from opforge.bench.timing import Clock, TimingConfig, clamp_reps
from opforge.bench.verify import as_outputs, compare, tolerance, upcast


def _chain(op: OpSpec, fn: Callable[..., Any], length: int) -> Callable[[Inputs], Inputs]:
    assert op.feed is not None
    feed = op.feed

    def run(args: Inputs) -> Inputs:
        for _ in range(length):
            args = feed(args, as_outputs(fn(*args)))
        return args

    return run


def _tensors(args: Inputs) -> tuple[torch.Tensor, ...]:
    return tuple(a for a in args if isinstance(a, torch.Tensor))


def measure_chain(
    op: OpSpec,
    fn: Callable[..., Any],
    inputs: Inputs,
    result: ChainResult,
    clock: Clock,
    cfg: TimingConfig,
) -> ChainResult:
    """Fill ``result`` with eager and graph times per chain (microseconds).

    Example:
        >>> # measure_chain(get_op("rms_norm"), opforge.rms_norm, inputs, ChainResult(...), clock, cfg)
    """
    chain = _chain(op, fn, result.length)
    device = inputs[0].device
    chain(inputs)
    clock.sync()
    est = clock.wall_per_call(lambda: chain(inputs), [()], 1)
    calls = clamp_reps(est, cfg.wall_target_ms, max(2, cfg.wall_calls_min // 4), max(2, cfg.wall_calls_max // 4))
    loops = [clock.wall_per_call(lambda: chain(inputs), [()], calls) for _ in range(cfg.wall_loops)]
    result.eager_us = statistics.median(loops)

    if device.type != "cuda":
        result.graph_status, result.graph_reason = ABSENT, f"CUDA graphs need a CUDA device (device is {device.type})"
        return result
    try:
        static = tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in inputs)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                chain(static)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = chain(static)
        graph.replay()
        clock.sync()
        eager = chain(static)
        err, problem = compare(_tensors(captured), upcast(_tensors(eager)), inputs[0].dtype)
        result.graph_rel_err = err
        tol = tolerance(inputs[0].dtype, op.tolerance)
        if problem or err is None or err > tol:
            result.graph_status = WRONG
            result.graph_reason = problem or f"replay differs from eager: relative error {err:.2e}"
        loops = [clock.wall_per_call(graph.replay, [()], calls) for _ in range(cfg.wall_loops)]
        result.graph_us = statistics.median(loops)
        del graph
    except Exception as exc:  # capture can fail for reasons worth reporting, not crashing on
        result.graph_status, result.graph_reason = ERROR, f"{type(exc).__name__}: {exc}"[:300]
    return result
