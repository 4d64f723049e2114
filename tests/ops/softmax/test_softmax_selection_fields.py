"""softmax / log_softmax: a call, then one differing in one field the support predicates read
(N across the multirow / row limits, few or many rows, dtype, op), on the torch path, Triton's
interpreter and the Metal emulator: the second call is never served by the first call's cached
choice."""
import pytest
import torch

from opforge.ops.softmax import problem
from opforge.ops.softmax.cases import make_case
from selection_pairs import pair_tests

F32, F16 = torch.float32, torch.float16

PAIRS = {
    "n (multirow -> row, Metal)": (make_case("softmax", (2, 64), F16), make_case("softmax", (2, 300), F16)),
    "n (multirow -> row, Triton)": (make_case("softmax", (2, 64), F32), make_case("softmax", (2, 1100), F32)),
    "n (row -> split, few rows)": (make_case("softmax", (2, 4000), F32), make_case("softmax", (2, 33000), F32)),
    # with FEW_ROWS set to 2 (below): 3 rows are "many" (the split variant is refused), cheaply
    "rows (few -> many)": (make_case("softmax", (2, 33000), F32), make_case("softmax", (3, 33000), F32)),
    "dtype": (make_case("softmax", (3, 64), F32), make_case("softmax", (3, 64), torch.float64)),
    "op": (make_case("softmax", (3, 64), F16), make_case("log_softmax", (3, 64), F16)),
}


@pytest.fixture(autouse=True)
def _two_rows_are_few(monkeypatch):
    monkeypatch.setattr(problem, "FEW_ROWS", 2)


test_second_call_differing_in_one_field, test_second_call_differing_in_one_field_metal = pair_tests(PAIRS)


def test_few_and_many_rows_choose_differently():
    """The rows pair above does flip the Triton choice (split for few long rows, else looped)."""
    import opforge
    from opforge.runtime import registry
    with opforge.backend("triton"):
        few = registry.select("softmax", problem.SoftmaxProblem("softmax", F32, 33000, 2, "cuda"), "cuda")
        many = registry.select("softmax", problem.SoftmaxProblem("softmax", F32, 33000, 3, "cuda"), "cuda")
    assert (few.variant.name, many.variant.name) == ("split", "looped")
