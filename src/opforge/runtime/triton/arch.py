"""What a CUDA device's architecture offers the Triton kernels, read once per device."""
from __future__ import annotations

import functools

import torch


@functools.lru_cache(maxsize=None)
def nvidia_sm90_or_newer(index: int) -> bool:
    """Whether CUDA device ``index`` is an NVIDIA GPU of compute capability 9.0 or newer (Hopper's
    TMA copy engine and programmatic dependent launch). False on ROCm, whose devices also report
    a capability (an MI300 reads 9.4) but have neither.

    Example:
        >>> import torch
        >>> nvidia_sm90_or_newer(0) if torch.cuda.is_available() else False   # doctest: +SKIP
        True
    """
    return torch.version.hip is None and torch.cuda.get_device_capability(index)[0] >= 9
