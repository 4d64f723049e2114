"""The launch-plan cache: switch, LRU bound, and use from several threads."""
import os
import subprocess
import sys
import threading

import pytest

from opforge.runtime import plans

needs_plans = pytest.mark.skipif(plans._CHECKING_KEYS, reason="OPFORGE_CHECK_LAUNCH_KEYS turns plans off")


@pytest.mark.parametrize("value,expected", [(None, plans.DEFAULT_ENABLED), ("0", False), ("1", True), ("", plans.DEFAULT_ENABLED)])
def test_the_env_switch(value, expected):
    env = {k: v for k, v in os.environ.items() if k not in ("OPFORGE_PLANS", "OPFORGE_CHECK_LAUNCH_KEYS")}
    if value is not None:
        env["OPFORGE_PLANS"] = value
    src = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "src"))
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run([sys.executable, "-c", "from opforge.runtime import plans; print(plans.enabled())"],
                         env=env, capture_output=True, text=True, check=True).stdout.strip()
    assert out == str(expected)


@needs_plans
def test_least_recently_used_plans_go_first(plans_on):
    cache = plans.PlanCache(limit=3)
    for i in range(3):
        cache.offer(("sig", i), lambda i=i: i, backend="triton")
    assert cache.get(("sig", 0))() == 0          # 0 is now the most recently used
    cache.offer(("sig", 3), lambda: 3, backend="triton")
    assert ("sig", 1) not in cache and len(cache) == 3
    assert [cache.get(("sig", i))() for i in (0, 2, 3)] == [0, 2, 3]


@needs_plans
def test_offers_are_dropped_while_plans_are_off():
    previous = plans.set_enabled(False)
    try:
        cache = plans.PlanCache()
        cache.offer(("sig",), lambda: 1, backend="triton")
        assert len(cache) == 0
    finally:
        plans.set_enabled(previous)


@needs_plans
def test_threads_share_a_cache_without_losing_its_bound(plans_on):
    cache = plans.PlanCache(limit=64)
    errors = []
    start = threading.Barrier(8)

    def work(t):
        try:
            start.wait()
            for i in range(3000):
                sig = ("sig", (t * 7 + i) % 200)
                plan = cache.get(sig)
                if plan is not None:
                    assert plan() == sig[1]
                else:
                    cache.offer(sig, lambda v=sig[1]: v, backend="triton")
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert 0 < len(cache) <= 64
