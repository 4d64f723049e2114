"""The emulator's simdgroup_matrix model on its own: loads and stores (device and threadgroup
memory, stride, origin, transpose), multiply(-accumulate) with mixed element types, filled and
diagonal matrices, the thread_elements() lane layout, and the errors for divergent lanes.

Every kernel result is compared with the same computation done in plain torch loops/indexing.
"""
import pytest
import torch

pytestmark = pytest.mark.usefixtures("emulate")

SOURCE = r"""
#include <metal_stdlib>
using namespace metal;

// out (8x8, packed) = the 8x8 window of x at (row0, col0) (or its transpose), stride ld,
// loaded as T from device memory and stored back to float.
#define LOAD_DEVICE(T)                                                                          \
[[kernel]] void load_device_##T(device const T* x [[buffer(0)]], device float* out [[buffer(1)]], \
                                constant long& ld [[buffer(2)]], constant long& row0 [[buffer(3)]], \
                                constant long& col0 [[buffer(4)]], constant long& tr [[buffer(5)]], \
                                uint lane [[thread_index_in_simdgroup]]) {                        \
  simdgroup_matrix<T, 8, 8> m;                                                                  \
  simdgroup_load(m, x, ulong(ld), ulong2(ulong(col0), ulong(row0)), tr != 0);                   \
  simdgroup_store(m, out, 8);                                                                   \
}
LOAD_DEVICE(float)
LOAD_DEVICE(half)
#if __METAL_VERSION__ >= 310
LOAD_DEVICE(bfloat)
#endif

// Through threadgroup memory: x (8x8) staged by the lanes, loaded, stored transposed into
// threadgroup memory at an origin, then copied out (16x16, zero elsewhere).
[[kernel]] void via_threadgroup(device const float* x [[buffer(0)]], device float* out [[buffer(1)]],
                                uint lane [[thread_index_in_simdgroup]]) {
  threadgroup float a[64];
  threadgroup float b[16 * 16];
  for (uint i = lane; i < 64; i += 32) a[i] = x[i];
  for (uint i = lane; i < 256; i += 32) b[i] = 0.0f;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  simdgroup_float8x8 m;
  simdgroup_load(m, a);
  simdgroup_store(m, b, 16, ulong2(5, 3), true);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  for (uint i = lane; i < 256; i += 32) out[i] = b[i];
}

// d = a * b + c and e = a * b, a and b as TI, c/d/e float; two simdgroups (one each).
#define MMA(TI)                                                                                  \
[[kernel]] void mma_##TI(device const TI* a [[buffer(0)]], device const TI* b [[buffer(1)]],     \
                         device const float* c [[buffer(2)]], device float* d [[buffer(3)]],      \
                         uint sg [[simdgroup_index_in_threadgroup]]) {                            \
  simdgroup_matrix<TI, 8, 8> ma, mb;                                                             \
  simdgroup_float8x8 mc, md;                                                                      \
  simdgroup_load(ma, a + sg * 64);                                                               \
  simdgroup_load(mb, b + sg * 64);                                                               \
  simdgroup_load(mc, c + sg * 64);                                                               \
  simdgroup_multiply_accumulate(md, ma, mb, mc);                                                 \
  simdgroup_store(md, d + sg * 128);                                                             \
  simdgroup_multiply(md, ma, mb);                                                                \
  simdgroup_store(md, d + sg * 128 + 64);                                                        \
}
MMA(float)
MMA(half)
#if __METAL_VERSION__ >= 310
MMA(bfloat)
#endif

// In place: acc = acc * b + acc (the destination aliases an operand).
[[kernel]] void mma_alias(device const float* a [[buffer(0)]], device const float* b [[buffer(1)]],
                          device float* out [[buffer(2)]]) {
  simdgroup_float8x8 acc, mb;
  simdgroup_load(acc, a);
  simdgroup_load(mb, b);
  simdgroup_multiply_accumulate(acc, acc, mb, acc);
  simdgroup_store(acc, out);
}

// make_filled_simdgroup_matrix and the diagonal constructor.
[[kernel]] void filled(device float* out [[buffer(0)]], constant float& v [[buffer(1)]]) {
  simdgroup_float8x8 f = make_filled_simdgroup_matrix<float, 8, 8>(v);
  simdgroup_store(f, out);
  simdgroup_half8x8 d = simdgroup_half8x8(half(v));
  simdgroup_store(d, out + 64);
}

// Each lane writes 1000 + 2 * lane and 1001 + 2 * lane into its own elements, then the matrix
// is stored: the picture of the lane layout.  A second matrix is loaded and each lane reads its
// elements back.
[[kernel]] void lane_layout(device const float* x [[buffer(0)]], device float* out [[buffer(1)]],
                            device float* mine [[buffer(2)]], uint lane [[thread_index_in_simdgroup]]) {
  simdgroup_float8x8 m = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
  m.thread_elements()[0] = 1000.0f + 2.0f * float(lane);
  m.thread_elements()[1] = 1001.0f + 2.0f * float(lane);
  simdgroup_store(m, out);
  simdgroup_float8x8 l;
  simdgroup_load(l, x);
  mine[2 * lane] = l.thread_elements()[0];
  mine[2 * lane + 1] = l.thread_elements()[1];
}

// Lane 31 skips the load: the emulator must report it.
[[kernel]] void divergent_load(device const float* x [[buffer(0)]], device float* out [[buffer(1)]],
                               uint lane [[thread_index_in_simdgroup]]) {
  simdgroup_float8x8 m = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
  if (lane < 31) {
    simdgroup_load(m, x);
  }
  simdgroup_store(m, out);
}

// Lane 0 passes a different pointer.
[[kernel]] void nonuniform_load(device const float* x [[buffer(0)]], device float* out [[buffer(1)]],
                                uint lane [[thread_index_in_simdgroup]]) {
  simdgroup_float8x8 m;
  simdgroup_load(m, x + (lane == 0 ? 1 : 0));
  simdgroup_store(m, out);
}

// A multiply some lanes reach at a different call site.
[[kernel]] void divergent_mma(device const float* x [[buffer(0)]], device float* out [[buffer(1)]],
                              uint lane [[thread_index_in_simdgroup]]) {
  simdgroup_float8x8 a, r;
  simdgroup_load(a, x);
  if (lane < 16) {
    simdgroup_multiply(r, a, a);
  } else {
    simdgroup_multiply(r, a, a);
  }
  simdgroup_store(r, out);
}
"""

