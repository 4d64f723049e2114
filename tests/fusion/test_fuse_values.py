"""Fused functions against the float64 oracle: dtypes, broadcasting, layouts, scalars, promotion,
multiple outputs, casts, the math functions and the activations, on the Triton and torch paths."""
import math

import pytest
import torch
import torch.nn.functional as F

import opforge
from opforge.fusion import (abs as fabs, cast, erf, exp, fuse, log, maximum, minimum, pow as fpow, rsqrt,
                            sigmoid, sqrt, tanh, where)
from opforge.testing import DEVICE

from fusion_helpers import BACKENDS, assert_matches, check, fresh, randn, run, to_double

HALF_AND_SINGLE = [torch.float32, torch.float16, torch.bfloat16]


def bias_gelu_residual(x, b, r, scale: float):
    return F.gelu(x + b) * scale + r


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", HALF_AND_SINGLE)
def test_bias_gelu_residual(backend, dtype):
    f = fuse(bias_gelu_residual)
    args = (randn(33, 300, dtype=dtype), randn(300, dtype=dtype), randn(33, 300, dtype=dtype), 0.75)
    check(f, bias_gelu_residual, args, backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_many_programs_and_ragged_edges(backend):
    # several programs in both directions of a tiled kernel, and a flat one with a ragged tail
    f = fresh(lambda x, b: x * b - 1.0)
    check(f, lambda x, b: x * b - 1.0, (randn(130, 1030), randn(1030)), backend)
    check(f, lambda x, b: x * b - 1.0, (randn(3, 1237), randn(3, 1237)), backend)


SHAPES = [
    ((4, 8), (4, 8), (4, 8)),          # all full
    ((4, 8), (8,), ()),                # a row vector and a 0-d tensor
    ((4, 8), (4, 1), (1, 8)),          # a column and a row
    ((2, 3, 8), (3, 1), (8,)),         # a column over a 3-d output
    ((5,), (1,), (5,)),                # a 1-element tensor (read once)
    ((), (), ()),                      # everything 0-d
    ((3, 1, 5), (4, 1), (1,)),         # broadcast in the middle: strided reads
    ((2, 1), (1, 3), (2, 3)),          # outer-product style
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shapes", SHAPES, ids=lambda s: "-".join("x".join(map(str, d)) or "0d" for d in s))
def test_broadcasting(backend, shapes):
    g = lambda x, y, z: (x * y + z, exp(x) - z)
    check(fresh(g), g, [randn(*s) for s in shapes], backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_strided_transposed_and_expanded_inputs(backend):
    g = lambda x, y, z: (x * y + z, x - y * z)
    x = randn(8, 6).t()                  # transposed
    y = randn(6, 16)[:, ::2]             # every other column
    z = randn(6, 1).expand(6, 8)         # an expanded view (stride 0)
    check(fresh(g), g, (x, y, z), backend)
    x3 = randn(3, 4, 10)[:, :, ::2]      # 3-d, strided last dimension
    check(fresh(g), g, (x3, randn(4, 5), randn(3, 1, 5)), backend)
    column_view = randn(6, 3)[:, 1:2]    # (6, 1) with row stride 3: not a packed column
    check(fresh(g), g, (randn(6, 4), column_view, randn(4)), backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_python_number_arguments(backend):
    g = lambda x, s, n, flag: where(flag, x * s + n, x / n)
    f = fresh(g)
    eager = lambda x, s, n, flag: torch.where(torch.tensor(flag, device=x.device), x * s + n, x / n)
    for s, n, flag in [(0.3, 3, True), (-2.5, 7, False), (1.0, 1, True), (float("inf"), 2, False)]:
        check(f, eager, (randn(4, 8), s, n, flag), backend)
    assert f.cache_info().traces == 1          # new values of numbers never retrace


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("pair", [
    (torch.bfloat16, torch.float16), (torch.int32, torch.float32), (torch.bfloat16, torch.float32),
    (torch.int64, torch.int32), (torch.bool, torch.float16), (torch.uint8, torch.int8),
], ids=str)
def test_type_promotion_follows_torch(backend, pair):
    da, db = pair
    a = (randn(4, 8) * 4).to(da)
    b = (randn(8) * 4).to(db)
    g = lambda a, b: (a + b, a * 2.5, a > b)
    check(fresh(g), g, (a, b), backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_zero_dim_tensors_promote_like_scalars(backend):
    g = lambda x, z: x * z + 1
    a = randn(4, 8, dtype=torch.bfloat16)
    check(fresh(g), g, (a, torch.tensor(0.37, dtype=torch.float64, device=DEVICE)), backend)   # stays bf16
    check(fresh(g), g, (torch.arange(6, device=DEVICE).reshape(2, 3), torch.tensor(0.5, device=DEVICE)), backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_zero_dim_cpu_tensor_beside_device_tensors(backend):
    g = lambda x, s: x * s
    check(fresh(g), g, (randn(4, 8), torch.tensor(3.0)), backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_half_inputs_compute_in_float32(backend):
    # x + 1 - x is 1 in float32 for |x| < 2**23 but 0 in bfloat16 arithmetic once |x| >= 256
    x = torch.full((4, 8), 300.0, dtype=torch.bfloat16, device=DEVICE)
    out = run(fresh(lambda x: x + 1 - x), (x,), backend)
    assert out.dtype == torch.bfloat16 and torch.all(out == 1)


def _math(x):
    return (log(fabs(x)), sqrt(fabs(x)), rsqrt(fabs(x) + 1), tanh(x), erf(x), sigmoid(x), exp(x * 0.5),
            minimum(x, 0.5), maximum(-0.5, x), fpow(x, 3), fpow(fabs(x), 1.7), fpow(x, -2), fpow(fabs(x), 0.5),
            fpow(x, 0), x ** 2, fabs(x) ** -0.5, -x, fpow(x * 0.25, 65), fpow(x * 0.25, 66))


def _math_torch(x):
    return (torch.log(x.abs()), x.abs().sqrt(), torch.rsqrt(x.abs() + 1), torch.tanh(x), torch.erf(x),
            torch.sigmoid(x), torch.exp(x * 0.5), torch.clamp(x, max=0.5), torch.clamp(x, min=-0.5), x ** 3,
            x.abs() ** 1.7, x ** -2, x.abs() ** 0.5, x ** 0, x ** 2, x.abs() ** -0.5, -x, (x * 0.25) ** 65,
            (x * 0.25) ** 66)


@pytest.mark.parametrize("backend", BACKENDS)
def test_math_functions(backend):
    x = randn(5, 37) * 3
    x[0, :4] = torch.tensor([0.0, -0.0, 1e-4, -1e-3])
    check(fresh(_math), _math_torch, (x,), backend, factor=3)


@pytest.mark.parametrize("backend", BACKENDS)
def test_tanh_and_erf_across_their_range(backend):
    x = torch.cat([torch.linspace(-12, 12, 2001), torch.logspace(-8, 1, 200), -torch.logspace(-8, 1, 200)])
    x = x.to(DEVICE)
    out = run(fresh(lambda x: (tanh(x), erf(x))), (x,), backend)
    for o, ref in zip(out, (torch.tanh(x.double()), torch.erf(x.double()))):
        rel = ((o.double() - ref).abs() / ref.abs().clamp_min(1e-30)).max().item()
        assert rel < 2e-6


@pytest.mark.parametrize("backend", BACKENDS)
def test_special_values(backend):
    x = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1.0, -1.0, 1e30, -1e30], device=DEVICE)
    g = lambda x: (exp(x), log(x), sqrt(x), rsqrt(x), tanh(x), erf(x), sigmoid(x), fabs(x), minimum(x, 0.0),
                   maximum(x, 0.0), x / 0.0, F.relu(x), x * float("inf"), x + float("nan"),
                   where(x > 0, x, -float("inf")))
    eager = lambda x: (torch.exp(x), torch.log(x), torch.sqrt(x), torch.rsqrt(x), torch.tanh(x), torch.erf(x),
                       torch.sigmoid(x), x.abs(), torch.minimum(x, torch.zeros_like(x)),
                       torch.maximum(x, torch.zeros_like(x)), x / 0.0, torch.relu(x), x * float("inf"),
                       x + float("nan"), torch.where(x > 0, x, -float("inf")))
    check(fresh(g), eager, (x,), backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_comparisons_logic_and_casts(backend):
    x = randn(6, 10) * 3
    g = lambda x: (x > 0, (x > 0) & (x < 1), ~(x > 0), (x >= 1) | (x <= -1), (x > 0) ^ (x > 1), x == x, x != 0.5,
                   x.to(torch.bfloat16), x.int(), x.half(), x.long(), cast(x, torch.int8), x.bool(),
                   (x > 0).float() * x)
    eager = lambda x: (x > 0, (x > 0) & (x < 1), ~(x > 0), (x >= 1) | (x <= -1), (x > 0) ^ (x > 1), x == x,
                       x != 0.5, x.to(torch.bfloat16), x.int(), x.half(), x.long(), x.to(torch.int8), x.bool(),
                       (x > 0).float() * x)
    out = run(fresh(g), (x,), backend)
    ref = eager(x)
    assert [o.dtype for o in out] == [r.dtype for r in ref]
    for o, r in zip(out, ref):
        if o.dtype.is_floating_point:
            # casts to half types round once; the interpreter's bf16 store truncates (see opforge.testing)
            assert torch.allclose(o.double(), r.double(), rtol=8e-3, atol=0)
        else:
            assert torch.equal(o, r)


@pytest.mark.parametrize("backend", BACKENDS)
def test_cast_to_half_rounds_in_the_middle(backend):
    x = torch.full((2, 4), 1.0 + 2 ** -12, device=DEVICE)   # not representable in bfloat16
    out = run(fresh(lambda x: (x.bfloat16().float() - 1.0) * 4096), (x,), backend)
    assert torch.all(out == 0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_multiple_outputs_and_shared_subexpressions(backend):
    def g(x, y):
        h = x * y + 1
        return h, h * h, sigmoid(h), x   # the last output is a copy of an input
    x, y = randn(7, 9), randn(7, 9)
    out = check(fresh(g), g, (x, y), backend)
    assert out[3] is not x and torch.equal(out[3], x)
    out[3].add_(1)
    assert not torch.equal(out[3], x)   # a new tensor, not a view of the input


@pytest.mark.parametrize("backend", BACKENDS)
def test_integer_and_bool_tensors(backend):
    i = torch.randint(-5, 5, (4, 6), device=DEVICE, dtype=torch.int32)
    m = torch.rand(4, 6, device=DEVICE) > 0.5
    g = lambda i, m: (i * 3 - 1, i / 2, where(m, i, -i), fpow(i, 2), maximum(i, 0), fabs(i), F.relu(i), m * 2, m + m,
                      m * m, i.float() * 0.5)
    check(fresh(g), g, (i, m), backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_torch_spellings_and_methods(backend):
    def g(x, y):
        a = torch.add(x, y, alpha=2) - torch.sub(x, y) * torch.mul(x, 0.5)
        b = torch.where(torch.gt(x, y), torch.exp(x.clamp(max=3)), torch.sigmoid(y)) / torch.div(y.abs(), 2).add(1)
        c = F.silu(x) + F.relu(y) + F.gelu(x, approximate="tanh") + torch.tanh(x).pow(2)
        d = torch.minimum(x, y) + torch.maximum(x, y).neg() + x.clip(-1, 1) + torch.special.erf(y) + x.rsqrt().abs()
        return a, b, c, d
    x, y = randn(5, 8) * 2, randn(8) * 2
    check(fresh(g), g, (x, y), backend, factor=3)


@pytest.mark.parametrize("backend", BACKENDS)
def test_opforge_activations_fuse(backend):
    gelu = getattr(opforge, "gelu", None)
    if gelu is None:
        from opforge.ops.activation import geglu, gelu, relu, silu, swiglu
    else:
        geglu, relu, silu, swiglu = opforge.geglu, opforge.relu, opforge.silu, opforge.swiglu
    from opforge.ops.activation import reference

    def g(x, u):
        return gelu(x), gelu(x, approximate="tanh"), silu(x), relu(x), swiglu(x, u), geglu(x, u), \
            geglu(x, u, approximate="tanh")

    def oracle(x, u):
        return reference.gelu(x), reference.gelu(x, "tanh"), reference.silu(x), reference.relu(x), \
            reference.swiglu(x, u), reference.geglu(x, u), reference.geglu(x, u, "tanh")

    for dtype in HALF_AND_SINGLE:
        x, u = randn(6, 40, dtype=dtype) * 3, randn(6, 40, dtype=dtype)
        out = run(fresh(g), (x, u), backend)
        assert_matches(out, oracle(to_double(x), to_double(u)), tuple([dtype] * 7), factor=2)


@pytest.mark.parametrize("backend", BACKENDS)
def test_empty_and_keyword_arguments(backend):
    def g(x, b, scale=2.0, *, shift=1.0):
        return x * scale + b - shift
    f = fuse(g)
    x, b = randn(0, 5), randn(5)
    out = run(f, (x, b), backend)
    assert out.shape == (0, 5) and out.dtype == torch.float32
    x = randn(3, 5)
    with opforge.backend(backend):
        assert torch.allclose(f(x, b, shift=0.5), x * 2 + b - 0.5)
        assert torch.allclose(f(x, b=b, scale=3.0), x * 3 + b - 1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_large_exponent_integer_and_fractional_pow(backend):
    x = torch.tensor([-1.5, -1.0, -0.5, 0.0, 0.5, 1.0, 1.01], device=DEVICE)
    g = lambda x: (fpow(x, 101), fpow(x, 100), fpow(x, 2.5), fpow(x, -3), fpow(x, 0))
    check(fresh(g), g, (x,), backend, factor=10)
    assert math.isnan(run(fresh(lambda x: fpow(x, 2.5)), (x,), backend)[0].item())


def test_float64_runs_on_the_torch_path():
    g = lambda x, y: x.double() * y + 1
    args = (randn(3, 4), randn(4, dtype=torch.float64))
    check(fresh(g), g, args, "torch")
    with pytest.raises(opforge.NoKernelError, match="float64"):
        run(fresh(g), args, "triton")
