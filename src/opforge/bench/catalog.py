"""Every benchmark op and suite: the shared suites, then each op family's ``bench`` module.

A family registers its benchmark ops and suites the way it registers its kernel variants: in
a module of its own folder (``opforge/ops/<family>/bench.py``). Adding a family's benchmarks
means adding its module to the imports below. The model suite (``opforge bench --suite model``)
is a runner of its own, :mod:`opforge.bench.suites.model`.

Example:
    >>> from opforge.bench.catalog import get_suite, suite_names
    >>> [e.op for e in get_suite("seed").entries]
    ['layer_norm', 'rms_norm']
    >>> "softmax" in suite_names()
    True
"""

from __future__ import annotations

from opforge.bench import standard  # noqa: F401  (the shared suites, empty until the families fill them)
from opforge.bench.spec import OpSpec, Suite, registered_op, registered_op_names, registered_suite, \
    registered_suite_names
from opforge.ops.norm import bench as _norm  # noqa: F401
from opforge.ops.softmax import bench as _softmax  # noqa: F401
from opforge.ops.activation import bench as _activation  # noqa: F401
from opforge.ops.attention import bench as _attention  # noqa: F401
from opforge.ops.quant import bench as _quant  # noqa: F401
from opforge.ops.rotary import bench as _rotary  # noqa: F401
from opforge.ops.paged import bench as _paged  # noqa: F401
from opforge.ops.delay import bench as _delay  # noqa: F401
from opforge.fusion import bench as _fusion  # noqa: F401
from opforge.bench.suites import torch_path as _torch_path  # noqa: F401  (the torch path vs PyTorch, CPU)


def get_op(name: str) -> OpSpec:
    """The benchmark op called ``name``; ``KeyError`` if none."""
    return registered_op(name)


def get_suite(name: str) -> Suite:
    """The suite called ``name``; ``KeyError`` if none."""
    return registered_suite(name)


def op_names() -> list[str]:
    """Names of all benchmark ops, e.g. ``["layer_norm", "rms_norm", ...]``."""
    return registered_op_names()


def suite_names() -> list[str]:
    """Names of all suites, e.g. ``["seed", "llm", "latency", ...]``."""
    return registered_suite_names()
