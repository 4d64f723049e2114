"""device_info and its cached bandwidth, trace formatting, the launcher's specialization key."""
import json
import threading
import time

import pytest
import torch

import opforge
from opforge.runtime import device
from opforge.runtime.triton import launch


def test_bandwidth_is_measured_once_then_read_from_disk(tmp_path, monkeypatch):
    monkeypatch.setenv("OPFORGE_CACHE_DIR", str(tmp_path))
    calls = []
    monkeypatch.setattr(device, "measure_copy_bandwidth", lambda dev: calls.append(dev) or 123.0)
    info = device.DeviceInfo(kind="cpu", name="test-cpu", device="cpu", driver="d1")
    assert info.copy_bandwidth_gbs == 123.0
    again = device.DeviceInfo(kind="cpu", name="test-cpu", device="cpu", driver="d1")
    assert again.copy_bandwidth_gbs == 123.0 and len(calls) == 1
    table = json.loads((tmp_path / "device_bandwidth.json").read_text())
    assert table == {"test-cpu|d1": 123.0}
    other_driver = device.DeviceInfo(kind="cpu", name="test-cpu", device="cpu", driver="d2")
    assert other_driver.copy_bandwidth_gbs == 123.0 and len(calls) == 2


def test_measure_copy_bandwidth_cpu_is_positive():
    assert device.measure_copy_bandwidth("cpu", nbytes=1 << 20, repeats=3) > 0


def test_device_info_default_and_str():
    info = opforge.device_info()
    assert info.kind in ("cuda", "rocm", "mps", "cpu")
    assert info.name in str(info)


@pytest.mark.skipif(torch.cuda.is_available(), reason="asks for CUDA where there is none")
def test_cuda_without_cuda_is_a_clear_error():
    """``device_info("cuda")``/``device_config("cuda")`` on a machine without CUDA: opforge's
    ValueError, not torch's AssertionError from current_device()."""
    for ask in (lambda: opforge.device_info("cuda"), lambda: opforge.device_config("cuda")):
        with pytest.raises(ValueError, match="device cuda does not exist here"):
            ask()


def test_trace_timing_fields():
    with opforge.trace(timing=True) as t:
        opforge.layer_norm(torch.randn(2, 32))
    e = t[0]
    assert e.gpu_ms is None if e.device == "cpu" else e.gpu_ms > 0
    assert "gpu time" in str(t)


def test_nested_traces_both_record():
    with opforge.trace() as outer:
        with opforge.trace() as inner:
            opforge.rms_norm(torch.randn(2, 8))
        opforge.rms_norm(torch.randn(2, 8))
    assert len(inner) == 1 and len(outer) == 2


class FakeParam:
    def __init__(self, constexpr, do_not_specialize=False):
        self.is_constexpr = constexpr
        self.do_not_specialize = do_not_specialize


class FakeKernel:
    params = [FakeParam(False), FakeParam(False), FakeParam(False), FakeParam(True)]


class FakeKernelWithUnspecializedInt:
    params = [FakeParam(False), FakeParam(False, do_not_specialize=True), FakeParam(True)]


def test_generic_key_follows_triton_specialization():
    launcher = launch.TritonLauncher(FakeKernel())
    launcher.interpreted = False
    base = torch.zeros(64)
    k = lambda t, n, eps, block: launcher._key((t, n, eps, block), 4, 2)  # noqa: E731
    assert k(base, 32, 1e-5, 128) == k(base, 48, 1e-6, 128)       # both divisible by 16, eps not keyed
    assert k(base, 32, 1e-5, 128) != k(base, 33, 1e-5, 128)       # divisibility
    assert k(base, 33, 1e-5, 128) != k(base, 1, 1e-5, 128)        # ==1 is its own specialization
    assert k(base, 32, 1e-5, 128) != k(base, 2**40, 1e-5, 128)    # int64 arguments
    assert k(base, 32, 1e-5, 128) != k(base[1:], 32, 1e-5, 128)   # pointer alignment
    assert k(base, 32, 1e-5, 128) != k(base.half(), 32, 1e-5, 128)  # dtype
    assert k(base, 32, 1e-5, 128) != k(base, 32, 1e-5, 256)       # constexpr by value


def test_generic_key_ignores_what_triton_does_not_specialize():
    """do_not_specialize integers keep only their type (a GPU run with keys checked found the norm
    kernels' ``rows`` keyed by divisibility, which Triton ignores there)."""
    launcher = launch.TritonLauncher(FakeKernelWithUnspecializedInt())
    base = torch.zeros(64)
    k = lambda t, rows: launcher._key((t, rows, 128), 4, 2)  # noqa: E731
    assert k(base, 64) == k(base, 7) == k(base, 1)
    assert k(base, 64) != k(base, 2**40)  # int32 or int64 is still Triton's choice


def test_generic_key_reads_tensor_subclasses_as_tensors():
    """An nn.Parameter argument is keyed by dtype and alignment like any tensor, never by itself
    (a key holding the tensor kept it alive, and comparing two keys raised)."""
    launcher = launch.TritonLauncher(FakeKernel())
    w = torch.nn.Parameter(torch.zeros(64))
    key = launcher._key((w, 32, 1e-5, 128), 4, 2)
    assert key == launcher._key((torch.zeros(64), 32, 1e-5, 128), 4, 2)
    assert not any(isinstance(part, torch.Tensor) for part in key)


class FakeTritonPath:
    """A kernel whose ``kernel[grid](...)`` (Triton's own path) records how many threads are inside
    it at once; what it returns has no binary pieces, so every call takes that path again."""
    params = [FakeParam(False), FakeParam(False), FakeParam(True)]

    def __init__(self):
        self.inside, self.most, self.calls = 0, 0, 0
        self.lock = threading.Lock()

    def __getitem__(self, grid):
        def run(*args, **options):
            with self.lock:
                self.inside += 1
                self.most = max(self.most, self.inside)
                self.calls += 1
            time.sleep(0.0005)
            with self.lock:
                self.inside -= 1
            return object()
        return run


def test_calls_through_tritons_path_from_many_threads_run_one_at_a_time():
    """First calls (which compile) and calls without a direct launch go through Triton's path, which
    is not thread-safe (an H100 run had a launcher called with another kernel's arguments): eight
    threads' calls there run one at a time, and none is lost."""
    kernel = FakeTritonPath()
    launcher = launch.TritonLauncher(kernel)
    launcher.interpreted = False
    start = threading.Barrier(8)

    def worker(index):
        start.wait()
        for k in range(20):
            launcher._launch((1,), (torch.zeros(16), 16 + 16 * (k % 3), 128 + index % 2), 4, 2, None)

    pool = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    assert kernel.calls == 160 and kernel.most == 1


def test_hook_chains():
    class Chain:
        def __init__(self, calls):
            self.calls = calls
    assert not launch._hook_active(None)
    assert not launch._hook_active(Chain([]))
    assert launch._hook_active(Chain([print]))
    assert launch._hook_active(print)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="direct launches need a compiled kernel (GPU)")
def test_norm_launches_take_the_direct_path_on_gpu():
    """Without launch plans (which call the binary themselves) a repeated call reaches the
    launcher's direct path."""
    from opforge.ops.norm import triton_kernels
    from opforge.runtime import plans
    x = torch.randn(8, 768, device="cuda", dtype=torch.bfloat16)
    previous = plans.set_enabled(False)
    try:
        for _ in range(3):
            opforge.layer_norm(x)
    finally:
        plans.set_enabled(previous)
    assert triton_kernels._tile.fast_path
