"""Norms on meta tensors (shape inference, as torch.compile and model sizing do): the torch path
returns meta outputs of the right shape; a forced kernel backend refuses with NoKernelError."""
import pytest
import torch

import opforge


@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
def test_meta_tensors_run_the_torch_path(op):
    x = torch.empty(4, 8, device="meta")
    out = getattr(opforge, op)(x, torch.empty(8, device="meta"))
    assert out.is_meta and out.shape == (4, 8)
    y, s = opforge.add_rms_norm(x, torch.empty(4, 8, device="meta"))
    assert y.is_meta and s.is_meta and y.shape == s.shape == (4, 8)


@pytest.mark.parametrize("backend", ["triton", "metal"])
def test_forced_kernel_backend_refuses_meta_tensors(backend):
    with opforge.backend(backend), pytest.raises(opforge.NoKernelError, match="does not run on meta tensors"):
        opforge.rms_norm(torch.empty(4, 8, device="meta"))
