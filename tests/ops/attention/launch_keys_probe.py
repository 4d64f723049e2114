"""Run without TRITON_INTERPRET (no GPU needed): every explicit launch key of the decode kernels
(split and combine) must stand for one Triton specialization (the generic key computed from the
arguments). Launches are intercepted, nothing runs. Used by test_attention_launch_keys.py."""
import itertools

import torch

from opforge.ops.attention import triton_kernels as tk
from opforge.ops.attention.problem import prepare_decode
from opforge.testing import spy_launch_keys

seen: dict = {}


def spy(launcher, name):
    spy_launch_keys(launcher, name, seen)


spy(tk._decode_split, "split")
spy(tk._decode_combine, "combine")
torch.manual_seed(0)
n = 0
for (b, hq, hkv, sq, s_max, d), dt, lens_dt, layout, splits in itertools.product(
        [(1, 8, 1, 1, 1024, 128), (2, 32, 8, 1, 4097, 128), (3, 4, 4, 3, 100, 80), (1, 2, 1, 16, 33, 64),
         (16, 16, 16, 1, 16, 16)],
        (torch.bfloat16, torch.float32), (torch.int32, torch.int64), ("packed", "bshd", "offset"), (None, 1, 3, 17)):
    if layout == "bshd":
        q = torch.randn(b, sq, hq, d, dtype=dt).transpose(1, 2)
        kc, vc = (torch.randn(b, s_max, hkv, d, dtype=dt).transpose(1, 2) for _ in range(2))
    elif layout == "offset":   # caches not 16-byte aligned
        q = torch.randn(b, hq, sq, d, dtype=dt)
        kc, vc = (torch.randn(b * hkv * s_max * d + 1, dtype=dt)[1:].view(b, hkv, s_max, d) for _ in range(2))
    else:
        q = torch.randn(b, hq, sq, d, dtype=dt)
        kc, vc = (torch.randn(b, hkv, s_max, d, dtype=dt) for _ in range(2))
    lens = torch.full((b,), s_max, dtype=lens_dt)
    tk.launch_decode(prepare_decode(q, kc, vc, lens, None), splits=splits)
    n += 1
print(f"{n} decode calls, {len(seen)} distinct keys, each one specialization")
