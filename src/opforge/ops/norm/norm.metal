// norm.metal - layer_norm, rms_norm, add_layer_norm and add_rms_norm for Apple GPUs.
//
// Semantics (shared with the Triton and torch paths of opforge):
//   x, residual, y, new_residual: T in {float, half, bfloat}; weight/bias: W in {T, float}.
//   add_*: s = T(x + residual) is written to new_residual and normalized.
//   layer_norm: y = T((s - mean) * rsqrt(var + eps) * w + b), var = mean((s - mean)^2),
//               computed in two passes (mean first, then squared deviations).
//   rms_norm:   y = T(s * rsqrt(mean(s^2) + eps) * w).
//   All arithmetic is float32.  Weight and bias are optional (flags bit 0 and 1).
//
// Variants, one kernel per (op, variant, T, W), named op_variant_T_W:
//   simd   - several rows per threadgroup, one simdgroup per row, the row held in
//            registers (at most kSimdReads * 32 = 256 elements); no threadgroup memory.
//   row    - one threadgroup per row, kRowReads elements per thread in registers
//            (at most kRowReads * threads per threadgroup elements).
//   looped - one threadgroup per row, any width: three sweeps over the row.
//
// Row r of x starts at x + r * x_stride (likewise residual, and the outputs with
// y_stride), so rows with a gap between them need no copy.  Only the last
// dimension must be contiguous.
//
// Host side: src/opforge/ops/norm/metal.py.

#include <metal_stdlib>
using namespace metal;

constant constexpr uint kSimdWidth = 32;
constant constexpr int kSimdReads = 8;  // elements per lane, simd variant
constant constexpr int kRowReads = 4;   // elements per thread, row variant

