"""The MSL emulator itself: calling convention, simdgroup and threadgroup semantics, types, and
the bugs it must report (a skipped barrier, a write past a buffer, threadgroup memory read before
it is written)."""
import pytest
import torch

pytestmark = pytest.mark.usefixtures("emulate")

SOURCE = r"""
#include <metal_stdlib>
using namespace metal;

kernel void fill(device float* out, constant float& val, uint i [[thread_position_in_grid]]) {
  out[i] = val;
}

// What each simd collective returns to each lane: 10 floats per lane.
[[kernel]] void simd_ops(device const float* x [[buffer(0)]], device float* out [[buffer(1)]],
                         uint i [[thread_position_in_grid]], uint lane [[thread_index_in_simdgroup]]) {
  const float v = x[i];
  device float* o = out + i * 10;
  o[0] = simd_sum(v);
  o[1] = simd_max(v);
  o[2] = simd_min(v);
  o[3] = simd_prefix_inclusive_sum(v);
  o[4] = simd_prefix_exclusive_sum(v);
  o[5] = simd_shuffle_down(v, 3);
  o[6] = simd_shuffle_up(v, 5);
  o[7] = simd_shuffle_xor(v, 9);
  o[8] = simd_broadcast(v, 7);
  o[9] = simd_shuffle(v, 31 - lane);
}

// Only lanes below `active` take part: the sum covers exactly those lanes.
[[kernel]] void divergent_sum(device const float* x [[buffer(0)]], device float* out [[buffer(1)]],
                              constant long& active [[buffer(2)]],
                              uint i [[thread_position_in_grid]], uint lane [[thread_index_in_simdgroup]]) {
  float r = -1.0f;
  if (long(lane) < active) {
    r = simd_sum(x[i]);
  }
  out[i] = r;
}

// A threadgroup reduction (simd_sum, threadgroup memory, a barrier).
[[kernel]] void group_sum(device const float* x [[buffer(0)]], device float* out [[buffer(1)]],
                          uint g [[threadgroup_position_in_grid]], uint t [[thread_position_in_threadgroup]],
                          uint n [[threads_per_threadgroup]], uint lane [[thread_index_in_simdgroup]],
                          uint sg [[simdgroup_index_in_threadgroup]], uint nsg [[simdgroups_per_threadgroup]]) {
  threadgroup float partial[32];
  float v = simd_sum(x[g * n + t]);
  if (lane == 0) { partial[sg] = v; }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  v = lane < nsg ? partial[lane] : 0.0f;
  v = simd_sum(v);
  if (t == 0) { out[g] = v; }
}

// Reads threadgroup memory nobody wrote: the emulator's poison (NaN) must show.
[[kernel]] void read_unwritten(device float* out [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  threadgroup float scratch[64];
  out[i] = scratch[i % 64];
}

// Thread 0 returns early and the others wait at a barrier: undefined on a GPU, an error here.
[[kernel]] void skipped_barrier(device float* out [[buffer(0)]], uint i [[thread_position_in_grid]]) {
  if (i == 0) { return; }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  out[i] = 1.0f;
}

[[kernel]] void write_past_end(device float* out [[buffer(0)]], constant long& n [[buffer(1)]],
                               uint i [[thread_position_in_grid]]) {
  out[i + 1] = 2.0f;   // the last thread writes out[n]
}

[[kernel]] void copy_with_offset(device const float* x [[buffer(0)]], device float* out [[buffer(1)]],
                                 uint i [[thread_position_in_grid]]) {
  out[i] = x[i];
}

// Python ints arrive as 64-bit integers, floats as 32-bit floats.
[[kernel]] void scalars(device long* out [[buffer(0)]], constant long& big [[buffer(1)]],
                        constant float& f [[buffer(2)]], constant int& small [[buffer(3)]],
                        uint i [[thread_position_in_grid]]) {
  out[0] = big + 1;
  out[1] = long(f * 4.0f);
  out[2] = small;
}

// A 2-D grid with ragged edge threadgroups.
[[kernel]] void grid2d(device uint* out [[buffer(0)]], constant long& width [[buffer(1)]],
                       uint2 pos [[thread_position_in_grid]], uint2 tpg [[threads_per_threadgroup]],
                       uint2 tg [[threadgroup_position_in_grid]]) {
  out[pos.y * width + pos.x] = pos.x + 1000 * pos.y + 1000000 * (tpg.x * tpg.y);
}

// Rounding: float to half and to bfloat, and arithmetic in vector types.
[[kernel]] void to_half(device const float* x [[buffer(0)]], device half* out [[buffer(1)]],
                        uint i [[thread_position_in_grid]]) {
  out[i] = half(x[i]);
}
#if __METAL_VERSION__ >= 310
[[kernel]] void to_bfloat(device const float* x [[buffer(0)]], device bfloat* out [[buffer(1)]],
                          uint i [[thread_position_in_grid]]) {
  out[i] = bfloat(x[i]);
}
#endif
[[kernel]] void vec_math(device const float4* x [[buffer(0)]], device float4* out [[buffer(1)]],
                         uint i [[thread_position_in_grid]]) {
  float4 v = x[i];
  out[i] = v * 2.0f + float4(1.0f, 2.0f, 3.0f, 4.0f) - sqrt(abs(v) * 0.0f + 4.0f);
}
"""


