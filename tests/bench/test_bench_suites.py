"""Suites on the CPU with small shapes: the kv_append and delay entries run end to end (opforge and
the torch composite each correct against the float64 oracle, exact for the integer codes, timed,
judged by the suite's copy-bandwidth target); the quant suite's speedup targets judge the rows
they name and only those."""
from __future__ import annotations

import contextlib

import pytest
import torch

import opforge

from opforge.bench.results import OK
from opforge.bench.runner import RunOptions, Runner
from opforge.bench.spec import OPFORGE, TORCH

SMALL = {("kv_append", "kv_cache_append"): (2, 2, 3, 16, 16),
         ("kv_append", "rotary_kv_cache_append"): (2, 4, 2, 3, 16, 16),
         ("delay", "apply_delay"): (2, 40, 5), ("delay", "revert_delay"): (2, 40, 5)}


# forced Triton on CPU tensors is the interpreter, which only a machine without a GPU runs
@pytest.mark.parametrize("backend", ["default", pytest.param("triton", marks=pytest.mark.cpu_only)])
@pytest.mark.parametrize("suite_name,op", sorted(SMALL))
def test_entry_runs_correct_and_is_judged(suite_name, op, backend, tiny_timing, cpu):
    """On the CPU opforge runs its torch path by default; forced, the Triton kernels run in the
    interpreter (the GPU's kernels, called the way the suite calls them)."""
    opts = RunOptions(device=cpu, suites=[suite_name], ops=[op], shapes=[SMALL[suite_name, op]], timing=tiny_timing,
                      impls=[OPFORGE, TORCH])
    with opforge.backend(backend) if backend != "default" else contextlib.nullcontext(), opforge.trace() as t:
        (suite,) = Runner(opts).run().suites
    if backend == "triton":
        assert {e.backend for e in t.events if e.op == op} == {"triton"}
    assert suite.cases
    for case in suite.cases:
        for impl in (OPFORGE, TORCH):
            r = case.results[impl]
            assert r.status == OK and r.gpu_us > 0, (case.label, impl, r.reason)
            if suite_name == "delay":
                assert r.rel_err == 0.0
    judged = [t for t in suite.targets if t.case.startswith(op + " ")]
    assert len(judged) == len(suite.cases) and all("goal" in t.detail for t in judged)


def test_kv_append_oracle_catches_a_kernel_that_writes_nothing():
    """The compared outputs are the new slots only: leaving the cache as it was is far outside
    any tolerance (comparing whole caches would dilute it to sqrt(S / S_max))."""
    from opforge.bench.catalog import get_op
    from opforge.bench.verify import compare, upcast
    op = get_op("kv_cache_append")
    inputs = op.make_inputs((2, 2, 1, 256, 16), torch.float32, torch.device("cpu"), torch.Generator().manual_seed(0))
    untouched = (inputs[0][:, :, -1:], inputs[1][:, :, -1:])
    err, problem = compare(untouched, op.reference(*upcast(inputs)), torch.float32)
    assert problem is None and err > 0.5


def test_delay_oracle_catches_a_one_step_shift():
    from opforge.bench.catalog import get_op
    from opforge.bench.verify import compare
    op = get_op("apply_delay")
    codes, delays = op.make_inputs((1, 64, 3), torch.int64, torch.device("cpu"), torch.Generator().manual_seed(0))
    wrong = op.reference(codes, delays + 1)
    err, problem = compare(wrong, op.reference(codes, delays), torch.int64)
    assert problem is None and err > 0.1


