"""Norms: a call, then one differing in one field the support predicates read (N across the
multirow / row / looped limits, dtype, weight dtype, affine or not, op), on the torch path,
Triton's interpreter and the Metal emulator: the second call is never served by the first
call's cached choice."""
import torch

from opforge.ops.norm.cases import make_case
from selection_pairs import pair_tests

F32, F16 = torch.float32, torch.float16

PAIRS = {
    "n (multirow -> row, Metal)": (make_case("rms_norm", (2, 64), F16), make_case("rms_norm", (2, 300), F16)),
    "n (multirow -> row, Triton)": (make_case("rms_norm", (2, 64), F16), make_case("rms_norm", (2, 1100), F16)),
    "n (row -> looped)": (make_case("layer_norm", (2, 4100), F32), make_case("layer_norm", (2, 33000), F32)),
    "dtype": (make_case("rms_norm", (3, 64), F32), make_case("rms_norm", (3, 64), torch.float64)),
    "weight dtype": (make_case("rms_norm", (3, 64), F16), make_case("rms_norm", (3, 64), F16, weight_dtype=F32)),
    "affine": (make_case("layer_norm", (3, 64), F16), make_case("layer_norm", (3, 64), F16, affine=False)),
    "op": (make_case("rms_norm", (3, 64), F16), make_case("add_rms_norm", (3, 64), F16)),
}


test_second_call_differing_in_one_field, test_second_call_differing_in_one_field_metal = pair_tests(PAIRS)