@pytest.fixture(scope="module")
def lib():
    import metal_emu
    return metal_emu.compile_shader(SOURCE, "emulator_test.metal")


def test_fill_like_the_torch_docs_example(lib):
    x = torch.zeros(16)
    lib.fill(x, 3.14)
    assert torch.equal(x, torch.full((16,), 3.14))


def test_simd_collectives_match_their_definitions(lib):
    x = torch.randn(64)
    out = torch.full((64, 10), float("nan"))
    lib.simd_ops(x, out, threads=64, group_size=64)
    for g in range(2):
        v = x[32 * g: 32 * (g + 1)].double()
        o = out[32 * g: 32 * (g + 1)].double()
        lanes = torch.arange(32)
        assert torch.allclose(o[:, 0], v.sum().expand(32), atol=1e-5)
        assert torch.equal(o[:, 1], v.max().expand(32))
        assert torch.equal(o[:, 2], v.min().expand(32))
        assert torch.allclose(o[:, 3], v.cumsum(0), atol=1e-5)
        assert torch.allclose(o[:, 4], v.cumsum(0) - v, atol=1e-5)
        assert torch.equal(o[:, 5], torch.where(lanes + 3 < 32, v[(lanes + 3) % 32], v))
        assert torch.equal(o[:, 6], torch.where(lanes >= 5, v[(lanes - 5) % 32], v))
        assert torch.equal(o[:, 7], v[lanes ^ 9])
        assert torch.equal(o[:, 8], v[7].expand(32))
        assert torch.equal(o[:, 9], v.flip(0))


@pytest.mark.parametrize("active", [1, 20, 31, 32])
def test_simd_sum_covers_only_the_active_lanes(lib, active):
    x = torch.rand(32) + 0.5
    out = torch.full((32,), float("nan"))
    lib.divergent_sum(x, out, active, threads=32, group_size=32)
    expected = x[:active].double().sum().item()
    assert torch.allclose(out[:active].double(), torch.full((active,), expected, dtype=torch.float64), rtol=1e-6)
    assert torch.equal(out[active:], torch.full((32 - active,), -1.0))


@pytest.mark.parametrize("order", ["forward", "reverse"])
@pytest.mark.parametrize("group", [32, 96, 1024])
def test_threadgroup_reduction_with_barrier(lib, order, group):
    import metal_emu
    groups = 3
    x = torch.randn(groups * group)
    out = torch.full((groups,), float("nan"))
    with metal_emu.schedule(order):
        lib.group_sum(x, out, threads=groups * group, group_size=group)
    assert torch.allclose(out.double(), x.view(groups, group).double().sum(1), atol=1e-4)


def test_threadgroup_memory_starts_poisoned(lib):
    out = torch.zeros(128)
    lib.read_unwritten(out, threads=128, group_size=64)
    assert torch.isnan(out).all()


def test_barrier_skipped_by_some_threads_is_an_error(lib):
    import metal_emu
    with pytest.raises(metal_emu.EmulatorError, match="returned without reaching it"):
        lib.skipped_barrier(torch.zeros(64), threads=64, group_size=64)


