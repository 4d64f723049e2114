"""The registry's selection rules on a made-up op: the runtime knows no real op."""
from dataclasses import dataclass

import pytest

import opforge
from opforge.runtime import backends, registry
from opforge.runtime.registry import Variant


@dataclass(frozen=True)
class FakeProblem:
    n: int
    device_type: str = "cuda"

    @property
    def key(self):
        return (self.n,)

    def describe(self):
        return f"n={self.n}"


@pytest.fixture
def fake_op(monkeypatch):
    monkeypatch.setattr(backends, "unavailable_reason", lambda b, d: None)
    name = "fake_op_for_registry_tests"
    registry._variants.pop(name, None)
    registry.register(Variant(name, "triton", "small", lambda p: None if p.n <= 8 else f"n={p.n} > 8",
                              lambda p: "triton.small", "small n"))
    registry.register(Variant(name, "triton", "any", lambda p: None if p.n % 2 == 0 else "odd n",
                              lambda p: "triton.any", "even n"))
    registry.register(Variant(name, "torch", "reference", lambda p: None, lambda p: "torch", "everything"))
    registry.register_problem_builder(name, lambda n, device_type="cuda": FakeProblem(n, device_type))
    registry.clear_cache()
    yield name
    registry._variants.pop(name)
    registry._problem_builders.pop(name)
    registry.clear_cache()
    opforge.runtime.policy._warned.clear()


def test_first_supporting_variant_wins(fake_op):
    assert registry.select(fake_op, FakeProblem(4), "cuda").variant.name == "small"
    assert registry.select(fake_op, FakeProblem(10), "cuda").variant.name == "any"


def test_selection_is_deterministic_and_cached(fake_op):
    first = registry.select(fake_op, FakeProblem(10), "cuda")
    assert registry.select(fake_op, FakeProblem(10), "cuda") is first


def test_fallback_on_accelerator_warns_once(fake_op):
    with pytest.warns(opforge.FallbackWarning, match="odd n"):
        choice = registry.select(fake_op, FakeProblem(11), "cuda")
    assert choice.variant.backend == "torch" and "n=11 > 8" in choice.fallback_reason


def test_strict_raises_instead_of_fallback(fake_op):
    with opforge.strict(), pytest.raises(opforge.NoKernelError) as info:
        registry.select(fake_op, FakeProblem(11), "cuda")
    assert "triton.any: odd n" in str(info.value)


def test_cpu_runs_torch_natively_without_warning(fake_op, recwarn):
    assert registry.select(fake_op, FakeProblem(11), "cpu").fallback_reason is None
    assert not recwarn.list


def test_forced_backend_never_falls_back(fake_op):
    with opforge.backend("triton"), pytest.raises(opforge.NoKernelError, match="odd n"):
        registry.select(fake_op, FakeProblem(11), "cuda")
    with opforge.backend("torch"):
        assert registry.select(fake_op, FakeProblem(4), "cuda").variant.backend == "torch"


def test_explain_lists_every_variant(fake_op):
    e = registry.explain(fake_op, 10)
    assert e.chosen.name == "any"
    assert [(v.qualified_name, r) for v, r in e.rejected] == [
        ("triton.small", "n=10 > 8"), ("torch.reference", "triton.any comes first")]
    text = str(e)
    assert "chosen: triton.any" in text and "not triton.small: n=10 > 8" in text
    assert "fallback" in registry.explain(fake_op, 11).note


def test_duplicate_and_unknown(fake_op):
    with pytest.raises(ValueError, match="already registered"):
        registry.register(Variant(fake_op, "torch", "reference", lambda p: None, lambda p: None))
    with pytest.raises(KeyError, match="unknown op"):
        registry.explain("no_such_op")
    with pytest.raises(KeyError, match="unknown op"):
        registry.variants("no_such_op")
