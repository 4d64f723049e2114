"""Long runs stay bounded; many threads at once give correct results."""
import gc
import threading
import sys

import pytest
import torch

from opforge.runtime import lru, registry
from opforge.testing import ON_GPU, TOLERANCE, rel_error

import soak_workload as workload



def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def _shapes(count: int, offset: int):
    """``count`` distinct small (rows, n) shapes; different offsets give disjoint sets."""
    return [(1 + (offset + i) % 3, 8 + (offset + i) // 3) for i in range(count)]


@pytest.fixture(autouse=True)
def _one_cpu_thread():
    """Tiny CPU ops on a shared, loaded machine: intra-op threads only add spinning."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _soak(calls: int, shapes: list, device: str, dtype: torch.dtype):
    generator = torch.Generator().manual_seed(len(shapes))
    names = workload.NAMES
    for i in range(calls):
        rows, n = shapes[i % len(shapes)]
        name = names[(i // len(shapes) + i) % len(names)]
        args = workload.inputs(rows, n, device, dtype, generator)
        out = workload.run(name, args)
        if i % 997 == 0:  # spot-check values as we go
            for o, r in zip(workload.as_tuple(out), workload.as_tuple(workload.reference(name, args))):
                assert rel_error(o, r) < TOLERANCE[dtype] * 10, (name, rows, n)


def _measure():
    gc.collect()
    return sys.getallocatedblocks(), _rss_bytes()


@pytest.mark.parametrize("calls, distinct", [(21_000, 2_100)])
def test_soak_on_the_torch_path_keeps_host_memory_bounded(calls, distinct):
    """Three thirds of the calls, each over new shapes: by the end of the second third every cache
    is full, so with every cache bounded the third ends where the second did (an unbounded cache
    would keep growing by a third)."""
    third = distinct // 3
    _soak(calls // 3, _shapes(third, 0), "cpu", torch.float32)
    _soak(calls // 3, _shapes(third, third), "cpu", torch.float32)
    blocks_start, rss_start = _measure()
    entries_start = sum(len(c) for c in list(lru._all))
    _soak(calls // 3, _shapes(third, 2 * third), "cpu", torch.float32)
    blocks_end, rss_end = _measure()
    entries_end = sum(len(c) for c in list(lru._all))
    assert entries_end <= sum(c.maxsize for c in list(lru._all))
    assert blocks_end <= blocks_start * 1.05, (blocks_start, blocks_end, entries_start, entries_end)
    assert rss_end <= rss_start * 1.05, (rss_start, rss_end)


def test_caches_evict_and_calls_stay_correct_when_full(monkeypatch):
    from opforge.ops.norm import problem as norm_problem
    from opforge.ops.softmax import problem as softmax_problem
    monkeypatch.setattr(registry, "_cache", lru.LRU(32, "small selection"))
    monkeypatch.setattr(norm_problem, "_problems", lru.LRU(16, "small norm problems"))
    monkeypatch.setattr(softmax_problem, "_problems", lru.LRU(16, "small softmax problems"))
    _soak(1_000, _shapes(300, 50_000), "cpu", torch.float32)  # asserts values every 997 calls
    assert len(registry._cache) == 32
    assert len(norm_problem._problems) == 16 and len(softmax_problem._problems) == 16
    generator = torch.Generator().manual_seed(1)
    for name in workload.NAMES:  # every op still right after all that eviction
        args = workload.inputs(3, 40, "cpu", torch.float32, generator)
        for o, r in zip(workload.as_tuple(workload.run(name, args)),
                        workload.as_tuple(workload.reference(name, args))):
            assert rel_error(o, r) < 1e-5, name


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs CUDA")
def test_soak_100k_calls_on_the_gpu_keeps_host_and_gpu_memory_bounded():
    half = 1_500
    _soak(2_000, _shapes(200, 100_000), "cuda", torch.float16)
    torch.cuda.synchronize()
    _soak(50_000, _shapes(half, 0), "cuda", torch.float16)
    torch.cuda.synchronize()
    gc.collect()
    rss_start, gpu_start = _rss_bytes(), torch.cuda.memory_allocated()
    reserved_start = torch.cuda.memory_reserved()
    _soak(50_000, _shapes(half, half + 10), "cuda", torch.float16)
    torch.cuda.synchronize()
    gc.collect()
    assert _rss_bytes() <= rss_start * 1.05
    assert torch.cuda.memory_allocated() <= gpu_start * 1.05 + 2**20
    assert torch.cuda.memory_reserved() <= reserved_start * 1.05 + 2 * 2**20


def _threads(device: str, dtype: torch.dtype, threads: int = 8, rounds: int = 40):
    errors = []
    start = threading.Barrier(threads)

    def worker(index: int):
        generator = torch.Generator().manual_seed(index)
        try:
            start.wait()
            for k in range(rounds):
                for name in workload.NAMES:
                    rows, n = 1 + (index + k) % 5, 16 + 8 * index + k  # each thread its own shapes
                    args = workload.inputs(rows, n, device, dtype, generator)
                    out = workload.run(name, args)
                    for o, r in zip(workload.as_tuple(out), workload.as_tuple(workload.reference(name, args))):
                        err = rel_error(o, r)
                        if not err < TOLERANCE[dtype] * 10:
                            errors.append((index, name, rows, n, err))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append((index, repr(e)))

    pool = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    assert errors == []


def test_eight_threads_calling_every_op_at_once_on_cpu():
    small = lru.LRU(8, "tiny")  # eviction under contention too
    original = registry._cache
    registry._cache = small
    try:
        _threads("cpu", torch.float32)
    finally:
        registry._cache = original


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_eight_threads_calling_every_op_at_once_on_the_gpu(dtype):
    _threads("cuda", dtype, rounds=60)


def test_lru_is_consistent_under_concurrent_puts_and_gets():
    cache = lru.LRU(64, "stress")
    errors = []

    def worker(index: int):
        try:
            for i in range(5_000):
                key = (index * 7 + i) % 300
                cache.put(key, key * 2)
                value = cache.get((key + 3) % 300)
                if value is not None and value != ((key + 3) % 300) * 2:
                    errors.append(value)
                cache.get_or_build(i % 100, lambda: (i % 100) * 2)
        except BaseException as e:  # noqa: BLE001
            errors.append(repr(e))

    pool = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    assert errors == [] and len(cache) <= 64


def test_delay_and_fusion_caches_are_bounded(monkeypatch):
    """Distinct delay patterns and codebook counts, and distinct traced signatures of one fused
    function, fill LRUs of fixed size instead of growing without end; results stay right."""
    import opforge
    from opforge.fusion import fuse
    from opforge.ops.delay import problem as delay_problem
    monkeypatch.setattr(delay_problem, "_device_delays", lru.LRU(4, "small delays"))
    monkeypatch.setattr(delay_problem, "_problems", lru.LRU(2, "small delay problems"))
    for c in range(1, 9):
        codes = torch.randint(0, 100, (1, 12, c))
        delays = list(range(c))
        out = opforge.apply_delay(codes, delays, bos_id=101, pad_id=102)
        want = torch.full_like(codes, 101)          # codebook j shifted right by j, BOS before it
        for j in range(c):
            want[:, j:, j] = codes[:, :12 - j, j]
        assert torch.equal(out, want)
    assert len(delay_problem._device_delays) == 4 and len(delay_problem._problems) == 2
    scale = fuse(lambda x, k: x * k)
    for k in range(1, 1500):           # a Python int argument: one trace per distinct value
        assert scale(torch.ones(2), k)[0].item() == k
    assert len(scale._traces) <= scale._traces.maxsize == 1024
    assert len(scale._kernels) <= scale._kernels.maxsize
