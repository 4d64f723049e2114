"""Benchmarks that prove the speed: harness, suites, timing and reports.

Run it as ``opforge bench`` (or ``python -m opforge.bench``); from Python::

    from opforge.bench.cli import main
    main(["--suite", "llm", "--json", "llm.json"])

Add an op to the benchmarks with :func:`~opforge.bench.spec.register_op` and put it in
a suite with ``get_suite("llm").add(SuiteEntry(...))``.
"""

from opforge.bench.spec import (
    Absent,
    BuildContext,
    OpSpec,
    Suite,
    SuiteEntry,
    Target,
    get_op,
    get_suite,
    op_names,
    register_op,
    register_suite,
    suite_names,
)

__all__ = [
    "Absent",
    "BuildContext",
    "OpSpec",
    "Suite",
    "SuiteEntry",
    "Target",
    "get_op",
    "get_suite",
    "op_names",
    "register_op",
    "register_suite",
    "suite_names",
]
