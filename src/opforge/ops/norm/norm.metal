// norm.metal - layer_norm, rms_norm, add_layer_norm and add_rms_norm for Apple GPUs.
//
// Semantics (shared with the Triton and torch paths of opforge):
//   x, residual, y, new_residual: T in {float, half, bfloat}; weight and bias: W in {T, float}.
//   add_*: s = T(x + residual) is stored as new_residual, and s is what gets normalized.
//   layer_norm: y = T(((s - m0) - m1) * rsqrt(var + eps) * w + b), where m0 is the row mean,
//               m1 the mean of s - m0 (what rounding left of the mean; s - m0 is exact for
//               clustered rows such as 1e4 + randn) and var the mean of ((s - m0) - m1)^2,
//               computed as mean((s - m0)^2) - m1^2: a variance around the mean, in two
//               passes, never E[s^2] - E[s]^2.
//   rms_norm:   y = T(s * rsqrt(mean(s^2) + eps) * w).
//   All arithmetic is float32.  Weight and bias are optional (flags bits 0 and 1).
//
// Variants, one kernel per (op, variant, T, W), named op_variant_T_W:
//   multirow - several rows per threadgroup, one simdgroup per row, the row held in
//              registers (at most kSimdReads * 32 = 256 elements); no threadgroup memory.
//   row      - one threadgroup per row, kRowReads elements per thread in registers (at most
//              kRowReads * threads per threadgroup elements); simd_sum + threadgroup memory.
//   looped   - one threadgroup per row, any width: it sweeps the row three times.
//
// Row r (r counts from row_base) of x starts at (r / x_inner) * x_so + (r % x_inner) * x_si
// elements from x, likewise for the residual: strided views run without a copy.  Only the
// last dimension must be contiguous.  Outputs are packed (row r at r * n_cols).
//
// Host side: src/opforge/ops/norm/metal.py.

#include <metal_stdlib>
using namespace metal;

constant constexpr uint kSimdWidth = 32;
constant constexpr int kSimdReads = 8;  // elements per lane, multirow variant
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