TYPES = {"float": torch.float32, "half": torch.float16, "bfloat": torch.bfloat16}


@pytest.fixture(scope="module")
def lib():
    import metal_emu
    return metal_emu.compile_shader(SOURCE, "simdgroup_matrix_test.metal")


def _rand(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype)


@pytest.mark.parametrize("tname", list(TYPES))
@pytest.mark.parametrize("transpose", [False, True])
def test_load_from_device_with_stride_origin_transpose(lib, tname, transpose):
    x = _rand(13, 21, dtype=TYPES[tname], seed=1)
    out = torch.full((8, 8), float("nan"))
    row0, col0 = 3, 7
    getattr(lib, f"load_device_{tname}")(x, out, 21, row0, col0, int(transpose), threads=32, group_size=32)
    flat = x.reshape(-1).float()
    base = row0 * 21 + col0
    want = torch.empty(8, 8)
    for r in range(8):
        for c in range(8):
            want[r, c] = flat[base + (c * 21 + r if transpose else r * 21 + c)]
    assert torch.equal(out, want)


def test_store_transposed_into_threadgroup_memory_at_an_origin(lib):
    x = _rand(8, 8, seed=2)
    out = torch.full((16, 16), float("nan"))
    lib.via_threadgroup(x, out, threads=32, group_size=32)
    want = torch.zeros(16, 16).reshape(-1)
    base = 3 * 16 + 5
    for r in range(8):
        for c in range(8):
            want[base + c * 16 + r] = x[r, c]
    assert torch.equal(out.reshape(-1), want)


