"""Activations: a call, then one differing in one field the support predicates read (op, dtype,
approximate), on the torch path, Triton's interpreter and the Metal emulator: the second call
is never served by the first call's cached choice."""
import torch

from opforge.ops.activation.cases import make_case
from selection_pairs import pair_tests

F32, F16 = torch.float32, torch.float16

PAIRS = {
    "op": (make_case("silu", (3, 64), F16), make_case("gelu", (3, 64), F16)),
    "op (gated)": (make_case("silu", (3, 64), F16), make_case("swiglu", (3, 64), F16)),
    "approximate": (make_case("gelu", (3, 64), F32), make_case("gelu", (3, 64), F32, approximate="tanh")),
    "dtype": (make_case("relu", (3, 64), F32), make_case("relu", (3, 64), torch.float64)),
    "shape": (make_case("silu", (3, 64), F16), make_case("silu", (5, 7), F16)),
}


test_second_call_differing_in_one_field, test_second_call_differing_in_one_field_metal = pair_tests(PAIRS)