@pytest.mark.parametrize("m,judged", [(1, True), (2, False)])
def test_quant_targets_judge_the_rows_they_name(m, judged, tiny_timing, cpu):
    opts = RunOptions(device=cpu, suites=["quant"], ops=["linear_int4_g128"], shapes=[(m, 32, 256)],
                      dtypes=[torch.float32], timing=tiny_timing, impls=[OPFORGE, TORCH])
    (suite,) = Runner(opts).run().suites
    (case,) = suite.cases
    assert case.results[OPFORGE].status == OK and case.results[TORCH].status == OK
    if not judged:
        assert suite.targets == []
        return
    (t,) = suite.targets
    ratio = case.time(TORCH, "gpu_us") / case.time(OPFORGE, "gpu_us")
    assert t.detail.startswith(f"{ratio:.2f}x torch (goal 3x)") and "% of copy (goal 80%)" in t.detail
    assert t.met == (ratio >= 3.0 and case.results[OPFORGE].pct_copy >= 80.0)


def test_io_suite_loads_a_small_checkpoint_and_checks_every_tensor(tmp_path):
    """The io suite's small form on the CPU: opforge's loader in a fresh process, every tensor
    equal to the one written, a speed and a verdict reported."""
    import json

    from opforge.bench.cli import main
    j, md = tmp_path / "io.json", tmp_path / "io.md"
    assert main(["--suite", "io", "--quick", "--device", "cpu", "--impls", "opforge", "--json", str(j),
                 "--markdown", str(md)]) == 0
    result = json.loads(j.read_text())
    (row,) = result["rows"]
    assert row["impl"] == "opforge" and "error" not in row and row["gbps"] > 0 and row["rss_growth_mb"] > 0
    assert result["file_bytes"] > 1e7 and [t["target"] for t in result["targets"]] == [">= 2 GB/s"]
    assert "| opforge |" in md.read_text()


def test_io_check_catches_a_changed_tensor():
    from opforge.bench.suites import io
    spec = io.llama_like(0.06, shrink=8)[:3]
    loaded = {name: io.tensor_for(i, shape) for i, (name, shape) in enumerate(spec)}
    assert io._check(loaded, spec) is None
    loaded[spec[1][0]] = loaded[spec[1][0]].clone()
    loaded[spec[1][0]].view(-1)[7] += 1
    assert io._check(loaded, spec) == f"{spec[1][0]}: not equal to the tensor written"


def test_io_suite_refuses_an_unknown_loader(capsys):
    from opforge.bench.cli import main
    assert main(["--suite", "io", "--device", "cpu", "--impls", "mmap"]) == 2
    assert "unknown loader" in capsys.readouterr().err


def test_fusion_first_call_target_compares_first_calls(tiny_timing, cpu):
    """The fusion suite's first-call target is judged from both first calls (torch.compile on the
    CPU compiles through Inductor's C++ backend; where it cannot, the target is not judged)."""
    opts = RunOptions(device=cpu, suites=["fusion"], shapes=[(8, 64)], dtypes=[torch.float32], timing=tiny_timing,
                      impls=[OPFORGE, "torch.compile"])
    (suite,) = Runner(opts).run().suites
    (case,) = suite.cases
    mine, theirs = case.results[OPFORGE], case.results["torch.compile"]
    assert mine.status == OK and mine.first_call_s > 0
    judged = [t for t in suite.targets if t.target.startswith("first call")]
    if theirs.status != OK:
        assert judged == []
        return
    (t,) = judged
    assert t.met == (theirs.first_call_s / mine.first_call_s >= 10.0) and "goal 10x" in t.detail


@pytest.mark.parametrize("op,shape,judged", [("attention", (1, 2, 16, 16), False),
                                              ("decode_attention", (1, 4, 2, 32, 16), True)])
def test_attention_copy_target_judges_decode_only(op, shape, judged, tiny_timing, cpu):
    opts = RunOptions(device=cpu, suites=["attention"], ops=[op], timing=tiny_timing, shapes=[shape],
                      dtypes=[torch.bfloat16], impls=[OPFORGE, TORCH])
    (suite,) = Runner(opts).run().suites
    (case,) = suite.cases
    assert case.results[OPFORGE].status == OK, case.results[OPFORGE].reason
    copy = [t for t in suite.targets if "copy-bandwidth" in t.target]
    assert len(copy) == (1 if judged else 0)
