"""What the real-Apple-GPU tests share: whether MPS is here, the module skip, and a fixture that
turns the emulator off so the kernels run on the GPU."""
import pytest
import torch

from opforge.runtime import registry

MPS = getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()
needs_mps = pytest.mark.skipif(not MPS, reason="needs an Apple GPU (torch.backends.mps.is_available())")


@pytest.fixture(autouse=True)
def real_metal(monkeypatch):
    """Run Metal kernels on MPS, not in the emulator, for every test of a module that imports this."""
    monkeypatch.delenv("OPFORGE_METAL_EMULATE", raising=False)
    registry.clear_cache()
    yield
    registry.clear_cache()
