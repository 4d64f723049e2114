"""decode_attention reads k and v each through its own strides: caches laid out differently
(one packed, one a transposed or batch-strided view) give the same result as packed copies,
on every backend, against the float64 oracle."""
import pytest
import torch

import opforge
from opforge.ops.attention import reference
from opforge.testing import DEVICE, TOLERANCE, max_rel_error

B, HQ, HKV, S_MAX, D = 3, 8, 2, 40, 64
LENGTHS = (40, 7, 23)


def _bhsd(dtype):
    return torch.randn(B, HKV, S_MAX, D, device=DEVICE).to(dtype)


def _bshd(dtype):
    """(B, Hkv, S, D) viewed out of a (B, S, Hkv, D) buffer: head and sequence strides swapped."""
    return torch.randn(B, S_MAX, HKV, D, device=DEVICE).to(dtype).transpose(1, 2)


def _every_other_batch(dtype):
    """(B, Hkv, S, D) out of a (2B, Hkv, S + 8, D) buffer: other batch and head strides, a row gap."""
    return torch.randn(2 * B, HKV, S_MAX + 8, D, device=DEVICE).to(dtype)[::2, :, 3:3 + S_MAX]


LAYOUTS = {"packed": _bhsd, "bshd": _bshd, "strided": _every_other_batch}
PAIRS = [("packed", "bshd"), ("bshd", "packed"), ("packed", "strided"), ("strided", "bshd")]


@pytest.mark.parametrize("k_layout, v_layout", PAIRS, ids=[f"k_{k}-v_{v}" for k, v in PAIRS])
@pytest.mark.parametrize("q_len", [1, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_k_and_v_with_different_strides(k_layout, v_layout, q_len, dtype, every_backend):
    k_cache, v_cache = LAYOUTS[k_layout](dtype), LAYOUTS[v_layout](dtype)
    assert k_cache.stride() != v_cache.stride()
    q = torch.randn(B, HQ, q_len, D, device=DEVICE).to(dtype)
    lens = torch.tensor(LENGTHS, dtype=torch.int32, device=DEVICE)
    with opforge.backend(every_backend), opforge.trace() as t:
        out = opforge.decode_attention(q, k_cache, v_cache, lens)
    assert t[0].backend == every_backend
    ref = reference.decode_attention(q.double(), k_cache.double(), v_cache.double(), lens)
    assert max_rel_error(out, ref) <= TOLERANCE[dtype]
