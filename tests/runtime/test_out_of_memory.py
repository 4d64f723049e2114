"""Out of memory inside an opforge call: free caches, retry once, then a clear torch.OutOfMemoryError."""
import pytest
import torch

import opforge
from opforge.runtime import alloc, lru, registry
from opforge.testing import ON_GPU, rel_error

# Kernels that allocate through runtime.alloc: the Triton kernels (interpreted on CPU).
KERNEL_DEVICE = "cuda" if ON_GPU else "cpu"


def _calls():
    x = torch.randn(3, 40, device=KERNEL_DEVICE)
    r = torch.randn(3, 40, device=KERNEL_DEVICE)
    w = torch.randn(40, device=KERNEL_DEVICE)
    return [
        ("softmax", lambda: opforge.softmax(x), lambda: torch.softmax(x.double(), -1)),
        ("rms_norm", lambda: opforge.rms_norm(x, w),
         lambda: x.double() * torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-6) * w.double()),
        ("add_rms_norm", lambda: opforge.add_rms_norm(x, r, w)[1], lambda: x.double() + r.double()),
        ("gelu", lambda: opforge.gelu(x), lambda: torch.nn.functional.gelu(x.double())),
    ], (x, r, w)


@pytest.mark.parametrize("index", range(4))
def test_one_failed_allocation_is_retried_after_freeing_caches(index):
    calls, inputs = _calls()
    op, run, reference = calls[index]
    before = [t.clone() for t in inputs]
    with opforge.backend("triton"):
        run()  # warm: fills the selection cache and the interned problems
        assert len(registry._cache) > 0
        with alloc.simulate_out_of_memory(1), opforge.trace() as t:
            out = run()
    assert rel_error(out, reference()) < 1e-5
    assert [e.op for e in t] == [op]  # the retry is the one call recorded
    assert all(torch.equal(a, b) for a, b in zip(inputs, before))
    # freeing ran: the retry re-selected (one entry now), every LRU was emptied first
    assert len(registry._cache) == 1


@pytest.mark.parametrize("index", range(4))
def test_a_second_failure_raises_an_error_naming_op_shapes_and_bytes(index):
    calls, inputs = _calls()
    op, run, _ = calls[index]
    before = [t.clone() for t in inputs]
    with opforge.backend("triton"), alloc.simulate_out_of_memory(2):
        with pytest.raises(torch.OutOfMemoryError) as info:
            run()
    error = info.value
    assert isinstance(error, alloc.OutOfMemoryError)
    assert error.op == op and f"opforge.{op}" in str(error)
    assert "(3, 40)" in str(error) and "float32" in str(error)
    assert error.nbytes == 3 * 40 * 4 and "480 bytes" in str(error)
    assert all(torch.equal(a, b) for a, b in zip(inputs, before))  # inputs untouched
    with opforge.backend("triton"):
        calls[index][1]()  # and the next call works


def test_torch_message_bytes_are_parsed_when_the_allocation_was_not_ours():
    error = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has ...")
    assert alloc._requested_bytes(error) == 2 * 2**30


def test_free_caches_empties_every_lru():
    cache = lru.LRU(4, "test")
    cache.put(1, 2)
    alloc.free_caches()
    assert len(cache) == 0


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs CUDA")
def test_a_really_full_gpu_gives_opforges_error_and_recovers():
    torch.cuda.empty_cache()
    x = torch.randn(64, 4096, device="cuda", dtype=torch.float16)
    reference = torch.softmax(x.double(), -1)
    opforge.softmax(x)
    free, _ = torch.cuda.mem_get_info()
    hog = []
    try:
        chunk = 256 * 2**20
        while True:  # fill the GPU until even a small output does not fit
            try:
                hog.append(torch.empty(chunk, dtype=torch.uint8, device="cuda"))
            except torch.OutOfMemoryError:
                if chunk <= 2**16:
                    break
                chunk //= 2
        with pytest.raises(torch.OutOfMemoryError) as info:
            opforge.softmax(x)
        assert isinstance(info.value, alloc.OutOfMemoryError) and "opforge.softmax" in str(info.value)
        assert info.value.nbytes is not None and info.value.nbytes >= x.numel() * 2
    finally:
        del hog
        torch.cuda.empty_cache()
    assert rel_error(opforge.softmax(x), reference) < 2e-3


def _plan_out_of_memory(*args):
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 MiB (from a launch plan)")


@pytest.mark.usefixtures("plans_on")
def test_a_launch_plan_out_of_memory_goes_through_the_general_path():
    """A plan allocates its output itself: when that runs out of memory the call takes the general
    path, which retries after freeing and names the op (a GPU run found the plan's torch error
    escaping bare)."""
    from opforge.ops.activation.problem import PLANS as ACT_PLANS, signature as act_signature
    from opforge.ops.norm.problem import PLANS as NORM_PLANS, signature as norm_signature
    from opforge.ops.softmax.problem import PLANS as SOFTMAX_PLANS, signature as softmax_signature

    x, up, w = torch.randn(3, 40), torch.randn(3, 40), torch.randn(40)
    SOFTMAX_PLANS.offer(softmax_signature("softmax", x, -1), _plan_out_of_memory, "triton")
    NORM_PLANS.offer(norm_signature("rms_norm", x, None, w, None), _plan_out_of_memory, "triton")
    ACT_PLANS.offer(act_signature("swiglu", x, up, "none"), _plan_out_of_memory, "triton")
    try:
        assert rel_error(opforge.softmax(x), torch.softmax(x.double(), -1)) < 1e-6
        reference = x.double() * torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-6) * w.double()
        assert rel_error(opforge.rms_norm(x, w), reference) < 1e-6
        swiglu = torch.nn.functional.silu(x.double()) * up.double()
        assert rel_error(opforge.swiglu(x, up), swiglu) < 1e-6
    finally:
        for cache in (SOFTMAX_PLANS, NORM_PLANS, ACT_PLANS):
            cache.clear()
