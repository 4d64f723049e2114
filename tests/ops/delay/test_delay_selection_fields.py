"""apply_delay / revert_delay: a call, then one differing in one field of the problem (op, code
dtype, channels), on the torch path, Triton's interpreter and the Metal emulator: the second
call is never served by the first call's cached choice or launch arguments."""
import torch

from opforge.ops.delay.cases import make_case
from selection_pairs import pair_tests

I32, I64 = torch.int32, torch.int64

PAIRS = {
    "op": (make_case("apply_delay", (2, 12, 4), I64), make_case("revert_delay", (2, 12, 4), I64)),
    "dtype": (make_case("apply_delay", (2, 12, 4), I64), make_case("apply_delay", (2, 12, 4), I32)),
    "channels": (make_case("apply_delay", (2, 12, 4), I64), make_case("apply_delay", (2, 12, 9), I64)),
}


test_second_call_differing_in_one_field, test_second_call_differing_in_one_field_metal = pair_tests(PAIRS)
