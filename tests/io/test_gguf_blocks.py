"""ggml block formats decoded into QuantizedWeight parts, against the `gguf` package's own
dequantization of the same bytes (random blocks: every code, scale and minimum pattern)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from opforge.io.gguf import TensorInfo, decode_tensor
from opforge.io.gguf_blocks import BLOCKS

gguf = pytest.importorskip("gguf")

# byte offsets of the float16 scales in each block (kept finite and moderate: random bytes
# would give NaN/inf scales, which a real file does not hold)
_F16_AT = {"Q8_0": (0,), "Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2),
           "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}


def _random_blocks(kind: str, rows: int, blocks_per_row: int, seed: int) -> np.ndarray:
    _, nbytes = BLOCKS[kind]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, (rows, blocks_per_row, nbytes), dtype=np.uint8)
    for at in _F16_AT[kind]:
        scales = rng.uniform(-0.05, 0.05, (rows, blocks_per_row)).astype(np.float16)
        raw[..., at:at + 2] = scales[..., None].view(np.uint8)
    raw[0, 0, _F16_AT[kind][0]:_F16_AT[kind][0] + 2] = np.zeros(2, np.uint8)     # a block with scale 0
    return raw.reshape(rows, blocks_per_row * nbytes)


@pytest.mark.parametrize("kind", sorted(BLOCKS))
def test_block_formats_decode_to_ggmls_values(kind):
    per_block, _ = BLOCKS[kind]
    rows, blocks = 6, 2
    raw = _random_blocks(kind, rows, blocks, seed=len(kind) * 7 + ord(kind[1]))
    info = TensorInfo("w", kind, (rows, per_block * blocks), raw)
    qw = decode_tensor(info)
    ref = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[kind]).astype(np.float64)
    got = qw.dequantize(torch.float64).numpy()
    scale = np.abs(ref).max()
    err = np.abs(got - ref).max() / scale
    exact = kind in ("Q8_0", "Q4_0", "Q5_0", "Q6_K")        # no quotient zero: every product is exact
    assert err <= (0 if exact else 1e-6), (kind, err)
    assert qw.bits == (4 if kind in ("Q4_0", "Q4_1", "Q4_K") else 8)
    assert qw.group == (16 if kind == "Q6_K" else 32)


def test_q4_1_weight_through_linear_matches_float64_of_ggmls_values():
    raw = _random_blocks("Q4_1", 16, 4, seed=5)
    qw = decode_tensor(TensorInfo("w", "Q4_1", (16, 128), raw))
    w = torch.from_numpy(gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.Q4_1).astype(np.float64))
    x = torch.randn(3, 128)
    import opforge
    y = opforge.linear(x, qw)
    ref = x.double() @ w.T
    assert torch.allclose(y.double(), ref, rtol=1e-5, atol=1e-5 * ref.abs().max().item())
    assert not qw.symmetric and qw.zeros.frac().abs().max() > 0.01      # the zeros are not integers
