"""With launch plans off (OPFORGE_PLANS=0), rotary and delay compute their launch arguments on
every call instead of keeping them per signature (what pass 1 of the GPU test relies on)."""
import torch

import opforge
from opforge.ops.delay import triton_kernels as delay_kernels
from opforge.ops.rotary import triton_kernels as rotary_kernels
from opforge.runtime import plans
from opforge.testing import DEVICE, rel_error


def test_launch_argument_caches_follow_the_plans_switch():
    previous = plans.set_enabled(False)
    try:
        rotary_kernels._plans.clear()
        delay_kernels._launch_args.clear()
        q, k = torch.randn(1, 2, 3, 8, device=DEVICE), torch.randn(1, 1, 3, 8, device=DEVICE)
        cos, sin = torch.randn(16, 4, device=DEVICE), torch.randn(16, 4, device=DEVICE)
        pos = torch.arange(3, device=DEVICE)
        with opforge.backend("triton"):
            qo, ko = opforge.rotary_embedding(q, k, cos, sin, pos)
            codes = torch.randint(0, 50, (1, 5, 3), device=DEVICE)
            delayed = opforge.apply_delay(codes, [0, 1, 2], bos_id=51, pad_id=52)
        assert len(rotary_kernels._plans) == 0 and len(delay_kernels._launch_args) == 0
        with opforge.backend("torch"):
            want_q, _ = opforge.rotary_embedding(q.double(), k.double(), cos, sin, pos)
            want_d = opforge.apply_delay(codes, [0, 1, 2], bos_id=51, pad_id=52)
        assert rel_error(qo, want_q) < 1e-5 and torch.equal(delayed, want_d)
        plans.set_enabled(True)
        with opforge.backend("triton"):
            opforge.rotary_embedding(q, k, cos, sin, pos)
            opforge.apply_delay(codes, [0, 1, 2], bos_id=51, pad_id=52)
        kept = 1 if plans.enabled() else 0      # OPFORGE_CHECK_LAUNCH_KEYS keeps plans off
        assert len(rotary_kernels._plans) == kept and len(delay_kernels._launch_args) == kept
    finally:
        plans.set_enabled(previous)
