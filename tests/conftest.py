"""Test set-up: with no GPU, Triton kernels run in Triton's CPU interpreter.

TRITON_INTERPRET must be set before any @triton.jit kernel is created, so before opforge's op
families are imported. Every opforge output is NaN-poisoned before its kernel runs. At the end,
the run prints which backends and variants the tests' own ``opforge.trace()`` blocks saw run.

Random data is fresh on every run, yet reproducible: the run draws one seed (or takes
``OPFORGE_TEST_SEED``), prints it in the header, and seeds torch before each test from it and the
test's id (hypothesis takes it as its seed), so a failure re-runs alone with
``OPFORGE_TEST_SEED=<seed> pytest <test id>``.
"""
import collections
import os
import random
import zlib

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

from opforge.runtime import alloc  # noqa: E402
from opforge.runtime import trace as _trace  # noqa: E402

from opforge.testing import DEVICE  # noqa: E402
from opforge.runtime import registry  # noqa: E402
from opforge.runtime.metal import library as metal_runtime  # noqa: E402

import metal_emu  # noqa: E402  (tests/ is on the path: this conftest's folder)

# The MSL emulator is opforge's Metal executor in the tests; it runs only where a test asks for
# it (the ``emulate`` fixture sets OPFORGE_METAL_EMULATE=1 for that test alone).
metal_runtime.set_emulator(metal_emu.compile_shader)

settings.register_profile("opforge", deadline=None, max_examples=20, derandomize=False)
settings.load_profile("opforge")


RUN_SEED = int(os.environ.get("OPFORGE_TEST_SEED") or random.SystemRandom().randrange(2**31))


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    """Hypothesis draws its examples from the run seed too (unless --hypothesis-seed is given)."""
    if getattr(config.option, "hypothesis_seed", "absent") is None:
        config.option.hypothesis_seed = RUN_SEED
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (skipped without one)")
    config.addinivalue_line("markers", "emulator: runs Metal kernels in the MSL emulator on the CPU; a GPU adds "
                                       "nothing, so scripts/gpu_test.sh leaves these out (-m 'not emulator')")
    config.addinivalue_line("markers", "cpu_only: runs on CPU tensors whatever the machine (the torch path); "
                                       "scripts/gpu_test.sh leaves these out (-m 'not cpu_only')")


def emulator_only(path: str) -> bool:
    """Whether a test file exercises the MSL emulator only: a family's ``test_*_metal.py``, the
    emulator's own tests (tests/metal_emu) and the fused kernels' emulated run. The real-MPS
    tests (``*_mps.py``) are not."""
    name = path.rsplit("/", 1)[-1]
    return name.endswith("_metal.py") or path.startswith("tests/metal_emu/") \
        or path == "tests/fusion/test_metal_emulated.py"


def pytest_collection_modifyitems(config, items):
    """Mark emulator-only tests ``emulator``; skip ``gpu`` tests where there is no CUDA GPU."""
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        path = item.nodeid.split("::")[0]
        if emulator_only(path):
            item.add_marker(pytest.mark.emulator)
        if "gpu" in item.keywords and not torch.cuda.is_available():
            item.add_marker(skip_gpu)


def pytest_report_header():
    return f"opforge test seed: OPFORGE_TEST_SEED={RUN_SEED}"


@pytest.fixture(autouse=True)
def _seed_per_test(request):
    torch.manual_seed(RUN_SEED ^ zlib.crc32(request.node.nodeid.encode()))


@pytest.fixture(autouse=True)
def _poison_outputs():
    with alloc.poisoned_outputs():
        yield


@pytest.fixture
def device() -> str:
    return DEVICE


@pytest.fixture
def emulate(monkeypatch):
    """Run Metal kernels on CPU tensors through the emulator for this test (skipped without g++)."""
    if not metal_emu.available():
        pytest.skip("the Metal emulator needs g++ (C++20)")
    monkeypatch.setenv("OPFORGE_METAL_EMULATE", "1")
    registry.clear_cache()
    yield metal_emu
    registry.clear_cache()


@pytest.fixture
def plans_on():
    """Launch plans on for the test (``runtime.plans.set_enabled``), the previous setting after."""
    from opforge.runtime import plans
    previous = plans.set_enabled(True)
    yield
    plans.set_enabled(previous)


_traced: collections.Counter = collections.Counter()
_trace_exit = _trace.Trace.__exit__


def _tallying_exit(self, *exc):
    """Count what each test's trace recorded; the code path under test is unchanged."""
    _trace_exit(self, *exc)
    for event in self.events:
        _traced[(event.backend, event.device.split(":")[0], event.variant)] += 1


_trace.Trace.__exit__ = _tallying_exit


def pytest_terminal_summary(terminalreporter):
    """Print the seed, and the proof of what ran: traced calls per backend, device and variant."""
    terminalreporter.write_line(f"random data from OPFORGE_TEST_SEED={RUN_SEED}")
    if not _traced:
        return
    terminalreporter.section("opforge kernels traced by the tests")
    for (backend, device, variant), count in sorted(_traced.items()):
        terminalreporter.write_line(f"backend {backend:7s} on {device:4s}  {variant:28s} {count:6d} calls")
