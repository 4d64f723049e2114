"""The paged entries of the attention suite run end to end on the CPU with small shapes: every
implementation correct against the float64 oracle, and the paged targets judged."""
from __future__ import annotations

import pytest

from opforge.bench.results import ABSENT, OK
from opforge.bench.runner import RunOptions, Runner
from opforge.bench.spec import CONTIGUOUS, OPFORGE

SMALL = {"paged_decode": (2, 4, 2, 64, 32, 16), "paged_prefill": (2, 4, 2, 32, 16, 32, 16),
         "paged_kv_cache_append": (2, 24, 2, 32, 8)}


@pytest.mark.parametrize("op", sorted(SMALL))
def test_paged_entry_runs_and_is_judged(op, tiny_timing, cpu):
    opts = RunOptions(device=cpu, suites=["attention"], ops=[op], shapes=[SMALL[op]], timing=tiny_timing,
                      impls=[OPFORGE, CONTIGUOUS])
    result = Runner(opts).run()
    (suite,) = result.suites
    (case,) = suite.cases
    assert case.results[OPFORGE].status == OK, case.results[OPFORGE].reason
    peer = case.results[CONTIGUOUS]
    assert peer.status == (ABSENT if op == "paged_kv_cache_append" else OK), peer.reason
    judged = [t for t in suite.targets if t.target.startswith(op)]
    assert len(judged) == 1 and "goal" in judged[0].detail     # a number, met or missed: never skipped
