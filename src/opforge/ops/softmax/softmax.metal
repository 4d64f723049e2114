// softmax.metal - softmax and log_softmax over the last dimension, for Apple GPUs.
//
// Semantics (shared with the Triton and torch paths of opforge):
//   x, y: T in {float, half, bfloat}.  All arithmetic is float32, rounded once to T.
//   m = max of the row; softmax: y = exp(x - m) / sum(exp(x - m));
//   log_softmax: y = (x - m) - log(sum(exp(x - m))).
//   -inf entries give 0 (log_softmax: -inf); an all -inf row gives NaN, as in torch; a NaN or
//   +inf anywhere in a row makes the whole row NaN (exp(NaN) / exp(inf - inf) reach the sum).
//
// Variants, one kernel per (op, variant, T), named op_variant_T:
//   multirow - several rows per threadgroup, one simdgroup per row, the row held in
//              registers (at most kSimdReads * 32 = 256 elements); simd_max + simd_sum only.
//   row      - one threadgroup per row, kRowReads elements per thread in registers;
//              simd_max / simd_sum, then threadgroup memory across simdgroups.
//   looped   - one threadgroup per row, any width: a first sweep keeps, per thread, a running
//              maximum and a sum rescaled to it (online softmax); the threads' pairs are merged,
//              and a second sweep writes the row.
//
// Row r (r counts from row_base) of x starts at (r / x_inner) * x_so + (r % x_inner) * x_si
// elements from x: strided views run without a copy.  Only the last dimension must be
// contiguous.  The output is packed (row r at r * n_cols).
//
// Host side: src/opforge/ops/softmax/metal.py.

#include <metal_stdlib>
using namespace metal;

constant constexpr uint kSimdWidth = 32;
constant constexpr int kSimdReads = 8;  // elements per lane, multirow variant
constant constexpr int kRowReads = 4;   // elements per thread, row variant

inline float neg_inf() {
  return as_type<float>(0xff800000u);
}

