"""rotary_embedding (inplace), kv_cache_append and rotary_kv_cache_append refuse outputs that
overlap themselves or share memory with another argument, with ``AliasedOutputError`` naming
them, before anything is written, on every backend, also after a valid call of the same shapes
(whose signature skips the shape checks); caches interleaved in one buffer stay accepted."""
import pytest
import torch

import opforge
from opforge.ops.rotary import reference
from opforge.runtime.overlap import AliasedOutputError
from opforge.testing import DEVICE, rel_error

BACKENDS = ("torch", "triton")
ANGLES = torch.arange(16.0)[:, None] * torch.tensor([1.0, 0.1, 0.01, 0.001])


@pytest.fixture(autouse=True)
def _on_device(request):
    """New tensors on the tests' device (the Metal emulator's on the CPU)."""
    with torch.device("cpu" if "emulate" in request.fixturenames else DEVICE):
        yield


def _tables():
    return ANGLES.cos().to(torch.get_default_device()), ANGLES.sin().to(torch.get_default_device())


def _caches(b=2, h=1, s_max=6, d=8):
    return torch.randn(b, h, s_max, d), torch.randn(b, h, s_max, d)


def _new(b=2, h=1, s=1, d=8):
    return torch.randn(b, h, s, d), torch.randn(b, h, s, d)


def _lens():
    return torch.tensor([0, 3], dtype=torch.int32)


def _refused(fn, *untouched, match):
    before = [t.clone() for t in untouched]
    with pytest.raises(AliasedOutputError, match=match):
        fn()
    assert all(torch.equal(t, b) for t, b in zip(untouched, before)), "written before the refusal"


def _append_cases():
    k, v = _new()
    kc, vc = _caches()
    shared = torch.randn(1, 1, 6, 8)
    yield "stride-0 k_cache", (shared.expand(2, 1, 6, 8), vc, k, v), (shared, vc), "k_cache overlaps itself"
    yield "v_cache is k_cache", (kc, kc, k, v), (kc,), "v_cache is k_cache"
    yield "k_cache is k", (kc, vc, kc[:, :, :1], v), (kc, vc), "k_cache shares memory with k"


def _run_on(backend, fn):
    with opforge.backend(backend):
        return fn()


def _check_append(backend):
    for name, (kc, vc, k, v), untouched, match in _append_cases():
        _refused(lambda: _run_on(backend, lambda: opforge.kv_cache_append(kc, vc, k, v, _lens())), *untouched,
                 match=match)


def _check_rotary(backend):
    q0, k0 = torch.randn(1, 1, 3, 8), torch.randn(1, 1, 3, 8)
    q, k = torch.randn(1, 2, 3, 8), torch.randn(1, 2, 3, 8)
    pos = torch.arange(3)

    def run(q, k):
        return _run_on(backend, lambda: opforge.rotary_embedding(q, k, *_tables(), pos, inplace=True))

    _refused(lambda: run(q0.expand(1, 2, 3, 8), k), q0, k, match="q overlaps itself")
    _refused(lambda: run(q, k0.expand(1, 2, 3, 8)), q, k0, match="k overlaps itself")
    _refused(lambda: run(q, q), q, match="k is q")


def _check_fused(backend):
    q = torch.randn(2, 2, 1, 8)
    k, v = _new()
    kc, vc = _caches()

    def run(q, kc, vc, inplace):
        return _run_on(backend, lambda: opforge.rotary_kv_cache_append(q, k, v, kc, vc, _lens(), *_tables(),
                                                                       inplace=inplace))

    _refused(lambda: run(q, kc, kc, False), q, kc, match="v_cache is k_cache")
    q_in_cache = kc[:, 0, :2].unsqueeze(2)          # (2, 2, 1, 8) inside k_cache
    _refused(lambda: run(q_in_cache, kc, vc, True), kc, vc, match="q shares memory with k_cache")


@pytest.mark.parametrize("backend", BACKENDS)
def test_kv_cache_append_refuses_aliased_caches(backend):
    _check_append(backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_rotary_inplace_refuses_overlapping_outputs(backend):
    _check_rotary(backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_rotary_kv_cache_append_refuses_aliased_outputs(backend):
    _check_fused(backend)


@pytest.mark.emulator
def test_refused_on_metal(emulate):
    _check_append("metal")
    _check_rotary("metal")
    _check_fused("metal")


@pytest.mark.parametrize("backend", BACKENDS)
def test_aliasing_refused_after_a_valid_call_of_the_same_signature(backend):
    kc, vc = _caches()
    k, v = _new()
    with opforge.backend(backend):
        opforge.kv_cache_append(kc, vc, k, v, _lens())
        other = torch.randn(2, 1, 6, 8)
        _refused(lambda: opforge.kv_cache_append(other, other, k, v, _lens()), other, match="v_cache is k_cache")


@pytest.mark.parametrize("backend", BACKENDS)
def test_caches_interleaved_in_one_buffer_are_accepted(backend):
    """k and v caches as the two halves of one (B, H, S_max, 2, D) buffer share no element."""
    buf = torch.zeros(2, 1, 6, 2, 8)
    kc, vc = buf[:, :, :, 0], buf[:, :, :, 1]
    k, v = _new()
    want_k, want_v = kc.clone(), vc.clone()
    reference.kv_cache_append(want_k, want_v, k, v, _lens())
    with opforge.backend(backend):
        opforge.kv_cache_append(kc, vc, k, v, _lens())
    assert rel_error(kc, want_k) == 0 and rel_error(vc, want_v) == 0
