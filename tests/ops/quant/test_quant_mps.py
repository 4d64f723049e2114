"""The Metal quantized-linear kernels on a real Apple GPU (MPS tensors), against the float64
oracle of test_quant_metal.py. Skipped wherever ``torch.backends.mps.is_available()`` is False."""
import pytest
import torch

import opforge
from opforge.ops.quant import metal as quant_metal
from opforge.runtime.metal import library as metal_runtime
from opforge.testing import TOLERANCE, max_rel_error

from test_quant_metal import oracle, weight
from metal_emu.mps import MPS, needs_mps, real_metal  # noqa: F401 (real_metal: an autouse fixture)

pytestmark = needs_mps


def _dtypes():
    out = [torch.float32, torch.float16]
    if MPS and metal_runtime.bfloat_reason(torch.bfloat16, "mps", quant_metal.SOURCE,
                                           quant_metal.kernel_name("qmm", torch.bfloat16, 4)) is None:
        out.append(torch.bfloat16)
    return out


@pytest.mark.parametrize("dtype", _dtypes())
@pytest.mark.parametrize("bits,group,symmetric", [(4, 128, False), (4, 32, True), (8, 64, False), (8, -1, True)])
@pytest.mark.parametrize("m", [1, 4, 16, 17, 300])
def test_linear_on_mps(dtype, bits, group, symmetric, m):
    qw = weight(1000, 4096, bits, group, symmetric, seed=bits * m)
    x = torch.randn(m, 4096).to(dtype)
    bias = torch.randn(1000).to(dtype)
    with opforge.trace() as t:
        out = opforge.linear(x.to("mps"), qw.to("mps"), bias.to("mps")).cpu()
    assert [(e.backend, e.variant) for e in t] == [("metal", "qmv" if m <= 16 else "qmm")]
    err = max_rel_error(out, oracle(x, qw, bias))
    assert err <= TOLERANCE[dtype], f"int{bits} g{group} M={m} {dtype}: rel err {err:.3e}"
