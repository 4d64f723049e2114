"""Run without TRITON_INTERPRET (no GPU needed): every explicit launch key of the rotary, kv-append,
fused and delay kernels must stand for one Triton specialization (the generic key computed from
the arguments). Launches are intercepted, nothing runs. Used by test_rotary_delay_launch_keys.py."""
import itertools

import torch

from opforge.ops.delay import triton_kernels as dtk
from opforge.ops.delay.problem import prepare as prepare_delay
from opforge.ops.rotary import cases as rc
from opforge.ops.rotary import triton_kernels as rtk
from opforge.ops.rotary.problem import prepare_append, prepare_fused, prepare_rotary
from opforge.testing import spy_launch_keys

seen: dict = {}


def spy(launcher, name):
    spy_launch_keys(launcher, name, seen)


spy(rtk._rotary, "rotary")
spy(rtk._kv_append, "append")
spy(rtk._rotary_append, "fused")
spy(dtk._delay, "delay")
torch.manual_seed(0)
n = 0
for b, hq, hkv, s, d, r in [(1, 2, 1, 1, 16, 16), (2, 4, 2, 3, 16, 8), (1, 32, 8, 16, 128, 128), (3, 1, 1, 17, 80, 32)]:
    for dt in (torch.float16, torch.float32):
        for layout, posk, inter, inplace in itertools.product(("packed", "transposed"), ("2d", "1d"), (False, True),
                                                              (False, True)):
            q, k, cos, sin, pos = rc.make_rotary_inputs(b, hq, hkv, s, d, r, dt, "cpu", layout, posk)
            rtk.launch_rotary(prepare_rotary(q, k, cos, sin, pos, inter, inplace))
            q2 = torch.randn(b, hq, s, d + 1, dtype=dt)[..., 1:]   # not 16-byte aligned
            rtk.launch_rotary(prepare_rotary(q2, k, cos, sin, pos, inter, inplace))
            n += 2
for shape in [(2, 2, 1, 8, 16), (1, 8, 16, 64, 128), (3, 1, 5, 17, 80)]:
    for layout in ("packed", "transposed"):
        args, _ = rc.make_append_case(shape, torch.float16, layout).make("cpu")
        rtk.launch_kv_append(prepare_append(*args[:5]))
        n += 1
for shape in [(2, 4, 2, 1, 8, 16), (1, 32, 8, 16, 64, 128), (3, 2, 1, 5, 17, 80)]:
    for layout, positions, inter in itertools.product(("packed", "transposed"), (False, True), (False, True)):
        args, kwargs = rc.make_fused_case(shape, torch.bfloat16, r=shape[-1] // 2 if inter else 0, layout=layout,
                                          positions=positions, interleaved=inter).make("cpu")
        rtk.launch_fused(prepare_fused(*args[:8], kwargs.get("positions"), inter))
        n += 1
for b, t, c in [(1, 16, 1), (2, 40, 9), (1, 3072, 32), (3, 17, 16)]:
    for dt in (torch.int32, torch.int64):
        for fill in (1, 16, -5, 2**31 - 1, -2**31) + ((2**40, -2**40) if dt == torch.int64 else ()):
            codes = torch.randint(0, 9, (b, t, c), dtype=dt)
            dtk.launch(prepare_delay("apply_delay", codes, [1] * c, fill, fill, None))
            out = torch.empty(c, b, t - 1, dtype=dt).permute(1, 2, 0)
            dtk.launch(prepare_delay("revert_delay", codes[:, 1:], [1] * c, None, fill, out))
            n += 2
print(f"{n} launches, {len(seen)} distinct keys, each one specialization")
