"""runtime.cuda_launch (experimental, off by default): the parameters packed for cuLaunchKernel
are the kernel's non-constexpr arguments in order, then two NULL scratch pointers."""
import ctypes
import gc
import threading
from types import SimpleNamespace

from opforge.runtime import cuda_launch


def _compiled(signature, **md):
    meta = dict(num_warps=4, shared=1024, global_scratch_size=0, profile_scratch_size=0, num_ctas=1,
                launch_cooperative_grid=False, launch_pdl=False, cluster_dims=(1, 1, 1))
    meta.update(md)
    return SimpleNamespace(function=0xF00, metadata=SimpleNamespace(**meta), src=SimpleNamespace(signature=signature))


SIG = {"x": "*bf16", "y": "*bf16", "rows": "i32", "one": "constexpr", "eps": "fp32", "big": "i64", "BLOCK": "constexpr"}


def _decode(params, types):
    out = []
    for k, ty in enumerate(types):
        out.append(ctypes.cast(params[k], ctypes.POINTER(ty)).contents.value)
    return out


def test_packs_the_non_constexpr_arguments_then_two_null_scratch_pointers():
    calls = []

    def fake(function, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        types = [ctypes.c_uint64, ctypes.c_uint64, ctypes.c_int32, ctypes.c_float, ctypes.c_int64,
                 ctypes.c_uint64, ctypes.c_uint64]
        calls.append(((function, gx, gy, gz, bx, by, bz, shared, stream, extra), _decode(params, types)))
        return 0

    go = cuda_launch.launcher_for(_compiled(SIG), launch=fake)
    gc.collect()  # the packed parameters must outlive launcher_for's locals
    go(12, 0x5, (0x1000, 0x2000, 77, 1, 0.25, 2**40, 256))
    go(12, 0x6, (0x3000, 0x4000, 77, 1, 1e-5, 2**40, 256))
    (head1, p1), (head2, p2) = calls
    assert head1 == (0xF00, 12, 1, 1, 128, 1, 1, 1024, 0x5, None) and head2[8] == 0x6
    assert p1 == [0x1000, 0x2000, 77, 0.25, 2**40, 0, 0]
    assert p2[:2] == [0x3000, 0x4000] and p2[2] == 77 and abs(p2[3] - 1e-5) < 1e-11 and p2[4:] == [2**40, 0, 0]


def test_declines_what_it_does_not_pack():
    fake = lambda *a: 0  # noqa: E731
    assert cuda_launch.launcher_for(_compiled(SIG, global_scratch_size=64), launch=fake) is None
    assert cuda_launch.launcher_for(_compiled(SIG, launch_pdl=True), launch=fake) is None
    assert cuda_launch.launcher_for(_compiled(SIG, num_ctas=2), launch=fake) is None
    assert cuda_launch.launcher_for(_compiled({"x": "*fp32", "flag": "i1"}), launch=fake) is None
    assert cuda_launch.launcher_for(None, launch=fake) is None


def test_a_failed_launch_raises():
    go = cuda_launch.launcher_for(_compiled(SIG), launch=lambda *a: 700)
    try:
        go(1, 0, (0x1000, 0x2000, 7, 1, 0.5, 3, 256))
    except RuntimeError as e:
        assert "700" in str(e)
    else:
        raise AssertionError("a failed launch must raise")


def test_threads_sharing_one_launcher_each_launch_their_own_pointers():
    seen = []

    def fake(function, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        seen.append(tuple(_decode(params, [ctypes.c_uint64, ctypes.c_uint64])))
        return 0

    go = cuda_launch.launcher_for(_compiled(SIG), launch=fake)

    def work(t):
        for i in range(500):
            p = (t << 32) | (i << 4)
            go(1, 0, (p, p + 16, 7, 1, 0.5, 3, 256))

    threads = [threading.Thread(target=work, args=(t,)) for t in range(1, 5)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert len(seen) == 2000 and all(y == x + 16 for x, y in seen)


def test_off_by_default():
    import os
    if os.environ.get("OPFORGE_CUDA_LAUNCH", "") in ("", "0"):
        assert not cuda_launch.enabled()
