"""The dense GEMV (``opforge.ops.quant.dense_gemv``) against float64, and how ``linear`` selects it."""
import pytest
import torch

import opforge
from opforge.ops.quant import dense_gemv as dg
from opforge.testing import DEVICE, TOLERANCE, rel_error


@pytest.mark.parametrize("m", [1, 3])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("config", [(16, 64, 2, 1), (8, 128, 4, 8)])
def test_dense_gemv_matches_float64(m, dtype, config):
    """Ragged N and K, a bias, a row slice of a wider weight; (8, 128, 4, 8) splits K (the fixup)."""
    k, n = 200, 40
    x = torch.randn(m, k, device=DEVICE, dtype=dtype)
    w = torch.randn(n, k + 24, device=DEVICE, dtype=dtype)[:, :k]
    bias = torch.randn(n, device=DEVICE, dtype=dtype)
    out = dg.dense_gemv(x, w, bias, config=config)
    want = x.double() @ w.double().T + bias.double()
    assert out.shape == (m, n) and out.dtype == dtype
    assert rel_error(out, want) < TOLERANCE[dtype]


def test_dense_gemv_refuses_what_it_cannot_read():
    x = torch.randn(17, 64, device=DEVICE, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="M <= 16"):
        dg.dense_gemv(x, torch.randn(8, 64, device=DEVICE, dtype=torch.bfloat16))


def test_config_for_keeps_steps_at_16_kb():
    assert dg.config_for(3072, 2048, 2) == (4, 2048, 4, 4)
    assert dg.config_for(64, 100, 2) == (64, 64, 4, 4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="linear sends dense calls to it on CUDA only")
def test_linear_runs_it_for_one_row():
    x = torch.randn(1, 1, 2048, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(3072, 2048, device="cuda", dtype=torch.bfloat16)
    with opforge.trace() as t:
        y = opforge.linear(x, w)
        y2 = opforge.linear(x.expand(1, 2, 2048), w)
    assert [(e.backend, e.variant) for e in t] == [("triton", "dense_gemv"), ("torch", "dense")]
    assert rel_error(y, x.double() @ w.double().T) < TOLERANCE[torch.bfloat16]
    assert rel_error(y2, x.expand(1, 2, 2048).double() @ w.double().T) < TOLERANCE[torch.bfloat16]
