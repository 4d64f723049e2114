"""The README's Python examples run as written on this machine (CPU, CUDA or MPS), in order."""
from __future__ import annotations

import contextlib
import io
import os
import re

import torch

import opforge

README = os.path.join(os.path.dirname(__file__), "..", "..", "README.md")


def python_blocks() -> list[str]:
    """The README's fenced ```python blocks, in order."""
    with open(README) as f:
        return re.findall(r"```python\n(.*?)```", f.read(), flags=re.S)


def test_readme_examples_run_and_agree_with_float64():
    blocks = python_blocks()
    assert len(blocks) >= 8
    namespace: dict = {}
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        for block in blocks:
            exec(compile(block, README, "exec"), namespace)
    ns = namespace
    x, w = ns["x"], ns["w"]
    ref = torch.nn.functional.rms_norm(x.double(), (1024,), w.double(), eps=1e-6)
    assert (ns["norm"](x).double() - ref).abs().max() < 1e-4
    assert "rms_norm" in printed.getvalue()
    assert len(ns["tokens"]) == 2 and all(len(t) == 8 for t in ns["tokens"])
    solo = [opforge.generate(ns["model"], p, 8)[0] for p in ([1, 2, 3], [4, 5, 6, 7])]
    assert [list(o.token_ids) for o in ns["outs"]] == solo and ns["outs"][0].finish_reason == "length"
    assert torch.equal(ns["back"][:, :35], ns["codes"][:, :35])
    assert (ns["back"][:, -15:, -1] == 1025).all()
    dense = torch.nn.functional.linear(x.double(), ns["qw"].dequantize().double())
    assert (ns["y"].double() - dense).abs().max() < 1e-3 * dense.abs().max()


def test_readme_cli_smoke_test_lines_name_real_commands():
    with open(README) as f:
        text = f.read()
    assert "python -m opforge.models.testing /tmp/tiny" in text
    assert "opforge generate /tmp/tiny --prompt-ids 1,2,3" in text


def test_readme_tables_marked_generated_equal_the_results_they_name():
    from opforge.bench.results import RunResult
    from opforge.bench.tables import table

    with open(README) as f:
        text = f.read()
    marked = re.findall(r"<!-- table: (\S+) (\S+) (\S+) -->\n((?:\|.*\|\n)+)", text)
    assert len(marked) >= 2
    results = os.path.join(os.path.dirname(README), "benchmarks", "results")
    for path, suite, dtype, printed in marked:
        run = RunResult.load_json(os.path.join(results, path))
        assert printed.strip() == table(run, suite, dtype), (path, suite, dtype)
