"""The Metal attention kernels on a real Apple GPU (MPS tensors), against the float64 reference
of test_attention_metal.py. Skipped wherever ``torch.backends.mps.is_available()`` is False."""
import pytest
import torch

from opforge.ops.attention import metal as attn_metal
from opforge.runtime.metal import library as metal_runtime

from test_attention_metal import TOL, reference, rel_err
from metal_emu.mps import MPS, needs_mps, real_metal  # noqa: F401 (real_metal: an autouse fixture)

pytestmark = needs_mps


def _dtypes():
    out = [torch.float32, torch.float16]
    if MPS and metal_runtime.bfloat_reason(torch.bfloat16, "mps", attn_metal.SOURCE,
                                           attn_metal.kernel_name("combine", torch.bfloat16)) is None:
        out.append(torch.bfloat16)
    return out


@pytest.mark.parametrize("dtype", _dtypes())
@pytest.mark.parametrize("d", [64, 80, 96, 128, 256])
@pytest.mark.parametrize("causal", [True, False])
def test_prefill_on_mps(dtype, d, causal):
    g = torch.Generator().manual_seed(d)
    q = torch.randn(2, 8, 300, d, generator=g).to(dtype)
    k = torch.randn(2, 2, 333, d, generator=g).to(dtype)
    v = torch.randn(2, 2, 333, d, generator=g).to(dtype)
    out = attn_metal.prefill(q.to("mps"), k.to("mps"), v.to("mps"), causal, d ** -0.5).cpu()
    assert rel_err(out, reference(q, k, v, causal, d ** -0.5)) <= TOL[dtype]


@pytest.mark.parametrize("dtype", _dtypes())
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("sq", [1, 4, 16])
def test_decode_on_mps(dtype, d, sq):
    g = torch.Generator().manual_seed(d + sq)
    q = torch.randn(3, 8, sq, d, generator=g).to(dtype)
    kc = torch.randn(3, 2, 1000, d, generator=g).to(dtype)
    vc = torch.randn(3, 2, 1000, d, generator=g).to(dtype)
    seqlens = torch.tensor([1000, 517, sq], dtype=torch.int32)
    out = attn_metal.decode(q.to("mps"), kc.to("mps"), vc.to("mps"), seqlens.to("mps"), d ** -0.5).cpu()
    assert rel_err(out, reference(q, kc, vc, True, d ** -0.5, seqlens)) <= TOL[dtype]
