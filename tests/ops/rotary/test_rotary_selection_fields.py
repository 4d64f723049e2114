"""rotary_embedding / kv_cache_append / rotary_kv_cache_append: a call, then one differing in one
field the support predicates read (op, dtype, head dim, rotary dim, interleaved), on the torch
path, Triton's interpreter and the Metal emulator: the second call is never served by the first
call's cached choice."""
import torch

from opforge.ops.rotary.cases import make_append_case, make_fused_case, make_rotary_case
from selection_pairs import pair_tests

F32, F16 = torch.float32, torch.float16

PAIRS = {
    "dtype": (make_rotary_case((1, 2, 1, 3, 16), F32), make_rotary_case((1, 2, 1, 3, 16), torch.float64)),
    "head_dim": (make_rotary_case((1, 2, 1, 3, 16), F16), make_rotary_case((1, 2, 1, 3, 24), F16)),
    "rotary_dim": (make_rotary_case((1, 2, 1, 3, 16), F16), make_rotary_case((1, 2, 1, 3, 16), F16, r=8)),
    "interleaved": (make_rotary_case((1, 2, 1, 3, 16), F16),
                    make_rotary_case((1, 2, 1, 3, 16), F16, interleaved=True)),
    "op (append)": (make_rotary_case((1, 2, 1, 3, 16), F16), make_append_case((2, 1, 2, 8, 16), F16)),
    "append dtype": (make_append_case((2, 1, 2, 8, 16), F16), make_append_case((2, 1, 2, 8, 16), torch.float64)),
    "op (fused)": (make_append_case((2, 1, 2, 8, 16), F16), make_fused_case((2, 2, 1, 2, 8, 16), F16)),
    "fused rotary_dim": (make_fused_case((2, 2, 1, 2, 8, 16), F16), make_fused_case((2, 2, 1, 2, 8, 16), F16, r=8)),
}


test_second_call_differing_in_one_field, test_second_call_differing_in_one_field_metal = pair_tests(PAIRS)
