"""Every op family's problem record derives its selection key from all of its declared fields:
none overrides ``key``, each is a frozen dataclass, and a record differing in any one field has
another key (so the registry's selection cache cannot serve it the other's choice)."""
import dataclasses

import torch

import opforge  # noqa: F401  (imports every op family)
from opforge.runtime.problem import ProblemRecord


def _families():
    return {cls for cls in ProblemRecord.__subclasses__() if cls.__module__.startswith("opforge.ops.")}


def test_every_family_has_a_problem_record():
    names = {cls.__module__.split(".")[2] for cls in _families()}
    assert names >= {"activation", "attention", "delay", "norm", "quant", "rotary", "softmax"}, names


def test_no_family_overrides_the_key_and_records_are_frozen():
    for cls in _families():
        assert "key" not in vars(cls), f"{cls.__name__} defines its own key"
        assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen, cls.__name__


def _other(value):
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, str):
        return value + "_"
    if isinstance(value, torch.dtype):
        return torch.float64 if value != torch.float64 else torch.float32
    if isinstance(value, tuple):
        return value + (1,)
    return object()


def test_a_record_differing_in_any_field_has_another_key():
    samples = {
        "LinearProblem": dict(dtype=torch.float16, m=2, n=8, k=128, bits=8, group=-1, symmetric=False,
                              has_bias=False, device_type="mps"),
    }
    for cls in _families():
        fields = dataclasses.fields(cls)
        base = samples.get(cls.__name__) or {f.name: (torch.float16 if "dtype" in f.name else
                                                       "x" if f.type in ("str", str) else 1)
                                             for f in fields if f.default is dataclasses.MISSING
                                             and f.default_factory is dataclasses.MISSING}
        record = cls(**base)
        assert record.key == tuple(getattr(record, f.name) for f in fields)
        for f in fields:
            changed = dataclasses.replace(record, **{f.name: _other(getattr(record, f.name))})
            assert changed.key != record.key, f"{cls.__name__}.{f.name} is not in the key"
