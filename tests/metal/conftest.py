"""Set-up for the Metal tests: the MSL emulator runs the kernels on CPU tensors.

The emulator (tests/metal_emu) is installed as opforge's Metal executor, and every test here
runs with OPFORGE_METAL_EMULATE=1 (set per test, so other test folders never see it). Without
a C++20 compiler the emulated tests are skipped; the real-MPS tests run only on a Mac.
"""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import metal_emu  # noqa: E402

from opforge.runtime import metal as metal_runtime, registry  # noqa: E402

metal_runtime.set_emulator(metal_emu.compile_shader)


@pytest.fixture
def emulate(monkeypatch):
    """Run Metal kernels on CPU tensors through the emulator for this test."""
    if not metal_emu.available():
        pytest.skip("the Metal emulator needs g++ (C++20)")
    monkeypatch.setenv("OPFORGE_METAL_EMULATE", "1")
    registry.clear_cache()
    yield metal_emu
    registry.clear_cache()

