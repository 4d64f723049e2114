"""opforge.runtime.metal.library: compiling once per process, and finding the emulator."""
from pathlib import Path

import pytest
import torch

import metal_emu
import opforge
from opforge.ops.norm import cases as norm_cases
from opforge.ops.norm import metal as norm_metal
from opforge.ops.softmax import cases as softmax_cases
from opforge.ops.softmax import metal as softmax_metal
from opforge.runtime.metal import library as metal_runtime
from opforge.testing import TOLERANCE, max_rel_error


@pytest.fixture
def no_hook():
    """Remove the conftest's emulator hook for one test, then put it back."""
    metal_runtime.set_emulator(None)
    yield
    metal_runtime.set_emulator(metal_emu.compile_shader)


def test_source_checkout_emulator_is_found_without_a_hook(no_hook, monkeypatch):
    monkeypatch.delenv("OPFORGE_METAL_EMULATOR", raising=False)
    if not metal_emu.available():
        pytest.skip("needs g++")
    assert metal_runtime.emulator_unavailable_reason() is None
    assert metal_runtime.emulator() is metal_emu.compile_shader  # the module already imported


def test_missing_emulator_is_explained(no_hook, monkeypatch, tmp_path):
    monkeypatch.setenv("OPFORGE_METAL_EMULATOR", str(tmp_path / "nowhere"))
    reason = metal_runtime.emulator_unavailable_reason()
    assert reason and "not found" in reason and "tests/metal_emu" in reason
    with pytest.raises(RuntimeError, match="not found"):
        metal_runtime.emulator()


def test_each_source_compiles_once_per_process(emulate, tmp_path, monkeypatch):
    source = tmp_path / "twice.metal"
    source.write_text("kernel void k(device float* o, uint i [[thread_position_in_grid]]) { o[i] = 5.0f; }")
    calls = []

    def counting(src, name):
        calls.append(name)
        return metal_emu.compile_shader(src, name)

    monkeypatch.setattr(metal_runtime, "_emulator", counting)
    first = metal_runtime.library(source, "cpu")
    assert metal_runtime.library(source, "cpu") is first and calls == ["twice.metal"]
    out = torch.zeros(8)
    metal_runtime.kernel(source, "k", "cpu")(out, threads=8, group_size=8)
    assert torch.equal(out, torch.full((8,), 5.0))
    with pytest.raises(RuntimeError, match="has no kernel 'missing'"):
        metal_runtime.kernel(source, "missing", "cpu")


def test_cpu_tensors_need_the_emulate_flag(monkeypatch, tmp_path):
    monkeypatch.delenv("OPFORGE_METAL_EMULATE", raising=False)
    source = tmp_path / "flag.metal"
    source.write_text("kernel void k(device float* o, uint i [[thread_position_in_grid]]) { o[i] = 1.0f; }")
    with pytest.raises(RuntimeError, match="OPFORGE_METAL_EMULATE=1"):
        metal_runtime.library(source, "cpu")


def test_a_fresh_process_finds_the_emulator_in_the_checkout(tmp_path):
    """What `opforge verify` relies on: no conftest hook, only OPFORGE_METAL_EMULATE=1."""
    import os
    import subprocess
    import sys
    if not metal_emu.available():
        pytest.skip("needs g++")
    if metal_runtime._checkout_emulator_dir() is None:
        pytest.skip("opforge is not installed from this source checkout (pip install -e)")
    script = (
        "import torch, opforge, opforge.ops.norm.metal\n"
        "x = torch.randn(3, 300)\n"
        "with opforge.backend('metal'), opforge.trace() as t:\n"
        "    y = opforge.layer_norm(x)\n"
        "ref = torch.nn.functional.layer_norm(x.double(), (300,))\n"
        "print(t[0].backend, t[0].variant, float((y.double() - ref).abs().max()))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "OPFORGE_METAL_EMULATOR"}
    env["OPFORGE_METAL_EMULATE"] = "1"
    # The child runs in tmp_path: a relative PYTHONPATH (PYTHONPATH=src) would not find opforge there,
    # so hand it the absolute folder this opforge was imported from.
    src = str(Path(opforge.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join([src] + [os.path.abspath(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    out = subprocess.run([sys.executable, "-c", script], env=env, cwd=tmp_path, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    backend, variant, err = out.stdout.split()
    assert (backend, variant) == ("metal", "row") and float(err) < 1e-5


@pytest.mark.parametrize("module, cases, calls", [
    (norm_metal, norm_cases, [("layer_norm", (150, 64), torch.float32), ("add_rms_norm", (20, 1000), torch.float16)]),
    (softmax_metal, softmax_cases, [("softmax", (150, 64), torch.float32), ("log_softmax", (20, 1000), torch.float16)]),
])
def test_launches_are_split_into_row_chunks(emulate, monkeypatch, module, cases, calls):
    monkeypatch.setattr(module, "MAX_THREADS_PER_LAUNCH", 2048)
    launches = []
    real_kernel = metal_runtime.kernel

    def counting_kernel(*args):
        fn = real_kernel(*args)

        def call(*a, **kw):
            launches.append(a[-1])  # row_base
            return fn(*a, **kw)
        return call

    monkeypatch.setattr(metal_runtime, "kernel", counting_kernel)
    # multirow: 8 groups of 8 rows per launch; then row: 256 threads, 8 rows per launch
    for op, shape, dtype in calls:
        case = cases.make_case(op, shape, dtype)
        args, kwargs = case.make("cpu")
        with opforge.backend("metal"):
            out = case.call(*args, **kwargs)
        assert max_rel_error(out, case.oracle(args, kwargs)) <= TOLERANCE[dtype]
    assert launches == [0, 64, 128, 0, 8, 16]