def test_write_past_the_end_is_an_error(lib):
    import metal_emu
    out = torch.zeros(10)
    with pytest.raises(metal_emu.EmulatorError, match=r"wrote outside the storage bound to buffer\(0\)"):
        lib.write_past_end(out, 10, threads=10, group_size=10)


def test_tensors_bind_at_their_storage_offset_and_read_past_end_is_nan(lib):
    base = torch.randn(20)
    out = torch.full((12,), 0.0)
    lib.copy_with_offset(base[10:], out, threads=12, group_size=4)
    assert torch.equal(out[:10], base[10:])
    assert torch.isnan(out[10:]).all()  # past the storage: the guard bytes


def test_aliasing_arguments_share_memory(lib):
    buf = torch.arange(16, dtype=torch.float32)
    lib.copy_with_offset(buf[8:], buf, threads=8, group_size=8)  # reads and writes one storage
    assert torch.equal(buf[:8], torch.arange(8, 16, dtype=torch.float32))


def test_scalar_widths(lib):
    out = torch.zeros(3, dtype=torch.int64)
    lib.scalars(out, 2**40, 2.25, 7, threads=1, group_size=1, arg_casts={3: "int32"})
    assert out.tolist() == [2**40 + 1, 9, 7]


def test_two_dimensional_grid_with_ragged_edges(lib):
    width, height = 13, 7
    out = torch.zeros(height, width, dtype=torch.int32)
    lib.grid2d(out, width, threads=(width, height), group_size=(4, 3))
    ys, xs = torch.meshgrid(torch.arange(height), torch.arange(width), indexing="ij")
    sizes = torch.minimum(4 - 0 * xs, width - xs // 4 * 4) * torch.minimum(3 - 0 * ys, height - ys // 3 * 3)
    assert torch.equal(out.long(), xs + 1000 * ys + 1000000 * sizes)


def test_half_and_bfloat_round_to_nearest_even(lib):
    ties = torch.tensor([1 + 2**-11, 1 + 3 * 2**-11, 1 + 2**-8, 1 + 3 * 2**-8, 65520.0, 1e-8])
    x = torch.cat([torch.randn(1000) * 100, ties, -ties])
    h = torch.empty(x.numel(), dtype=torch.float16)
    b = torch.empty(x.numel(), dtype=torch.bfloat16)
    lib.to_half(x, h, threads=x.numel(), group_size=64)
    lib.to_bfloat(x, b, threads=x.numel(), group_size=64)
    assert torch.equal(h.view(torch.int16), x.half().view(torch.int16))
    assert torch.equal(b.view(torch.int16), x.bfloat16().view(torch.int16))


def test_vector_types(lib):
    x = torch.randn(8, 4)
    out = torch.empty(8, 4)
    lib.vec_math(x, out, threads=8, group_size=8)
    assert torch.allclose(out, x * 2 + torch.tensor([1.0, 2, 3, 4]) - 2.0)


def test_compile_errors_are_syntax_errors_and_names_are_checked(lib):
    import metal_emu
    with pytest.raises(SyntaxError, match="broken.metal:2"):
        metal_emu.compile_shader("kernel void k(device float* o, uint i [[thread_position_in_grid]]) {\n"
                                 "  o[i] = undeclared; }", "broken.metal")
    with pytest.raises(AttributeError, match="no kernel named 'nope'"):
        lib.nope
    assert "simd_ops" in dir(lib) and lib.simd_ops.max_threads_per_threadgroup == 1024


def test_builds_are_cached_by_source_hash(lib):
    import metal_emu
    from metal_emu import _build
    first = _build.build(SOURCE, "emulator_test.metal")
    again = _build.build(SOURCE, "emulator_test.metal")
    assert first.path == again.path and first.path.exists()
    # comments vanish in preprocessing, so they do not rebuild; code changes do
    assert _build.plan(SOURCE + "\n// a comment\n", "emulator_test.metal")[2] == first.path.parent.name
    tiny = "kernel void k(device float* o, uint i [[thread_position_in_grid]]) { o[i] = %s; }"
    assert _build.plan(tiny % "1.0f")[2] != _build.plan(tiny % "2.0f")[2]
    assert metal_emu.compile_shader(SOURCE, "emulator_test.metal") is lib
