"""Benchmarks that prove the speed: harness, suites, timing and reports.

Run it as ``opforge bench`` (or ``python -m opforge.bench``); from Python::

    from opforge.bench.cli import main
    main(["--suite", "llm", "--json", "llm.json"])

An op family adds its benchmark ops and suites in ``opforge/ops/<family>/bench.py`` with
:func:`~opforge.bench.spec.register_op` and :func:`~opforge.bench.spec.register_suite`;
:mod:`opforge.bench.catalog` lists every op and suite.
"""

from opforge.bench.spec import (
    Absent,
    BuildContext,
    OpSpec,
    Suite,
    SuiteEntry,
    Target,
    register_op,
    register_suite,
)

__all__ = [
    "Absent",
    "BuildContext",
    "OpSpec",
    "Suite",
    "SuiteEntry",
    "Target",
    "register_op",
    "register_suite",
]
