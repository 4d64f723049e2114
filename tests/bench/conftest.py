"""Fixtures for the benchmark-harness tests: tiny timings, a scratch registry entry."""

from __future__ import annotations

import pytest
import torch

from opforge.bench.timing import TimingConfig


@pytest.fixture
def tiny_timing() -> TimingConfig:
    """As few timed calls as still exercise every code path."""
    return TimingConfig(
        warmup=1, gpu_reps_min=2, gpu_reps_max=2, wall_loops=1, wall_calls_min=2, wall_calls_max=2,
        cpu_reps_min=1, cpu_reps_max=2, copy_mib_cpu=4, rotate_max_buffers=2,
    )


@pytest.fixture
def cpu() -> torch.device:
    return torch.device("cpu")


@pytest.fixture(autouse=True)
def _restore_registry():
    """Ops and suites a test registers vanish after it."""
    from opforge.bench import catalog, spec

    catalog.op_names()  # every family's ops and suites are in before the snapshot
    saved = spec.snapshot()
    yield
    spec.restore(saved)
