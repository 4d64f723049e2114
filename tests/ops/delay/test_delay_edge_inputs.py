"""apply_delay / revert_delay on edge inputs: an ``out`` that overlaps itself is refused with
``AliasedOutputError`` before anything is written, and a delay past int32 with a ``ValueError``
naming ``delays``, on every backend."""
import pytest
import torch

import opforge
from opforge.runtime.overlap import AliasedOutputError
from opforge.testing import DEVICE

BACKENDS = ("torch", "triton")


@pytest.fixture(autouse=True)
def _on_device(request):
    """New tensors on the tests' device (the Metal emulator's on the CPU)."""
    with torch.device("cpu" if "emulate" in request.fixturenames else DEVICE):
        yield


def _check(backend):
    codes = torch.randint(0, 100, (2, 6, 3))
    base = torch.full((2, 1, 3), -7, dtype=torch.int64)
    with opforge.backend(backend):
        with pytest.raises(AliasedOutputError, match="out overlaps itself"):
            opforge.apply_delay(codes, [0, 1, 2], bos_id=1, pad_id=2, out=base.expand(2, 6, 3))
        with pytest.raises(AliasedOutputError, match="out overlaps itself"):
            opforge.revert_delay(codes, [0, 1, 2], pad_id=2, out=base.expand(2, 6, 3))
        with pytest.raises(ValueError, match=r"delays must be <= 2147483647.*delays\[2\] = 1099511627776"):
            opforge.apply_delay(codes, [0, 1, 2 ** 40], bos_id=1, pad_id=2)
        with pytest.raises(ValueError, match=r"delays\[1\]"):      # host delays are checked (device ones are not)
            opforge.apply_delay(codes, torch.tensor([0, 2 ** 33, 1], device="cpu"), bos_id=1, pad_id=2)
    assert (base == -7).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_overlapping_out_and_huge_delays_are_refused(backend):
    _check(backend)


@pytest.mark.emulator
def test_overlapping_out_and_huge_delays_are_refused_on_metal(emulate):
    _check("metal")


@pytest.mark.parametrize("backend", BACKENDS)
def test_largest_delay_runs(backend):
    """A delay of 2**31 - 1 (the largest) shifts everything out: bos fills the whole channel."""
    codes = torch.randint(0, 100, (1, 5, 2))
    with opforge.backend(backend):
        out = opforge.apply_delay(codes, [0, 2 ** 31 - 1], bos_id=1, pad_id=2)
    assert torch.equal(out[..., 0], codes[..., 0]) and (out[..., 1] == 1).all()