// Two sums at once (a and b), sharing the barriers; scratch holds 2 * 32 floats.
inline void threadgroup_sum2(thread float& a, thread float& b, threadgroup float* scratch,
                             uint lane, uint sg, uint n_sg) {
  a = simd_sum(a);
  b = simd_sum(b);
  if (lane == 0) {
    scratch[sg] = a;
    scratch[kSimdWidth + sg] = b;
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  a = lane < n_sg ? scratch[lane] : 0.0f;
  b = lane < n_sg ? scratch[kSimdWidth + lane] : 0.0f;
  a = simd_sum(a);
  b = simd_sum(b);
  threadgroup_barrier(mem_flags::mem_threadgroup);
}

// Element i of the row, as float.  With ADD it is x + residual rounded to T, which is
// also stored as the new residual.
template <typename T, bool ADD>
inline float load_elem(device const T* xr, device const T* rr, device T* sr, long i) {
  if (ADD) {
    const T s = T(float(xr[i]) + float(rr[i]));
    sr[i] = s;
    return float(s);
  }
  return float(xr[i]);
}

// Element i again, in a later sweep (ADD: the rounded sum this same thread stored).
template <typename T, bool ADD>
inline float reload_elem(device const T* xr, device T* sr, long i) {
  return ADD ? float(sr[i]) : float(xr[i]);
}

// Statistics of a row: y = ((v - m0) - m1) * rstd, then the affine part.
struct RowStats {
  float m0;
  float m1;
  float rstd;
};

inline RowStats make_stats(float m0, float dev_sum, float sq_sum, long n, float eps) {
  RowStats st;
  st.m0 = m0;
  st.m1 = dev_sum / float(n);
  st.rstd = precise::rsqrt(max(sq_sum / float(n) - st.m1 * st.m1, 0.0f) + eps);
  return st;
}

template <typename T, typename W>
inline T normalize_elem(float v, RowStats st, device const W* w, device const W* b, long i,
                        bool has_w, bool has_b) {
  float o = ((v - st.m0) - st.m1) * st.rstd;
  if (has_w) {
    o *= float(w[i]);
  }
  if (has_b) {
    o += float(b[i]);
  }
  return T(o);
}

#define NORM_PARAMS(T, W)                                                                  \
  device const T *x [[buffer(0)]], device const T *res [[buffer(1)]],                      \
      device const W *w [[buffer(2)]], device const W *b [[buffer(3)]],                    \
      device T *y [[buffer(4)]], device T *res_out [[buffer(5)]],                          \
      constant long &n_rows [[buffer(6)]], constant long &n_cols [[buffer(7)]],            \
      constant long &x_inner [[buffer(8)]], constant long &x_so [[buffer(9)]],             \
      constant long &x_si [[buffer(10)]], constant long &r_inner [[buffer(11)]],           \
      constant long &r_so [[buffer(12)]], constant long &r_si [[buffer(13)]],              \
      constant long &flags [[buffer(14)]], constant float &eps [[buffer(15)]],             \
      constant long &row_base [[buffer(16)]]

// What every variant's row function receives: the row's pointers and the parameters.
#define NORM_ROW_PARAMS(T, W)                                                       \
  device const T *xr, device const T *rr, device const W *w, device const W *b,     \
      device T *yr, device T *sr, long n, long flags, float eps

#define NORM_ROW_ARGS(row)                                                          \
  x + ((row) / x_inner) * x_so + ((row) % x_inner) * x_si,                          \
      res + ((row) / r_inner) * r_so + ((row) % r_inner) * r_si, w, b,              \
      y + (row) * n_cols, res_out + (row) * n_cols, n_cols, flags, eps

// One simdgroup per row; the row lives in registers, kSimdReads per lane.
template <typename T, typename W, bool RMS, bool ADD>
inline void norm_multirow(NORM_ROW_PARAMS(T, W), uint lane) {
  float v[kSimdReads];
  float s = 0.0f;
  for (int k = 0; k < kSimdReads; ++k) {
    const long i = long(lane) + long(k) * kSimdWidth;
    v[k] = i < n ? load_elem<T, ADD>(xr, rr, sr, i) : 0.0f;
    s += v[k];
  }
  const float m0 = RMS ? 0.0f : simd_sum(s) / float(n);
  float a = 0.0f;
  float q = 0.0f;
  for (int k = 0; k < kSimdReads; ++k) {
    const long i = long(lane) + long(k) * kSimdWidth;
    const float d = i < n ? v[k] - m0 : 0.0f;
    a += d;
    q += d * d;
  }
  const RowStats st = make_stats(m0, RMS ? 0.0f : simd_sum(a), simd_sum(q), n, eps);
  const bool has_w = (flags & 1) != 0;
  const bool has_b = (flags & 2) != 0;
  for (int k = 0; k < kSimdReads; ++k) {
    const long i = long(lane) + long(k) * kSimdWidth;
    if (i < n) {
      yr[i] = normalize_elem<T, W>(v[k], st, w, b, i, has_w, has_b);
    }
  }
}

// One threadgroup per row; the row lives in registers, kRowReads per thread.
template <typename T, typename W, bool RMS, bool ADD>
inline void norm_row(NORM_ROW_PARAMS(T, W), uint tid, uint tg_size, uint lane, uint sg,
                     uint n_sg, threadgroup float* scratch) {
  float v[kRowReads];
  float s = 0.0f;
  for (int k = 0; k < kRowReads; ++k) {
    const long i = long(tid) + long(k) * tg_size;
    v[k] = i < n ? load_elem<T, ADD>(xr, rr, sr, i) : 0.0f;
    s += v[k];
  }
  const float m0 = RMS ? 0.0f : threadgroup_sum(s, scratch, lane, sg, n_sg) / float(n);
  float a = 0.0f;
  float q = 0.0f;
  for (int k = 0; k < kRowReads; ++k) {
    const long i = long(tid) + long(k) * tg_size;
    const float d = i < n ? v[k] - m0 : 0.0f;
    a += d;
    q += d * d;
  }
  threadgroup_sum2(a, q, scratch, lane, sg, n_sg);
  const RowStats st = make_stats(m0, RMS ? 0.0f : a, q, n, eps);
  const bool has_w = (flags & 1) != 0;
  const bool has_b = (flags & 2) != 0;
  for (int k = 0; k < kRowReads; ++k) {
    const long i = long(tid) + long(k) * tg_size;
    if (i < n) {
      yr[i] = normalize_elem<T, W>(v[k], st, w, b, i, has_w, has_b);
    }
  }
}

// One threadgroup per row of any width.  Each sweep visits the same elements per
// thread, so with ADD a thread re-reads only the rounded sums it stored itself.
template <typename T, typename W, bool RMS, bool ADD>
inline void norm_looped(NORM_ROW_PARAMS(T, W), uint tid, uint tg_size, uint lane, uint sg,
                        uint n_sg, threadgroup float* scratch) {
  float s = 0.0f;
  float q = 0.0f;
  for (long i = tid; i < n; i += tg_size) {
    const float v = load_elem<T, ADD>(xr, rr, sr, i);
    s += v;
    q += v * v;  // RMS only; layer_norm recomputes it around the mean below
  }
  float m0 = 0.0f;
  float a = 0.0f;
  if (RMS) {
    q = threadgroup_sum(q, scratch, lane, sg, n_sg);
  } else {
    m0 = threadgroup_sum(s, scratch, lane, sg, n_sg) / float(n);
    q = 0.0f;
    for (long i = tid; i < n; i += tg_size) {
      const float d = reload_elem<T, ADD>(xr, sr, i) - m0;
      a += d;
      q += d * d;
    }
    threadgroup_sum2(a, q, scratch, lane, sg, n_sg);
  }
  const RowStats st = make_stats(m0, a, q, n, eps);
  const bool has_w = (flags & 1) != 0;
  const bool has_b = (flags & 2) != 0;
  for (long i = tid; i < n; i += tg_size) {
    yr[i] = normalize_elem<T, W>(reload_elem<T, ADD>(xr, sr, i), st, w, b, i, has_w, has_b);
  }
}

#define NORM_KERNELS(op, RMS, ADD, T, W)                                                       \
  [[kernel]] void op##_multirow_##T##_##W(                                                     \
      NORM_PARAMS(T, W), uint tg [[threadgroup_position_in_grid]],                             \
      uint lane [[thread_index_in_simdgroup]], uint sg [[simdgroup_index_in_threadgroup]],     \
      uint n_sg [[simdgroups_per_threadgroup]]) {                                              \
    const long row = row_base + long(tg) * n_sg + sg;                                          \
    if (row < n_rows) {                                                                        \
      norm_multirow<T, W, RMS, ADD>(NORM_ROW_ARGS(row), lane);                                 \
    }                                                                                          \
  }                                                                                            \
  [[kernel]] void op##_row_##T##_##W(                                                          \
      NORM_PARAMS(T, W), uint tg [[threadgroup_position_in_grid]],                             \
      uint tid [[thread_position_in_threadgroup]], uint tg_size [[threads_per_threadgroup]],   \
      uint lane [[thread_index_in_simdgroup]], uint sg [[simdgroup_index_in_threadgroup]],     \
      uint n_sg [[simdgroups_per_threadgroup]]) {                                              \
    threadgroup float scratch[2 * kSimdWidth];                                                 \
    const long row = row_base + long(tg);                                                      \
    if (row < n_rows) {                                                                        \
      norm_row<T, W, RMS, ADD>(NORM_ROW_ARGS(row), tid, tg_size, lane, sg, n_sg, scratch);     \
    }                                                                                          \
  }                                                                                            \
  [[kernel]] void op##_looped_##T##_##W(                                                       \
      NORM_PARAMS(T, W), uint tg [[threadgroup_position_in_grid]],                             \
      uint tid [[thread_position_in_threadgroup]], uint tg_size [[threads_per_threadgroup]],   \
      uint lane [[thread_index_in_simdgroup]], uint sg [[simdgroup_index_in_threadgroup]],     \
      uint n_sg [[simdgroups_per_threadgroup]]) {                                              \
    threadgroup float scratch[2 * kSimdWidth];                                                 \
    const long row = row_base + long(tg);                                                      \
    if (row < n_rows) {                                                                        \
      norm_looped<T, W, RMS, ADD>(NORM_ROW_ARGS(row), tid, tg_size, lane, sg, n_sg, scratch);  \
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
