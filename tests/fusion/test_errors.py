"""Errors: unfusable operations name the operation and the user's line; shape mismatches raise as
torch does; a function with no tensor output is refused; bad arguments."""
import inspect
import re

import pytest
import torch
import torch.nn.functional as F

from opforge.fusion import FusionError, UnfusableError, exp, fuse, where
from opforge.testing import DEVICE

from fusion_helpers import BACKENDS, randn, run

OUTSIDE = torch.randn(4)


def reduction(x):
    y = exp(x)
    return y.sum()


def matmul(x, y):
    return x @ y


def inplace(x):
    x += 1
    return x


def captured(x):
    return x * OUTSIDE


def indexing(x):
    return x[0] + 1


def softmax(x):
    return torch.softmax(x, -1)


def data_dependent(x):
    if x.max() > 0:
        return x
    return -x


def truthiness(x):
    return x if x > 0 else -x


def view(x):
    return x.view(-1) * 2


def floor_division(x):
    return x // 2


def tensor_exponent(x, y):
    return x ** y


def out_argument(x, y):
    return torch.add(x, y, out=x)


def device_move(x):
    return x.to("meta") * 2


CASES = [
    (reduction, 1, ".sum", "return y.sum()"),
    (matmul, 2, "@ (matmul)", "return x @ y"),
    (inplace, 1, "in-place +=", "x += 1"),
    (captured, 1, "a tensor from outside the function", "return x * OUTSIDE"),
    (indexing, 1, "indexing", "return x[0] + 1"),
    (softmax, 1, "torch.softmax", "return torch.softmax(x, -1)"),
    (data_dependent, 1, ".max", "if x.max() > 0:"),
    (truthiness, 1, "bool() of a tensor", "return x if x > 0 else -x"),
    (view, 1, ".view", "return x.view(-1) * 2"),
    (floor_division, 1, "// (floor division)", "return x // 2"),
    (tensor_exponent, 2, "tensor exponent", "return x ** y"),
    (out_argument, 2, "out=", "return torch.add(x, y, out=x)"),
    (device_move, 1, ".to('meta')", 'return x.to("meta") * 2'),
]


@pytest.mark.parametrize("fn,nargs,operation,line", CASES, ids=[c[0].__name__ for c in CASES])
def test_unfusable_operations_name_the_operation_and_line(fn, nargs, operation, line):
    f = fuse(fn)
    with pytest.raises(UnfusableError) as info:
        f(*[randn(4, 4) for _ in range(nargs)])
    message = str(info.value)
    assert operation in message and "cannot be fused" in message
    lines, first = inspect.getsourcelines(fn)
    lineno = first + [text.strip() for text in lines].index(line)
    assert f"test_errors.py:{lineno} in {fn.__name__}: {line}" in message
    assert info.value.where.lineno == lineno and info.value.where.text == line


def test_error_line_of_a_helper_is_the_calling_line_of_the_fused_function():
    def helper(t):
        return t.cumsum(0)

    def f(x):
        y = x + 1
        return helper(y) * 2

    with pytest.raises(UnfusableError, match=re.escape("return helper(y) * 2")):
        fuse(f)(randn(3))


@pytest.mark.parametrize("backend", BACKENDS)
def test_shape_mismatch_raises_as_torch_would(backend):
    def f(x, y):
        z = x + 1
        return z * y

    x, y = randn(2, 3), randn(4)
    with pytest.raises(RuntimeError) as ours:
        run(fuse(f), (x, y), backend)
    with pytest.raises(RuntimeError) as theirs:
        f(x, y)
    assert str(theirs.value) in str(ours.value)
    assert "return z * y" in str(ours.value)


@pytest.mark.parametrize("result,kind", [(lambda x: 2.0, "a Python number"), (lambda x: None, "a NoneType"),
                                         (lambda x: (x + 1, 3), "a Python number"), (lambda x: (), "empty"),
                                         (lambda x: OUTSIDE, "a tensor from outside")])
def test_no_tensor_output_is_an_error(result, kind):
    with pytest.raises(FusionError, match=kind):
        fuse(result)(randn(4))


def test_scalar_only_output_is_an_error():
    with pytest.raises(FusionError, match="returned no tensor"):
        fuse(lambda x, s: s * 2)(randn(4), 3.0)


def test_bad_arguments():
    f = fuse(lambda x, y: x + y)
    with pytest.raises(TypeError, match="missing a required argument"):
        f(randn(3))
    with pytest.raises(TypeError, match="not hashable"):
        f(randn(3), [1, 2])
    with pytest.raises(TypeError, match="complex64"):
        f(randn(3), torch.ones(3, dtype=torch.complex64, device=DEVICE))
    with pytest.raises(TypeError, match="named parameters"):
        fuse(lambda *xs: xs[0])


def test_torch_refusals_are_kept():
    m = torch.ones(3, dtype=torch.bool, device=DEVICE)
    with pytest.raises(FusionError, match="subtraction of bool tensors"):
        fuse(lambda m: m - m)(m)
    with pytest.raises(FusionError, match="bool condition"):
        fuse(lambda x: where(x, x, 0.0))(randn(3))
    with pytest.raises(FusionError, match="bitwise"):
        fuse(lambda x: x & x)(randn(3))
    with pytest.raises(FusionError, match="negative integer powers"):
        fuse(lambda i: i ** -1)(torch.arange(3, device=DEVICE))
    with pytest.raises(FusionError, match="approximate must be"):
        fuse(lambda x: F.gelu(x, approximate="fast"))(randn(3))


def test_mixed_devices_are_refused():
    if DEVICE == "cpu":
        pytest.skip("needs a second device")
    with pytest.raises(RuntimeError, match="same device"):
        fuse(lambda x, y: x + y)(randn(3), torch.ones(3))


def test_errors_raised_by_user_code_carry_the_line():
    def f(x):
        y = x * 2
        raise KeyError("boom")

    with pytest.raises(KeyError) as info:
        fuse(f)(randn(2))
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "opforge.fuse traced f" in notes and 'raise KeyError("boom")' in notes


def test_hasattr_on_a_symbolic_tensor_is_false_for_unknown_attributes():
    seen = {}

    def f(x):
        seen["grad_fn"] = hasattr(x, "grad_fn")
        return x + 1

    fuse(f)(randn(2))
    assert seen == {"grad_fn": False}


def test_fuse_of_something_not_callable_names_the_argument():
    for make in (lambda: fuse(3), lambda: fuse("x + 1"), lambda: fuse(name="f")(3)):
        with pytest.raises(TypeError, match="opforge.fuse: fn must be a function of tensors"):
            make()
    with pytest.raises(TypeError, match="opforge.fuse: name must be a str"):
        fuse(lambda x: x, name=3)


@pytest.mark.parametrize("fn, operation, instead", [
    (lambda x: torch.relu_(x * 2), "torch.relu_", "torch.relu(...)"),
    (lambda x: torch.sigmoid_(x * 2), "torch.sigmoid_", "torch.sigmoid(...)"),
    (lambda x: (x * 2).add_(1), "tensor attribute .add_", ".add()"),
    (lambda x: (x * 2).mul_(x), "tensor attribute .mul_", ".mul()"),
])
def test_in_place_operations_are_refused_as_in_place(fn, operation, instead):
    with pytest.raises(UnfusableError, match=re.escape(f"{operation} cannot be fused: it writes its input in "
                                                       f"place; a fused function computes new tensors: write "
                                                       f"{instead} instead")):
        fuse(fn)(randn(4))
