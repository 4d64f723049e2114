"""The head dims the kernels take are in attention's docstring, and explain() names the limit
that sends a call to the torch path (Metal's prefill set, the 256 maximum)."""
import pytest
import torch

import opforge
from opforge.testing import DEVICE
from opforge.ops.attention import metal as attention_metal
from opforge.ops.attention.problem import MAX_KERNEL_HEAD_DIM


def _qkv(d, device=DEVICE):
    return tuple(torch.randn(1, 2, 3, d, device=device) for _ in range(3))


def test_docstrings_state_the_head_dim_limits():
    assert f"D in {attention_metal.PREFILL_HEAD_DIMS} only" in " ".join(opforge.attention.__doc__.split())
    assert f"D up to {MAX_KERNEL_HEAD_DIM}" in opforge.attention.__doc__
    assert f"D up to {attention_metal.MAX_HEAD_DIM}" in opforge.decode_attention.__doc__


@pytest.mark.emulator
def test_explain_names_the_metal_prefill_head_dims(emulate):
    with opforge.backend("metal"):
        e = opforge.explain("attention", *_qkv(72, "cpu"))
        assert e.chosen is None
        assert f"head_dim=72: the Metal prefill kernels take D in {attention_metal.PREFILL_HEAD_DIMS}" in str(e)
        with pytest.raises(opforge.NoKernelError, match=r"D in \(64, 80, 96, 128, 256\)"):
            opforge.attention(*_qkv(72, "cpu"))
        assert opforge.explain("attention", *_qkv(80, "cpu")).chosen.qualified_name == "metal.prefill"


def test_explain_names_the_triton_head_dim_maximum():
    with opforge.backend("triton"):
        e = opforge.explain("attention", *_qkv(320))
    assert e.chosen is None and "head_dim 320 > 256" in str(e)
