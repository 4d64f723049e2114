// quant.metal - linear layers with a quantized weight (int4 / int8), for Apple GPUs.
//
// Semantics (shared with the Triton and torch paths of opforge):
//   out (M, N) = x (M, K) @ W^T (+ bias), W[n, k] = (code[n, k] - zero[g, n]) * scale[g, n] with
//   g = k / group.  T in {float, half, bfloat} for x, bias and out; accumulation in float32.
//   x rows are strided (stride_xm elements), the last dimension contiguous; out is packed (M, N).
//
// Weight storage (see src/opforge/ops/quant/__init__.py), read here as 32-bit words w:
//   int4: row n holds K/8 words, code 8j+i of the row in bits 4i..4i+3 of word j.
//   int8: row n holds K bytes = K/4 little-endian words, code 4j+i in bits 8i..8i+7 of word j.
//   scales s and zeros z: float32, transposed (K/group, N), so s[g * N + n].  Symmetric weights
//   bind no zeros (the launcher passes the scales in their place) and use 2**(BITS-1).
//   The launcher guarantees K % 8 == 0 (int4) or K % 4 == 0 (int8), so a word never straddles
//   the end of a row or a group (groups are powers of two >= 16, or K).
//
// Kernels, per T (1-D grids):
//   quant_qmv_T_intB_vV  - decode (M <= 16): one simdgroup per kQmvFeatures output features,
//       kQmvSimdgroups simdgroups per threadgroup.  Lane l reads chunks l, l + 32, ... of V
//       consecutive words of each feature's row (one 16-byte load for V = 4), unpacks the codes
//       in registers as (code - zero), and accumulates scale * sum_k x[m, k] (code - zero) in
//       float32 for all M rows; simd_sum reduces across the lanes.  V = 4 needs the group to be
//       a multiple of a chunk (32 int4 / 16 int8 codes), else V = 1.  With S > 1 K splits
//       (threadgroup index = split * feature groups + feature group) each split covers
//       split_chunks chunks and writes float32 partials part[(split * M + m) * N + n] ...
//   quant_combine_T      - ... which one thread per output element adds in split order, + bias.
//   quant_qmm_T_intB     - prefill (any M; used for M > 16): one threadgroup of 4 simdgroups per
//       (32 rows of x, 32 features).  Per K tile of 32 the threadgroup stages x (as float) and
//       the dequantized weight tile (float32, zero past K / N) in threadgroup memory; each
//       simdgroup owns a 16x16 block of the output as 2x2 simdgroup 8x8 float accumulators.
//
// Host side: src/opforge/ops/quant/metal.py.

#include <metal_stdlib>
using namespace metal;

constant constexpr int kMaxM = 16;          // qmv: rows of x per launch
constant constexpr int kQmvFeatures = 4;    // qmv: output features per simdgroup
constant constexpr int kQmvSimdgroups = 2;  // qmv: simdgroups per threadgroup
constant constexpr int kTile = 32;          // qmm: rows, features and K per tile
constant constexpr int kQmmThreads = 128;   // qmm: 4 simdgroups

struct QuantShape {
  long m, n, k, sxm, group, symmetric, has_bias, row_words;
  long splits, split_chunks;  // qmv: K splits, and chunks of K per split
};

inline QuantShape read_shape(constant long* s) {
  const QuantShape p = {s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7], s[8], s[9]};
  return p;
}

// ---------------------------------------------------------------------------
// Decode.

