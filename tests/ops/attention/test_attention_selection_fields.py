"""attention / decode_attention: a call, then one differing in one field the support predicates
read (head dim, across Metal's prefill set and the kernels' maximum; dtype), on the torch path,
Triton's interpreter and the Metal emulator: the second call is never served by the first
call's cached choice."""
import torch

from opforge.ops.attention.cases import decode_case, prefill_case
from selection_pairs import pair_tests

F32, F16 = torch.float32, torch.float16


def prefill(d, dtype=F16):
    return prefill_case(1, 2, 1, 5, 7, d, dtype, True)


def decode(d, dtype=F16):
    return decode_case(2, 2, 1, 1, 16, d, dtype, (5, 16))


PAIRS = {
    "head_dim (Metal prefill set)": (prefill(64), prefill(72)),
    "head_dim (past the maximum)": (prefill(64), prefill(320)),
    "dtype": (prefill(64, F32), prefill(64, torch.float64)),
    "decode head_dim": (decode(64), decode(320)),
    "decode dtype": (decode(64, F32), decode(64, torch.float64)),
}


test_second_call_differing_in_one_field, test_second_call_differing_in_one_field_metal = pair_tests(PAIRS)
