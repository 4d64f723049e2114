"""Target makers: the goals a suite's results are judged by.

Each maker returns a :class:`~opforge.bench.spec.Target` whose ``check(case)`` gives
``(met, detail)`` or None when the target does not apply. A missing or wrong opforge
result counts as a miss: a target is never quietly skipped for lack of a number.
"""

from __future__ import annotations

from typing import Callable, Mapping

from opforge.bench.results import CaseResult
from opforge.bench.spec import OPFORGE, Target


def _opforge_missing(case: CaseResult) -> tuple[bool, str] | None:
    r = case.results.get(OPFORGE)
    if r is None:
        return None
    if not r.ok:
        return False, f"opforge {r.status}" + (f": {r.reason}" if r.reason else "")
    return None


def compare_times(case: CaseResult, peer: str, metric: str,
                  judge: Callable[[float, float], tuple[bool, str]]) -> tuple[bool, str] | None:
    """``judge(opforge's time, peer's time)`` for a case where both were timed; opforge's failure
    as a miss; None (not judged) where a time is missing."""
    missing = _opforge_missing(case)
    if missing is not None:
        return missing
    mine, theirs = case.time(OPFORGE, metric), case.time(peer, metric)
    if mine is None or theirs is None:
        return None
    return judge(mine, theirs)


def bandwidth_at_least(pct_by_dtype: Mapping[str, float], ops: tuple[str, ...] | None = None) -> Target:
    """opforge reaches ``pct_by_dtype[dtype]`` percent of the measured copy bandwidth (only in the
    cases of ``ops``, when given).

    Example:
        >>> t = bandwidth_at_least({"bf16": 90.0, "fp16": 90.0, "fp32": 85.0})
        >>> t = bandwidth_at_least({"bf16": 85.0}, ops=("decode_attention",))
    """
    text = ", ".join(f"{k} {v:g}%" for k, v in pct_by_dtype.items()) + (f"; {', '.join(ops)}" if ops else "")

    def check(case: CaseResult) -> tuple[bool, str] | None:
        goal = pct_by_dtype.get(case.dtype)
        if goal is None or (ops is not None and case.op not in ops):
            return None
        missing = _opforge_missing(case)
        if missing is not None:
            return missing
        r = case.results.get(OPFORGE)
        if r is None or r.pct_copy is None:
            return None
        return r.pct_copy >= goal, f"{r.pct_copy:.1f}% of copy (goal {goal:g}%)"

    return Target(f">= copy-bandwidth share ({text})", check)


def near_fastest_peer(max_slower: float, metric: str = "gpu_us") -> Target:
    """opforge is at most ``max_slower`` (0.03 = 3%) slower than the fastest correct peer.

    Example:
        >>> t = near_fastest_peer(0.03)
    """

    def check(case: CaseResult) -> tuple[bool, str] | None:
        missing = _opforge_missing(case)
        if missing is not None:
            return missing
        mine, best = case.time(OPFORGE, metric), case.best_peer(metric)
        if mine is None or best is None:
            return None
        name, theirs = best
        return mine <= theirs * (1.0 + max_slower), f"{theirs / mine:.3f}x vs fastest peer {name}"

    return Target(f"<= {max_slower:.0%} slower than the fastest peer ({_metric(metric)})", check)


def no_slower_than(peer: str, metric: str) -> Target:
    """opforge's ``metric`` time is at most ``peer``'s.

    Example:
        >>> t = no_slower_than("torch", "wall_us")
    """

    def check(case: CaseResult) -> tuple[bool, str] | None:
        return compare_times(case, peer, metric, lambda mine, theirs: (
            mine <= theirs, f"{mine:.2f} vs {theirs:.2f} us ({theirs / mine:.2f}x)"))

    return Target(f"{_metric(metric)} no worse than {peer}", check)


def speedup_at_least(peer: str, goals: Mapping[tuple[str, int], float], metric: str = "gpu_us",
                     share_of_copy: Mapping[tuple[str, int], float] | None = None) -> Target:
    """opforge at least ``goals[(op, shape[0])]`` times faster than ``peer`` (and, where
    ``share_of_copy`` names the case, at least that percent of copy bandwidth).

    Cases whose (op, first dimension) no goal names are not judged.

    Example:
        >>> t = speedup_at_least("torch", {("linear_int4_g128", 1): 3.0}, share_of_copy={("linear_int4_g128", 1): 80})
    """
    pct = dict(share_of_copy or {})
    text = ", ".join(f"{op} at {m}: {x:g}x" for (op, m), x in goals.items())

    def check(case: CaseResult) -> tuple[bool, str] | None:
        key = (case.op, case.shape[0])
        if key not in goals:
            return None

        def judge(mine: float, theirs: float) -> tuple[bool, str]:
            ratio = theirs / mine
            met, detail = ratio >= goals[key], f"{ratio:.2f}x {peer} (goal {goals[key]:g}x)"
            r = case.results[OPFORGE]
            if key in pct and r.pct_copy is not None:
                met = met and r.pct_copy >= pct[key]
                detail += f", {r.pct_copy:.1f}% of copy (goal {pct[key]:g}%)"
            return met, detail
        return compare_times(case, peer, metric, judge)

    return Target(f"speedup over {peer} ({_metric(metric)}): {text}", check)


def first_call_shorter(peer: str, factor: float) -> Target:
    """opforge's first call (for a fused function: trace, code generation, compile, launch) at
    least ``factor`` times shorter than ``peer``'s first call (torch.compile's compile). The
    times are cold only where the caches are (a fresh ``TRITON_CACHE_DIR``, a new process).

    Example:
        >>> t = first_call_shorter("torch.compile", 10.0)
    """

    def check(case: CaseResult) -> tuple[bool, str] | None:
        missing = _opforge_missing(case)
        if missing is not None:
            return missing
        mine, theirs = case.results[OPFORGE].first_call_s, case.results.get(peer)
        if mine is None or theirs is None or not theirs.ok or theirs.first_call_s is None:
            return None
        ratio = theirs.first_call_s / mine
        detail = f"first call {mine:.2f} s vs {theirs.first_call_s:.2f} s: {ratio:.1f}x (goal {factor:g}x)"
        return ratio >= factor, detail

    return Target(f"first call >= {factor:g}x shorter than {peer}'s", check)


def _metric(metric: str) -> str:
    return {"gpu_us": "GPU time", "wall_us": "wall time per call"}.get(metric, metric)
