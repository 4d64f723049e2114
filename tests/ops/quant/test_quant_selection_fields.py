"""linear: a call, then one differing in one field the support predicates read (K, M, bits,
dense or quantized, dtype, the tuning switches), on the torch path, Triton's interpreter and the
Metal emulator: the second call is never served by the first call's cached choice."""
import torch

import opforge
from opforge.ops.quant import cases
from opforge.testing import DEVICE
from selection_pairs import check_pair, pair_tests


def linear_call(m, n, k, bits, dtype=torch.float16, group=-1, seed=0):
    """``device -> (opforge.linear's output, its float64 reference, dtype)``."""
    def call(device):
        g = torch.Generator().manual_seed(seed)
        dense = torch.randn(n, k, generator=g) * 0.05
        w = dense.to(dtype) if bits == 0 else opforge.quantize_weight(dense, bits, group, False)
        x = torch.randn(m, k, generator=g).to(dtype)
        ref = x.double() @ w.double().T if bits == 0 else cases.oracle((x, w, None), {})
        w = w.to(device)
        return opforge.linear(x.to(device), w), ref, dtype
    return call


#: (field, first call, second call): the second differs from the first in that field only
PAIRS = {
    "k % 4 (Metal int8)": (linear_call(2, 8, 128, 8), linear_call(2, 8, 130, 8)),
    "k % 4, qmm": (linear_call(20, 8, 128, 8), linear_call(20, 8, 130, 8)),
    "k < 16 (Triton)": (linear_call(2, 8, 16, 8), linear_call(2, 8, 12, 8)),
    "m (decode / prefill)": (linear_call(2, 8, 64, 4), linear_call(20, 8, 64, 4)),
    "bits": (linear_call(2, 8, 64, 4), linear_call(2, 8, 64, 8)),
    "dense": (linear_call(2, 8, 64, 4), linear_call(2, 8, 64, 0)),
    "dtype": (linear_call(2, 8, 64, 4), linear_call(2, 8, 64, 4, torch.float32)),
}


test_second_call_differing_in_one_field, test_second_call_differing_in_one_field_metal = pair_tests(PAIRS)


def test_metal_int8_k_not_multiple_of_4_after_one_that_is(emulate):
    """The case that once came out wrong: K=128 then K=130 (int8) on Metal is refused clearly."""
    first, second = check_pair("metal", *PAIRS["k % 4 (Metal int8)"])
    assert first == "ran" and "multiple of 4" in second