template <typename T, int BITS, int VW>
inline void quant_qmv(device const T* x, device const uint* w, device const float* s, device const float* z,
                      device const T* bias, device T* out, device float* part, thread const QuantShape& p,
                      uint tg, uint sg, uint lane) {
  constexpr int kPerWord = 32 / BITS;
  constexpr int kChunk = VW * kPerWord;
  constexpr uint kMask = (1u << BITS) - 1u;
  const float sym_zero = float(1 << (BITS - 1));
  const long n_groups = (p.n + kQmvSimdgroups * kQmvFeatures - 1) / (kQmvSimdgroups * kQmvFeatures);
  const long split = long(tg) / n_groups;
  const long n0 = (long(tg) % n_groups * kQmvSimdgroups + long(sg)) * kQmvFeatures;

  float acc[kMaxM][kQmvFeatures];
  for (int mi = 0; mi < kMaxM; ++mi) {
    for (int r = 0; r < kQmvFeatures; ++r) {
      acc[mi][r] = 0.0f;
    }
  }

  const long c_begin = split * p.split_chunks;
  const long chunks = p.k / kChunk;
  const long c_end = c_begin + p.split_chunks < chunks ? c_begin + p.split_chunks : chunks;  // no long min()
  for (long c = c_begin + lane; c < c_end; c += 32) {
    const long k0 = c * kChunk;
    const long g = k0 / p.group;
    for (int r = 0; r < kQmvFeatures; ++r) {
      const long nr = n0 + r;
      if (nr >= p.n) {
        break;
      }
      device const uint* wp = w + nr * p.row_words + k0 / kPerWord;
      uint words[VW];
      if (VW == 4) {
        const uint4 v = *(device const uint4*)wp;  // 16-byte load (rows and chunks are 16-byte aligned)
        words[0] = v[0];
        words[1 % VW] = v[1];
        words[2 % VW] = v[2];
        words[3 % VW] = v[3];
      } else {
        for (int j = 0; j < VW; ++j) {
          words[j] = wp[j];
        }
      }
      const float sc = s[g * p.n + nr];
      const float zr = p.symmetric ? sym_zero : z[g * p.n + nr];
      float wc[kChunk];
      for (int j = 0; j < VW; ++j) {
        for (int i = 0; i < kPerWord; ++i) {
          wc[j * kPerWord + i] = float((words[j] >> (BITS * i)) & kMask) - zr;  // exact in float32
        }
      }
      for (int mi = 0; mi < kMaxM; ++mi) {
        if (mi < p.m) {
          device const T* xr = x + mi * p.sxm + k0;
          float dot = 0.0f;
          for (int i = 0; i < kChunk; ++i) {
            dot += float(xr[i]) * wc[i];
          }
          acc[mi][r] += sc * dot;
        }
      }
    }
  }

  for (int mi = 0; mi < kMaxM; ++mi) {
    if (mi < p.m) {
      for (int r = 0; r < kQmvFeatures; ++r) {
        const float v = simd_sum(acc[mi][r]);
        const long nr = n0 + r;
        if (lane == uint(r) && nr < p.n) {
          if (p.splits == 1) {
            out[mi * p.n + nr] = T(v + (p.has_bias ? float(bias[nr]) : 0.0f));
          } else {
            part[(split * p.m + mi) * p.n + nr] = v;
          }
        }
      }
    }
  }
}

// The K splits of qmv: out[m, n] = sum of the partials in split order (+ bias), one thread each.
template <typename T>
inline void quant_combine(device const float* part, device const T* bias, device T* out,
                          thread const QuantShape& p, uint gid) {
  const long i = long(gid);
  if (i >= p.m * p.n) {
    return;
  }
  float v = 0.0f;
  for (long sp = 0; sp < p.splits; ++sp) {
    v += part[sp * p.m * p.n + i];
  }
  out[i] = T(v + (p.has_bias ? float(bias[i % p.n]) : 0.0f));
}

// ---------------------------------------------------------------------------
// Prefill.

template <typename T, int BITS>
inline void quant_qmm(device const T* x, device const uint* w, device const float* s, device const float* z,
                      device const T* bias, device T* out, thread const QuantShape& p, uint tg, uint sg,
                      uint tid, threadgroup float* xs, threadgroup float* ws, threadgroup float* cs) {
  constexpr int kPerWord = 32 / BITS;
  constexpr int kTileWords = kTile / kPerWord;  // words of one weight row in a K tile
  constexpr uint kMask = (1u << BITS) - 1u;
  const float sym_zero = float(1 << (BITS - 1));
  const long n_tiles = (p.n + kTile - 1) / kTile;
  const long m0 = long(tg) / n_tiles * kTile;
  const long n0 = long(tg) % n_tiles * kTile;
  const int sm = int(sg / 2) * 16;  // this simdgroup's 16x16 block of the output tile
  const int sn = int(sg % 2) * 16;

  simdgroup_float8x8 acc[2][2];
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 2; ++j) {
      acc[i][j] = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
    }
  }

  for (long k0 = 0; k0 < p.k; k0 += kTile) {
    threadgroup_barrier(mem_flags::mem_threadgroup);  // every simdgroup is done with the last tile
    for (int i = int(tid); i < kTile * kTile; i += kQmmThreads) {
      const long r = i / kTile, c = i % kTile;
      xs[i] = (m0 + r < p.m && k0 + c < p.k) ? float(x[(m0 + r) * p.sxm + k0 + c]) : 0.0f;
    }
    for (int i = int(tid); i < kTile * kTileWords; i += kQmmThreads) {
      const long r = i / kTileWords, j = i % kTileWords;
      const long nr = n0 + r, kk = k0 + j * kPerWord;
      threadgroup float* dst = ws + r * kTile + j * kPerWord;
      if (nr < p.n && kk < p.k) {
        const uint word = w[nr * p.row_words + kk / kPerWord];
        const long g = kk / p.group;
        const float sc = s[g * p.n + nr];
        const float zr = p.symmetric ? sym_zero : z[g * p.n + nr];
        for (int e = 0; e < kPerWord; ++e) {
          dst[e] = (float((word >> (BITS * e)) & kMask) - zr) * sc;
        }
      } else {
        for (int e = 0; e < kPerWord; ++e) {
          dst[e] = 0.0f;
        }
      }
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);

    for (int kk = 0; kk < kTile; kk += 8) {
      simdgroup_float8x8 a[2];
      simdgroup_float8x8 b[2];
      for (int i = 0; i < 2; ++i) {
        simdgroup_load(a[i], xs + (sm + 8 * i) * kTile + kk, kTile);
        simdgroup_load(b[i], ws + (sn + 8 * i) * kTile + kk, kTile, ulong2(0, 0), true);  // W^T
      }
      for (int i = 0; i < 2; ++i) {
        for (int j = 0; j < 2; ++j) {
          simdgroup_multiply_accumulate(acc[i][j], a[i], b[j], acc[i][j]);
        }
      }
    }
  }

  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 2; ++j) {
      simdgroup_store(acc[i][j], cs + (sm + 8 * i) * kTile + sn + 8 * j, kTile);
    }
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  for (int i = int(tid); i < kTile * kTile; i += kQmmThreads) {
    const long r = i / kTile, c = i % kTile;
    if (m0 + r < p.m && n0 + c < p.n) {
      out[(m0 + r) * p.n + n0 + c] = T(cs[i] + (p.has_bias ? float(bias[n0 + c]) : 0.0f));
    }
  }
}

