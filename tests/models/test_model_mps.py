"""The decoder of ``opforge.models`` on a real Apple GPU: the checks of test_model_metal.py with
the model on MPS and the Metal kernels chosen by default (no backend forced), against the same
model on the CPU's torch path. Skipped wherever ``torch.backends.mps.is_available()`` is False;
not yet run on Apple hardware by this project."""
import pytest
import torch

import opforge
from opforge.serve import generate
from opforge.testing import rel_error

from test_model_metal import GENERATE_OPS, PROMPTS, model
from metal_emu.mps import needs_mps, real_metal  # noqa: F401 (real_metal: an autouse fixture)

pytestmark = needs_mps


@pytest.mark.parametrize("quantize", [None, "int8", "int4"])
def test_generation_on_mps_equals_the_cpu_torch_path(quantize):
    kwargs = {"quantize": quantize, "group_size": 64, "quantize_head": True} if quantize else {}
    cpu, mps = model(**kwargs), model(device="mps", **kwargs)
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(9))
    with opforge.backend("torch"):
        ref_logits, ref_tokens = cpu.forward(ids), generate(cpu, PROMPTS, 6)
    with opforge.trace() as t:
        logits, tokens = mps.forward(ids.to("mps")).cpu(), generate(mps, PROMPTS, 6)
    assert rel_error(logits, ref_logits) < 1e-4 and tokens == ref_tokens
    assert GENERATE_OPS <= {e.op for e in t if e.backend == "metal"}
    assert all(e.backend == "metal" for e in t if e.op != "linear" or quantize)
