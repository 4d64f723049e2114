"""The quantized kernels' K limits are in linear's docstring, and explain() names the limit that
sends a call to the torch path (Triton: K >= 16; Metal int8: K a multiple of 4)."""
import pytest
import torch

import opforge
from opforge.testing import DEVICE


def _call(k, bits, device=DEVICE):
    return (torch.randn(2, k, dtype=torch.float16, device=device),
            opforge.quantize_weight(torch.randn(8, k), bits, -1).to(device))


def test_docstring_states_the_k_limits():
    doc = " ".join(opforge.linear.__doc__.split())
    assert "the Triton kernels need K >= 16" in doc and "Metal int8 kernels need K a multiple of 4" in doc


def test_explain_names_the_triton_k_minimum():
    with opforge.backend("triton"):
        e = opforge.explain("linear", *_call(12, 8))
        assert e.chosen is None and "K=12 < 16 (tl.dot needs K tiles of at least 16)" in str(e)
        with pytest.raises(opforge.NoKernelError, match="K=12 < 16"):
            opforge.linear(*_call(12, 8))
    e = opforge.explain("linear", *_call(12, 8))      # unforced: the torch path
    assert e.chosen.qualified_name == "torch.reference"


@pytest.mark.emulator
def test_explain_names_the_metal_int8_k_multiple(emulate):
    with opforge.backend("metal"):
        e = opforge.explain("linear", *_call(130, 8, "cpu"))
        assert e.chosen is None and "K=130: the Metal int8 kernels read 4 codes per 32-bit word" in str(e)
        assert opforge.explain("linear", *_call(128, 8, "cpu")).chosen.qualified_name == "metal.qmv"
