"""The architecture check that TMA prefill and PDL share."""
import torch

from opforge.runtime.triton import arch


def test_sm90_means_nvidia_only(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: (9, 4))
    for hip, want in ((None, True), ("6.2", False)):   # an MI300 reports 9.4 but has no TMA or PDL
        monkeypatch.setattr(torch.version, "hip", hip)
        arch.nvidia_sm90_or_newer.cache_clear()
        assert arch.nvidia_sm90_or_newer(0) is want
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: (8, 0))
    arch.nvidia_sm90_or_newer.cache_clear()
    assert arch.nvidia_sm90_or_newer(0) is False
    arch.nvidia_sm90_or_newer.cache_clear()
