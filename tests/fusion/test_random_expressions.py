"""Random expression trees over the supported operations: fused (float32, bfloat16 or float16
inputs, computed in float32) against eager torch on float64 copies of the same inputs, with
random broadcasting among the leaves and a Python-number argument."""
import os

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings, strategies as st

import opforge
from opforge.fusion import (abs as fabs, erf, exp, fuse, log, maximum, minimum, pow as fpow, rsqrt, sigmoid,
                            sqrt, tanh, where)
from opforge.testing import DEVICE

from fusion_helpers import assert_matches


def activation(fn):
    """``fn`` for tensors and symbolic values; on a Python number (a constant subtree of the
    reference) computed through a float64 tensor, as the fused function folds it in Python."""
    def apply(a):
        if isinstance(a, (bool, int, float)):
            return fn(torch.tensor(float(a), dtype=torch.float64)).item()
        return fn(a)
    return apply


# Builders work on tensors, symbolic tensors and Python numbers alike. Domains are kept safe
# (log of |a| + 1, division by |b| + 1...) so float32 never overflows where float64 does not:
# any difference then is an error of the kernel, not of the data.
UNARY = {
    "neg": lambda a: -a,
    "abs": lambda a: fabs(a),
    "tanh": lambda a: tanh(a),
    "erf": lambda a: erf(a),
    "sigmoid": lambda a: sigmoid(a),
    "exp_bounded": lambda a: exp(tanh(a) * 3),
    "log1p_abs": lambda a: log(fabs(a) + 1),
    "sqrt_abs": lambda a: sqrt(fabs(a)),
    "rsqrt_pos": lambda a: rsqrt(fabs(a) + 0.5),
    "square": lambda a: fpow(tanh(a) * 2, 2),
    "cube": lambda a: fpow(tanh(a), 3),
    "gelu": activation(F.gelu),
    "gelu_tanh": activation(lambda a: F.gelu(a, approximate="tanh")),
    "silu": activation(F.silu),
    "relu": activation(F.relu),
}
BINARY = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "div_safe": lambda a, b: a / (fabs(b) + 1),
    "minimum": lambda a, b: minimum(a, b),
    "maximum": lambda a, b: maximum(a, b),
    # continuous where a == b, so that values equal in float32 but not in float64 (saturated
    # tanh, erf...) pick branches that agree; thresholds away from saturation values
    "where_gt": lambda a, b: where(a > b, a - b, (b - a) * 0.5),
    "where_mask": lambda a, b: where((a < 0.37) | (b > -0.81) & (a > -2.3), a, -b),
}
EXAMPLES = int(os.environ.get("FUSION_EXAMPLES", 30))   # FUSION_EXAMPLES=2000 for a longer search
LEAF_SHAPES = {"full": lambda m, n: (m, n), "row": lambda m, n: (n,), "col": lambda m, n: (m, 1),
               "scalar": lambda m, n: (), "one": lambda m, n: (1, 1)}


def trees(depth: int):
    leaf = st.one_of(st.tuples(st.just("input"), st.integers(0, 2)),
                     st.tuples(st.just("const"), st.sampled_from([0.5, -2.0, 3, 1e-3])),
                     st.tuples(st.just("number"), st.just(0)))
    if depth == 0:
        return leaf
    sub = trees(depth - 1)
    return st.one_of(
        leaf,
        st.tuples(st.sampled_from(sorted(UNARY)), sub),
        st.tuples(st.sampled_from(sorted(BINARY)), sub, sub),
    )


def evaluate(tree, inputs, number):
    kind = tree[0]
    if kind == "input":
        return inputs[tree[1]]
    if kind == "const":
        return tree[1]
    if kind == "number":
        return number
    if kind in UNARY:
        return UNARY[kind](evaluate(tree[1], inputs, number))
    return BINARY[kind](evaluate(tree[1], inputs, number), evaluate(tree[2], inputs, number))


def uses_input(tree) -> bool:
    return tree[0] == "input" or any(uses_input(t) for t in tree[1:] if isinstance(t, tuple))


@st.composite
def cases(draw):
    tree = draw(trees(4))
    if not uses_input(tree):
        tree = ("add", tree, ("input", 0))
    m, n = draw(st.integers(1, 5)), draw(st.integers(1, 9))
    kinds = [draw(st.sampled_from(sorted(LEAF_SHAPES))) for _ in range(3)]
    kinds[0] = "full"           # the output always has the full shape
    seed = draw(st.integers(0, 2**31 - 1))
    number = draw(st.sampled_from([0.75, -1.5, 2.0]))
    dtype = draw(st.sampled_from([torch.float32, torch.float32, torch.bfloat16, torch.float16]))
    return tree, m, n, kinds, seed, number, dtype


@pytest.mark.parametrize("backend", ["triton", "torch"])
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases())
def test_random_expressions_match_eager_float64(backend, case):
    tree, m, n, kinds, seed, number, dtype = case
    gen = torch.Generator().manual_seed(seed)
    inputs = [(torch.randn(LEAF_SHAPES[k](m, n), generator=gen) * 2).to(DEVICE, dtype) for k in kinds]
    fused = fuse(lambda x0, x1, x2, s: evaluate(tree, (x0, x1, x2), s))
    with opforge.backend(backend):
        out = fused(*inputs, number)
    ref = evaluate(tree, [x.double() for x in inputs], number)
    if dtype == torch.float16:   # where float16 overflows (float64 does not) there is nothing to compare
        big = ref.abs() > 6e4
        out, ref = torch.where(big, 0.0, out.double()).to(dtype), torch.where(big, 0.0, ref)
    assert_matches(out, ref, dtype, factor=8)