// Sum of v over the threadgroup; every thread gets the total.
// scratch holds one float per simdgroup (at most 32 simdgroups).
inline float threadgroup_sum(float v, threadgroup float* scratch, uint lane, uint sg, uint n_sg) {
  v = simd_sum(v);
  if (lane == 0) {
    scratch[sg] = v;
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  v = lane < n_sg ? scratch[lane] : 0.0f;
  v = simd_sum(v);
  // scratch is reused by the next reduction: nobody may write it before all have read it.
  threadgroup_barrier(mem_flags::mem_threadgroup);
  return v;
}

// Element i of the row being normalized, as float.  With ADD it is the sum
// x + residual rounded to T, which is also stored to the new residual.
template <typename T, bool ADD>
inline float load_elem(device const T* xr, device const T* rr, device T* ror, long i) {
  if (ADD) {
    T s = T(float(xr[i]) + float(rr[i]));
    ror[i] = s;
    return float(s);
  }
  return float(xr[i]);
}

// Element i again, in a later sweep (ADD: the rounded sum this thread stored).
template <typename T, bool ADD>
inline float reload_elem(device const T* xr, device T* ror, long i) {
  return ADD ? float(ror[i]) : float(xr[i]);
}

template <typename T, typename W>
inline T normalize_elem(float v, float mean, float rstd, device const W* w, device const W* b,
                        long i, bool has_w, bool has_b) {
  float o = (v - mean) * rstd;
  if (has_w) {
    o *= float(w[i]);
  }
  if (has_b) {
    o += float(b[i]);
  }
  return T(o);
}

#define NORM_PARAMS(T, W)                                                             \
  device const T *x [[buffer(0)]], device const T *res [[buffer(1)]],                 \
      device const W *w [[buffer(2)]], device const W *b [[buffer(3)]],               \
      device T *y [[buffer(4)]], device T *res_out [[buffer(5)]],                     \
      constant long &n_rows [[buffer(6)]], constant long &n_cols [[buffer(7)]],       \
      constant long &x_stride [[buffer(8)]], constant long &r_stride [[buffer(9)]],   \
      constant long &y_stride [[buffer(10)]], constant long &flags [[buffer(11)]],    \
      constant float &eps [[buffer(12)]]

#define NORM_HELPER_PARAMS(T, W)                                                      \
  device const T *x, device const T *res, device const W *w, device const W *b,       \
      device T *y, device T *res_out, long n, long x_stride, long r_stride,           \
      long y_stride, long flags, float eps, long row

#define NORM_FORWARD(row) \
  x, res, w, b, y, res_out, n_cols, x_stride, r_stride, y_stride, flags, eps, row

#define NORM_ROW_POINTERS                                 \
  device const T* xr = x + row * x_stride;                \
  device const T* rr = res + row * r_stride;              \
  device T* yr = y + row * y_stride;                      \
  device T* ror = res_out + row * y_stride;               \
  const bool has_w = (flags & 1) != 0;                    \
  const bool has_b = (flags & 2) != 0

// One simdgroup per row; the row lives in registers, kSimdReads per lane.
template <typename T, typename W, bool RMS, bool ADD>
inline void norm_simd(NORM_HELPER_PARAMS(T, W), uint lane) {
  NORM_ROW_POINTERS;
  float v[kSimdReads];
  float s = 0.0f;
  for (int k = 0; k < kSimdReads; ++k) {
    const long i = long(lane) + long(k) * kSimdWidth;
    v[k] = i < n ? load_elem<T, ADD>(xr, rr, ror, i) : 0.0f;
    s += v[k];
  }
  const float mean = RMS ? 0.0f : simd_sum(s) / float(n);
  float q = 0.0f;
  for (int k = 0; k < kSimdReads; ++k) {
    const long i = long(lane) + long(k) * kSimdWidth;
    const float d = i < n ? v[k] - mean : 0.0f;
    q += d * d;
  }
  const float rstd = precise::rsqrt(simd_sum(q) / float(n) + eps);
  for (int k = 0; k < kSimdReads; ++k) {
    const long i = long(lane) + long(k) * kSimdWidth;
    if (i < n) {
      yr[i] = normalize_elem<T, W>(v[k], mean, rstd, w, b, i, has_w, has_b);
    }
  }
}

// One threadgroup per row; the row lives in registers, kRowReads per thread.
template <typename T, typename W, bool RMS, bool ADD>
inline void norm_row(NORM_HELPER_PARAMS(T, W), uint tid, uint tg_size, uint lane, uint sg,
                     uint n_sg, threadgroup float* scratch) {
  NORM_ROW_POINTERS;
  float v[kRowReads];
  float s = 0.0f;
  for (int k = 0; k < kRowReads; ++k) {
    const long i = long(tid) + long(k) * tg_size;
    v[k] = i < n ? load_elem<T, ADD>(xr, rr, ror, i) : 0.0f;
    s += v[k];
  }
  const float mean = RMS ? 0.0f : threadgroup_sum(s, scratch, lane, sg, n_sg) / float(n);
  float q = 0.0f;
  for (int k = 0; k < kRowReads; ++k) {
    const long i = long(tid) + long(k) * tg_size;
    const float d = i < n ? v[k] - mean : 0.0f;
    q += d * d;
  }
  const float rstd = precise::rsqrt(threadgroup_sum(q, scratch, lane, sg, n_sg) / float(n) + eps);
  for (int k = 0; k < kRowReads; ++k) {
    const long i = long(tid) + long(k) * tg_size;
    if (i < n) {
      yr[i] = normalize_elem<T, W>(v[k], mean, rstd, w, b, i, has_w, has_b);
    }
  }
}

// One threadgroup per row of any width: sum, squared deviations, write.
// Every sweep visits the same elements per thread, so with ADD each thread
// re-reads only the rounded sums it stored itself.
template <typename T, typename W, bool RMS, bool ADD>
inline void norm_looped(NORM_HELPER_PARAMS(T, W), uint tid, uint tg_size, uint lane, uint sg,
                        uint n_sg, threadgroup float* scratch) {
  NORM_ROW_POINTERS;
  float s = 0.0f;
  float q = 0.0f;
  for (long i = tid; i < n; i += tg_size) {
    const float v = load_elem<T, ADD>(xr, rr, ror, i);
    s += v;
    q += v * v;
  }
  float mean = 0.0f;
  if (!RMS) {
    mean = threadgroup_sum(s, scratch, lane, sg, n_sg) / float(n);
    q = 0.0f;
    for (long i = tid; i < n; i += tg_size) {
      const float d = reload_elem<T, ADD>(xr, ror, i) - mean;
      q += d * d;
    }
  }
  const float rstd = precise::rsqrt(threadgroup_sum(q, scratch, lane, sg, n_sg) / float(n) + eps);
  for (long i = tid; i < n; i += tg_size) {
    yr[i] = normalize_elem<T, W>(reload_elem<T, ADD>(xr, ror, i), mean, rstd, w, b, i, has_w,
                                 has_b);
  }
}

#define NORM_KERNELS(op, RMS, ADD, T, W)                                                       \
  [[kernel]] void op##_simd_##T##_##W(                                                         \
      NORM_PARAMS(T, W), uint tg [[threadgroup_position_in_grid]],                             \
      uint lane [[thread_index_in_simdgroup]], uint sg [[simdgroup_index_in_threadgroup]],     \
      uint n_sg [[simdgroups_per_threadgroup]]) {                                              \
    const long row = long(tg) * n_sg + sg;                                                     \
    if (row < n_rows) {                                                                        \
      norm_simd<T, W, RMS, ADD>(NORM_FORWARD(row), lane);                                      \
    }                                                                                          \
  }                                                                                            \
  [[kernel]] void op##_row_##T##_##W(                                                          \
      NORM_PARAMS(T, W), uint tg [[threadgroup_position_in_grid]],                             \
      uint tid [[thread_position_in_threadgroup]], uint tg_size [[threads_per_threadgroup]],   \
      uint lane [[thread_index_in_simdgroup]], uint sg [[simdgroup_index_in_threadgroup]],     \
      uint n_sg [[simdgroups_per_threadgroup]]) {                                              \
    threadgroup float scratch[kSimdWidth];                                                     \
    if (long(tg) < n_rows) {                                                                   \
      norm_row<T, W, RMS, ADD>(NORM_FORWARD(long(tg)), tid, tg_size, lane, sg, n_sg, scratch); \
    }                                                                                          \
  }                                                                                            \
  [[kernel]] void op##_looped_##T##_##W(                                                       \
      NORM_PARAMS(T, W), uint tg [[threadgroup_position_in_grid]],                             \
      uint tid [[thread_position_in_threadgroup]], uint tg_size [[threads_per_threadgroup]],   \
      uint lane [[thread_index_in_simdgroup]], uint sg [[simdgroup_index_in_threadgroup]],     \
      uint n_sg [[simdgroups_per_threadgroup]]) {                                              \
    threadgroup float scratch[kSimdWidth];                                                     \
    if (long(tg) < n_rows) {                                                                   \
      norm_looped<T, W, RMS, ADD>(NORM_FORWARD(long(tg)), tid, tg_size, lane, sg, n_sg,        \
                                  scratch);                                                    \
    }                                                                                          \
  }

#define NORM_ALL_OPS(T, W)                          \
  NORM_KERNELS(layer_norm, false, false, T, W)      \
  NORM_KERNELS(rms_norm, true, false, T, W)         \
  NORM_KERNELS(add_layer_norm, false, true, T, W)   \
  NORM_KERNELS(add_rms_norm, true, true, T, W)

NORM_ALL_OPS(float, float)
NORM_ALL_OPS(half, half)
NORM_ALL_OPS(half, float)
#if __METAL_VERSION__ >= 310
NORM_ALL_OPS(bfloat, bfloat)
NORM_ALL_OPS(bfloat, float)
#endif