// ---------------------------------------------------------------------------
// Kernels.

#define QUANT_QMV_KERNEL(T, BITS, VW)                                                                  \
  [[kernel]] void quant_qmv_##T##_int##BITS##_v##VW(                                                   \
      device const T *x [[buffer(0)]], device const uint *w [[buffer(1)]],                             \
      device const float *s [[buffer(2)]], device const float *z [[buffer(3)]],                        \
      device const T *bias [[buffer(4)]], device T *out [[buffer(5)]], constant long *shape [[buffer(6)]], \
      device float *part [[buffer(7)]], uint tg [[threadgroup_position_in_grid]],                      \
      uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]) {           \
    const QuantShape p = read_shape(shape);                                                            \
    quant_qmv<T, BITS, VW>(x, w, s, z, bias, out, part, p, tg, sg, lane);                              \
  }

#define QUANT_COMBINE_KERNEL(T)                                                                        \
  [[kernel]] void quant_combine_##T(                                                                   \
      device const float *part [[buffer(0)]], device const T *bias [[buffer(1)]],                      \
      device T *out [[buffer(2)]], constant long *shape [[buffer(3)]],                                 \
      uint gid [[thread_position_in_grid]]) {                                                          \
    const QuantShape p = read_shape(shape);                                                            \
    quant_combine<T>(part, bias, out, p, gid);                                                         \
  }

#define QUANT_QMM_KERNEL(T, BITS)                                                                      \
  [[kernel]] void quant_qmm_##T##_int##BITS(                                                           \
      device const T *x [[buffer(0)]], device const uint *w [[buffer(1)]],                             \
      device const float *s [[buffer(2)]], device const float *z [[buffer(3)]],                        \
      device const T *bias [[buffer(4)]], device T *out [[buffer(5)]], constant long *shape [[buffer(6)]], \
      uint tg [[threadgroup_position_in_grid]], uint sg [[simdgroup_index_in_threadgroup]],            \
      uint tid [[thread_index_in_threadgroup]]) {                                                      \
    threadgroup float xs[kTile * kTile];                                                               \
    threadgroup float ws[kTile * kTile];                                                               \
    threadgroup float cs[kTile * kTile];                                                               \
    const QuantShape p = read_shape(shape);                                                            \
    quant_qmm<T, BITS>(x, w, s, z, bias, out, p, tg, sg, tid, xs, ws, cs);                             \
  }

#define QUANT_KERNELS(T)      \
  QUANT_QMV_KERNEL(T, 4, 1)   \
  QUANT_QMV_KERNEL(T, 4, 4)   \
  QUANT_QMV_KERNEL(T, 8, 1)   \
  QUANT_QMV_KERNEL(T, 8, 4)   \
  QUANT_QMM_KERNEL(T, 4)      \
  QUANT_QMM_KERNEL(T, 8)      \
  QUANT_COMBINE_KERNEL(T)

QUANT_KERNELS(float)
QUANT_KERNELS(half)
#if __METAL_VERSION__ >= 310
QUANT_KERNELS(bfloat)
#endif