// Maximum / sum of v over the threadgroup; every thread gets the result.
// scratch holds one float per simdgroup (at most 32 simdgroups).
inline float tg_max(float v, threadgroup float* scratch, uint lane, uint sg, uint n_sg) {
  v = simd_max(v);
  if (lane == 0) {
    scratch[sg] = v;
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  v = lane < n_sg ? scratch[lane] : neg_inf();
  v = simd_max(v);
  threadgroup_barrier(mem_flags::mem_threadgroup);  // scratch is reused next
  return v;
}

inline float tg_sum(float v, threadgroup float* scratch, uint lane, uint sg, uint n_sg) {
  v = simd_sum(v);
  if (lane == 0) {
    scratch[sg] = v;
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  v = lane < n_sg ? scratch[lane] : 0.0f;
  v = simd_sum(v);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  return v;
}

// The output of an element given its value v, the row max m and the sum of exponentials s
// (inv_s = 1 / s, log_s = log(s)).
template <typename T, bool LOG>
inline T finish_elem(float v, float m, float inv_s, float log_s) {
  return LOG ? T((v - m) - log_s) : T(precise::exp(v - m) * inv_s);
}

#define SOFTMAX_PARAMS(T)                                                                  \
  device const T *x [[buffer(0)]], device T *y [[buffer(1)]],                              \
      constant long &n_rows [[buffer(2)]], constant long &n_cols [[buffer(3)]],            \
      constant long &x_inner [[buffer(4)]], constant long &x_so [[buffer(5)]],             \
      constant long &x_si [[buffer(6)]], constant long &row_base [[buffer(7)]]

#define SOFTMAX_ROW_ARGS(row) \
  x + ((row) / x_inner) * x_so + ((row) % x_inner) * x_si, y + (row) * n_cols, n_cols

// One simdgroup per row; the row lives in registers, kSimdReads per lane.
template <typename T, bool LOG>
inline void softmax_multirow(device const T* xr, device T* yr, long n, uint lane) {
  float v[kSimdReads];
  float m = neg_inf();
  for (int k = 0; k < kSimdReads; ++k) {
    const long i = long(lane) + long(k) * kSimdWidth;
    v[k] = i < n ? float(xr[i]) : neg_inf();
    m = max(m, v[k]);
  }
  m = simd_max(m);
  float s = 0.0f;
  for (int k = 0; k < kSimdReads; ++k) {
    const long i = long(lane) + long(k) * kSimdWidth;
    s += i < n ? precise::exp(v[k] - m) : 0.0f;
  }
  s = simd_sum(s);
  const float inv_s = 1.0f / s;
  const float log_s = precise::log(s);
  for (int k = 0; k < kSimdReads; ++k) {
    const long i = long(lane) + long(k) * kSimdWidth;
    if (i < n) {
      yr[i] = finish_elem<T, LOG>(v[k], m, inv_s, log_s);
    }
  }
}

// One threadgroup per row; the row lives in registers, kRowReads per thread.
template <typename T, bool LOG>
inline void softmax_row(device const T* xr, device T* yr, long n, uint tid, uint tg_size, uint lane,
                        uint sg, uint n_sg, threadgroup float* scratch) {
  float v[kRowReads];
  float m = neg_inf();
  for (int k = 0; k < kRowReads; ++k) {
    const long i = long(tid) + long(k) * tg_size;
    v[k] = i < n ? float(xr[i]) : neg_inf();
    m = max(m, v[k]);
  }
  m = tg_max(m, scratch, lane, sg, n_sg);
  float s = 0.0f;
  for (int k = 0; k < kRowReads; ++k) {
    const long i = long(tid) + long(k) * tg_size;
    s += i < n ? precise::exp(v[k] - m) : 0.0f;
  }
  s = tg_sum(s, scratch, lane, sg, n_sg);
  const float inv_s = 1.0f / s;
  const float log_s = precise::log(s);
  for (int k = 0; k < kRowReads; ++k) {
    const long i = long(tid) + long(k) * tg_size;
    if (i < n) {
      yr[i] = finish_elem<T, LOG>(v[k], m, inv_s, log_s);
    }
  }
}

// One threadgroup per row of any width: an online (max, sum) sweep, then a writing sweep.
template <typename T, bool LOG>
inline void softmax_looped(device const T* xr, device T* yr, long n, uint tid, uint tg_size, uint lane,
                           uint sg, uint n_sg, threadgroup float* scratch) {
  float m = neg_inf();  // this thread's running maximum
  float s = 0.0f;       // sum of exp(x - m) over this thread's elements so far
  for (long i = tid; i < n; i += tg_size) {
    const float v = float(xr[i]);
    const float m_new = max(m, v);
    // while every value seen is -inf, m_new is -inf: rescale around 0 so that exp gives 0, not NaN
    const float base = m_new == neg_inf() ? 0.0f : m_new;
    s = s * precise::exp(m - base) + precise::exp(v - base);  // NaN or +inf make s NaN
    m = m_new;
  }
  const float row_m = tg_max(m, scratch, lane, sg, n_sg);
  // a thread that saw only -inf (or nothing) adds 0; exp(-inf - -inf) would be NaN
  const float part = m == neg_inf() ? 0.0f : s * precise::exp(m - row_m);
  const float row_s = tg_sum(part, scratch, lane, sg, n_sg);
  const float inv_s = 1.0f / row_s;
  const float log_s = precise::log(row_s);
  for (long i = tid; i < n; i += tg_size) {
    yr[i] = finish_elem<T, LOG>(float(xr[i]), row_m, inv_s, log_s);
  }
}

#define SOFTMAX_KERNELS(op, LOG, T)                                                            \
  [[kernel]] void op##_multirow_##T(                                                           \
      SOFTMAX_PARAMS(T), uint tg [[threadgroup_position_in_grid]],                             \
      uint lane [[thread_index_in_simdgroup]], uint sg [[simdgroup_index_in_threadgroup]],     \
      uint n_sg [[simdgroups_per_threadgroup]]) {                                              \
    const long row = row_base + long(tg) * n_sg + sg;                                          \
    if (row < n_rows) {                                                                        \
      softmax_multirow<T, LOG>(SOFTMAX_ROW_ARGS(row), lane);                                   \
    }                                                                                          \
  }                                                                                            \
  [[kernel]] void op##_row_##T(                                                                \
      SOFTMAX_PARAMS(T), uint tg [[threadgroup_position_in_grid]],                             \
      uint tid [[thread_position_in_threadgroup]], uint tg_size [[threads_per_threadgroup]],   \
      uint lane [[thread_index_in_simdgroup]], uint sg [[simdgroup_index_in_threadgroup]],     \
      uint n_sg [[simdgroups_per_threadgroup]]) {                                              \
    threadgroup float scratch[kSimdWidth];                                                     \
    const long row = row_base + long(tg);                                                      \
    if (row < n_rows) {                                                                        \
      softmax_row<T, LOG>(SOFTMAX_ROW_ARGS(row), tid, tg_size, lane, sg, n_sg, scratch);       \
    }                                                                                          \
  }                                                                                            \
  [[kernel]] void op##_looped_##T(                                                             \
      SOFTMAX_PARAMS(T), uint tg [[threadgroup_position_in_grid]],                             \
      uint tid [[thread_position_in_threadgroup]], uint tg_size [[threads_per_threadgroup]],   \
      uint lane [[thread_index_in_simdgroup]], uint sg [[simdgroup_index_in_threadgroup]],     \
      uint n_sg [[simdgroups_per_threadgroup]]) {                                              \
    threadgroup float scratch[kSimdWidth];                                                     \
    const long row = row_base + long(tg);                                                      \
    if (row < n_rows) {                                                                        \
      softmax_looped<T, LOG>(SOFTMAX_ROW_ARGS(row), tid, tg_size, lane, sg, n_sg, scratch);    \
    }                                                                                          \
  }

#define SOFTMAX_ALL_OPS(T)                \
  SOFTMAX_KERNELS(softmax, false, T)      \
  SOFTMAX_KERNELS(log_softmax, true, T)

SOFTMAX_ALL_OPS(float)
SOFTMAX_ALL_OPS(half)
#if __METAL_VERSION__ >= 310
SOFTMAX_ALL_OPS(bfloat)
#endif
