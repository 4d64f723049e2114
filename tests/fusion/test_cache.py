"""The caches: a second call neither traces nor generates; what makes a new trace, kernel or plan;
the disk cache; .source(); specialization on values and shapes."""
import functools

import pytest
import torch

import opforge
from opforge.fusion import FusedFunction, clear_caches, fuse, sigmoid
from opforge.fusion import cache as disk
from opforge.testing import DEVICE

from fusion_helpers import BACKENDS, randn, run


def counted(fn):
    """A fused function plus a count of how often its Python body runs (= traces)."""
    calls = []

    @functools.wraps(fn)
    def body(*args):
        calls.append(1)
        return fn(*args)

    return fuse(body), calls


@pytest.mark.parametrize("backend", BACKENDS)
def test_second_call_does_not_retrace_or_regenerate(backend):
    f, calls = counted(lambda x, b, s: x * sigmoid(x + b) * s)
    x, b = randn(8, 32), randn(32)
    first = run(f, (x, b, 0.5), backend)
    info = f.cache_info()
    assert (info.traces, info.kernels, info.plans) == (1, 1, 1)
    second = run(f, (randn(8, 32), randn(32), 2.0), backend)      # new data, new scalar value
    assert f.cache_info() == info and len(calls) == 1
    assert first.shape == second.shape


@pytest.mark.parametrize("backend", BACKENDS)
def test_what_makes_a_new_plan_kernel_or_trace(backend):
    f, calls = counted(lambda x, b: x + b)
    run(f, (randn(8, 32), randn(1, 32)), backend)
    run(f, (randn(5, 7), randn(1, 7)), backend)                 # new shape, same pattern: a plan only
    info = f.cache_info()
    assert (info.traces, info.kernels, info.plans) == (1, 1, 2)
    run(f, (randn(8, 32), randn(8, 1)), backend)                # new broadcast pattern, same ranks: no trace
    info = f.cache_info()
    assert info.traces == 1 and info.plans == 3
    assert info.kernels == (2 if backend != "torch" else 1)     # the torch path does not depend on it
    run(f, (randn(8, 32, dtype=torch.float16), randn(1, 32)), backend)   # new dtype: traces again
    assert f.cache_info().traces == 2
    run(f, (randn(2, 8, 32), randn(1, 32)), backend)            # new rank: traces again
    assert f.cache_info().traces == 3
    run(f, (randn(8, 32), 1.5), backend)                        # a number instead of a tensor
    assert f.cache_info().traces == 4
    assert len(calls) == 4


def test_python_number_types_are_part_of_the_key():
    f, calls = counted(lambda x, s: x * s)
    x = randn(4, 4)
    assert f(x, 2).dtype == torch.float32
    assert f(x, 3).dtype == torch.float32 and len(calls) == 1
    assert f(x, 2.5).dtype == torch.float32 and len(calls) == 2
    i = torch.arange(4, device=DEVICE)
    assert f(i, 2).dtype == torch.int64 and f(i, 2.5).dtype == torch.float32


def test_forced_backend_is_part_of_the_key():
    f = fuse(lambda x: x * 2)
    x = randn(3, 3)
    with opforge.trace() as t:
        with opforge.backend("torch"):
            f(x)
        with opforge.backend("triton"):
            f(x)
    assert [e.backend for e in t] == ["torch", "triton"]
    assert f.cache_info().traces == 1


def test_using_a_value_specializes_on_it():
    @fuse
    def f(x, n):
        if n > 2:                      # converts the number: the kernel specializes on n's value
            return x * n
        return x - n
    x = randn(4, 4)
    assert torch.allclose(f(x, 3), x * 3)
    assert torch.allclose(f(x, 1), x - 1)
    assert torch.allclose(f(x, 5), x * 5)
    assert torch.allclose(f(x, 1), x - 1)
    assert f.cache_info().traces == 3


def test_using_shapes_specializes_on_them():
    @fuse
    def scaled(x):
        return x / x.shape[-1] ** 0.5
    for n in (4, 16, 4):
        x = randn(3, n)
        assert torch.allclose(scaled(x), x / n ** 0.5)
    assert scaled.cache_info().traces == 2


@pytest.mark.parametrize("backend", BACKENDS)
def test_generated_source_is_written_to_the_disk_cache(backend, tmp_path, monkeypatch):
    monkeypatch.setenv("OPFORGE_CACHE_DIR", str(tmp_path))
    f = fuse(lambda x, b: x * b + 1)
    args = (randn(4, 8), randn(8))
    run(f, args, backend)
    source = f.source(DEVICE)
    files = list((tmp_path / "fusion").glob("*.py"))
    assert len(files) == 1 and files[0].read_text() == source
    if backend == "triton":
        assert "@triton.jit" in source and "tl.load" in source
    else:
        assert "def " in source and "torch" in source
    # regenerating (as a new process would) finds the same file: the name is the source's hash
    f.clear_cache()
    run(f, args, backend)
    assert list((tmp_path / "fusion").glob("*.py")) == files and f.cache_info().kernels == 2
    assert disk.cache_dir() == tmp_path / "fusion"


def test_unwritable_cache_dir_falls_back_to_a_temporary_one(tmp_path, monkeypatch):
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    monkeypatch.setenv("OPFORGE_CACHE_DIR", str(blocked))
    f = fuse(lambda x: x - 3)
    x = randn(2, 2)
    assert torch.equal(f(x), x - 3)


def test_source_with_example_arguments_and_errors():
    f = fuse(lambda x, b: x + b)
    with pytest.raises(LookupError, match="no kernel for"):
        f.source("cpu" if DEVICE == "cuda" else "cuda")
    with opforge.backend("triton"):
        src = f.source(DEVICE, randn(4, 8), randn(8))
    assert "@triton.jit" in src and "in1 + cols" in src     # the vector is read by column
    with opforge.backend("triton"):
        flat = f.source(DEVICE, randn(4, 8), randn(4, 8))
    assert "offs = pid * BLOCK" in flat                     # same shape: a flat kernel
    assert f.cache_info().traces == 2                       # the second b has another rank


def test_clear_caches_and_repr():
    f = fuse(lambda x: x + 1)
    f(randn(2))
    clear_caches()
    f(randn(2))
    assert f.cache_info().traces == 2
    assert isinstance(f, FusedFunction) and "fuse" in repr(f)
    assert "add" in f.graph(randn(2))


def test_common_subexpressions_are_computed_once():
    def g(x, y):
        a = (x + y) * (x + y)
        b = torch.exp(x + y) + torch.exp(x + y)
        return a + b * 1.0 - 0
    f = fuse(g)
    text = f.graph(randn(3), randn(3))
    assert text.count("add(%0, %1)") == 1 and text.count("exp(") == 1
    assert "mul(%" in text and "[1.0]" not in text and "sub(" not in text   # x * 1 and x - 0 are dropped


def test_constant_folding():
    from opforge.fusion.graph import Graph
    g = Graph()
    x = g.input(0, torch.float32, rank=1)
    c = g.add("mul", (g.add("add", (g.const(2.0), g.const(3.0))), g.const(4.0)))
    assert c.is_const and c.attr == 20.0
    y = g.add("mul", (x, g.add("exp", (g.const(0.0),))))
    assert y is x                                          # exp(0) folds to 1, x * 1 is x
    assert g.add("div", (g.const(1.0), g.const(0.0))).attr == float("inf")