@pytest.mark.parametrize("tname", list(TYPES))
def test_multiply_accumulate_against_loops(lib, tname):
    dt = TYPES[tname]
    a, b = _rand(2, 8, 8, dtype=dt, seed=3), _rand(2, 8, 8, dtype=dt, seed=4)
    c = _rand(2, 8, 8, seed=5)
    d = torch.full((2, 2, 8, 8), float("nan"))
    getattr(lib, f"mma_{tname}")(a, b, c, d, threads=64, group_size=64)
    for s in range(2):
        prod = torch.zeros(8, 8, dtype=torch.float64)
        for r in range(8):
            for col in range(8):
                prod[r, col] = sum(float(a[s, r, k]) * float(b[s, k, col]) for k in range(8))
        torch.testing.assert_close(d[s, 0].double(), prod + c[s].double(), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(d[s, 1].double(), prod, rtol=1e-5, atol=1e-5)


def test_destination_may_alias_an_operand(lib):
    a, b = _rand(8, 8, seed=6), _rand(8, 8, seed=7)
    out = torch.full((8, 8), float("nan"))
    lib.mma_alias(a, b, out, threads=32, group_size=32)
    torch.testing.assert_close(out, a @ b + a, rtol=1e-5, atol=1e-5)


def test_filled_and_diagonal(lib):
    out = torch.full((2, 8, 8), float("nan"))
    lib.filled(out, 2.5, threads=32, group_size=32)
    assert torch.equal(out[0], torch.full((8, 8), 2.5))
    assert torch.equal(out[1], torch.eye(8) * 2.5)


def owner_of(r: int, c: int) -> tuple[int, int]:
    """(lane, slot) holding element (r, c) in the documented model layout."""
    for lane in range(32):
        q = lane // 4
        row = (q & 4) + (lane // 2) % 4
        col = (q & 2) * 2 + (lane % 2) * 2
        if row == r and col <= c <= col + 1:
            return lane, c - col
    raise AssertionError((r, c))


def test_thread_elements_follow_the_lane_layout(lib):
    x = _rand(8, 8, seed=8)
    out = torch.full((8, 8), float("nan"))
    mine = torch.full((64,), float("nan"))
    lib.lane_layout(x, out, mine, threads=32, group_size=32)
    for r in range(8):
        for c in range(8):
            lane, slot = owner_of(r, c)
            assert out[r, c] == 1000 + 2 * lane + slot
            assert mine[2 * lane + slot] == x[r, c]
    # every element has exactly one owner
    assert sorted(owner_of(r, c) for r in range(8) for c in range(8)) == [(l, s) for l in range(32) for s in (0, 1)]


@pytest.mark.parametrize("kernel, message", [
    ("divergent_load", "only 31 of 32 lanes"),
    ("nonuniform_load", "different pointers"),
    ("divergent_mma", "only 16 of 32 lanes"),
])
def test_divergent_or_nonuniform_lanes_are_reported(lib, kernel, message):
    import metal_emu
    x = _rand(16, 16, seed=9)
    out = torch.zeros(8, 8)
    with pytest.raises(metal_emu.EmulatorError, match=message):
        getattr(lib, kernel)(x, out, threads=32, group_size=32)


def test_a_simdgroup_of_fewer_than_32_lanes_is_reported(lib):
    import metal_emu
    x = _rand(8, 8, seed=10)
    out = torch.zeros(8, 8)
    with pytest.raises(metal_emu.EmulatorError, match="only 16 of 32 lanes"):
        lib.via_threadgroup(x, out, threads=16, group_size=16)
