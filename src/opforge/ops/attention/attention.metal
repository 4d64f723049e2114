// attention.metal - scaled dot-product attention (prefill) and decoding against a KV cache,
// for Apple GPUs.
//
// Semantics (shared with the Triton and torch paths of opforge):
//   q (B, Hq, Sq, D); k, v (B, Hkv, Sk, D) for prefill, caches (B, Hkv, S_max, D) for decode;
//   T in {float, half, bfloat}; D in {64, 80, 96, 128, 256} for prefill (one kernel per D),
//   any D <= 256 for decode; Hq a multiple of Hkv (query head h reads kv head
//   h / (Hq / Hkv)).  Scores are (q . k) * scale, softmax in float32, out = P V rounded once to T.
//   Causal masks are aligned to the end: query i sees key j iff j <= i + Sk - Sq; a row that
//   sees no key is 0.  Decode: sequence b holds len = cache_seqlens[b] keys (clamped to
//   [0, S_max]), the Sq queries are its last Sq positions, causal among themselves: query i sees
//   keys j < len - Sq + i + 1.
//   Every tensor is addressed by (batch, head, sequence) strides in elements; the last
//   dimension is contiguous.
//
// Kernels, per T (1-D grids):
//   attention_prefill_T_dD - one threadgroup of 4 simdgroups per (b, h, tile of 32 query rows),
//       8 rows per simdgroup.  Each simdgroup keeps its rows of Q (scaled) as D/8 simdgroup 8x8
//       matrices.  For each block of 8 keys (the causal loop stops at the last key the tile's
//       last row sees) the threadgroup stages K and V once (zero beyond the block's end);
//       each simdgroup computes S = Q K^T by 8x8 multiply-accumulates over D, updates its rows'
//       softmax in scalar code on 8 lanes (running max m, sum l, correction
//       alpha = exp(m_old - m_new)), and its accumulators become diag(alpha) O + P V.
//   attention_decode_T   - one threadgroup per (b, kv head, query i, KV split, chunk of up to 8 of
//       the query heads that share the kv head), one simdgroup per query head: the heads of a
//       group read the same cache rows together.  Each simdgroup stages q * scale in threadgroup
//       memory; each lane scores one key of a block of 32 (a dot product over D),
//       simd_max / simd_sum give the block's maximum and sum, and each lane accumulates the
//       dimensions lane, lane + 32, ... of P V, the block's probabilities taken from each lane
//       with simd_shuffle.  The split writes its normalised partial output and its
//       log-sum-exp (-inf if it saw no key) to float buffers.
//   attention_combine_T  - one 32-thread threadgroup per (b, h, query i): out = sum_s w_s o_s / sum_s w_s
//       with w_s = exp(lse_s - max lse); all -inf (no key seen) gives 0.
//
// Host side: src/opforge/ops/attention/metal.py.

#include <metal_stdlib>
using namespace metal;

constant constexpr int kMaxD = 256;   // largest head dimension
constant constexpr int kRows = 8;     // prefill: query rows per simdgroup
constant constexpr int kKeys = 8;     // prefill: keys per step
constant constexpr int kSimdgroups = 4;  // prefill: simdgroups per threadgroup
constant constexpr int kTileRows = kRows * kSimdgroups;  // query rows per threadgroup
constant constexpr int kPrefillThreads = 32 * kSimdgroups;
constant constexpr int kLaneDims = 8; // decode: dimensions per lane (kMaxD / 32)
constant constexpr int kDecodeHeads = 8;  // decode: at most this many query heads (simdgroups) per threadgroup

inline float neg_inf() {
  return as_type<float>(0xff800000u);
}

// Integer min / clamp on long, spelled out (not every Metal version overloads them for long).
inline long min_l(long a, long b) {
  return a < b ? a : b;
}
inline long clamp_l(long x, long lo, long hi) {
  return x < lo ? lo : (x > hi ? hi : x);
}

// ---------------------------------------------------------------------------
// Prefill.

struct PrefillShape {
  long q_heads, group, sq, sk, d, causal;
  long q_sb, q_sh, q_ss, k_sb, k_sh, k_ss, v_sb, v_sh, v_ss, o_sb, o_sh, o_ss;
};

template <typename T, int D>
inline void attention_prefill(device const T* q, device const T* k, device const T* v, device T* o,
                              thread const PrefillShape& p, float scale, uint tg, uint sg, uint lane, uint tid,
                              threadgroup float* kt, threadgroup float* vt, threadgroup float* scratch,
                              threadgroup float* corr_all, threadgroup float* row_m_all,
                              threadgroup float* row_l_all) {
  const long q_blocks = (p.sq + kTileRows - 1) / kTileRows;
  const long blk = long(tg) % q_blocks;
  const long h = (long(tg) / q_blocks) % p.q_heads;
  const long b = long(tg) / (q_blocks * p.q_heads);
  const long hk = h / p.group;
  const long q0 = blk * kTileRows + long(sg) * kRows;  // this simdgroup's first query row
  // D is a template parameter so that the loops over D / 8 unroll and the matrix arrays stay
  // in registers.
  constexpr long d = D;
  constexpr long nd = D / 8;
  const long shift = p.sk - p.sq;  // query i sees keys j <= i + shift when causal
  device const T* qp = q + b * p.q_sb + h * p.q_sh;
  device const T* kp = k + b * p.k_sb + hk * p.k_sh;
  device const T* vp = v + b * p.v_sb + hk * p.v_sh;
  device T* op = o + b * p.o_sb + h * p.o_sh;
  // This simdgroup's own threadgroup memory: an 8x8 tile (Q chunks, scores/probabilities, output
  // chunks), diag(alpha), and the running max / sum of its rows.
  threadgroup float* sp = scratch + sg * (kRows * kKeys);
  threadgroup float* corr = corr_all + sg * (kRows * kKeys);
  threadgroup float* row_m = row_m_all + sg * kRows;
  threadgroup float* row_l = row_l_all + sg * kRows;

  // Keys the tile's last row sees (the causal loop stops there).
  const long last_row = min_l(blk * kTileRows + kTileRows, p.sq) - 1;
  const long kend = p.causal ? clamp_l(last_row + shift + 1, 0, p.sk) : p.sk;

  simdgroup_float8x8 qf[nd];
  simdgroup_float8x8 acc[nd];
  for (long i = 0; i < nd; ++i) {
    for (long e = lane; e < kRows * 8; e += 32) {
      const long r = e / 8, c = e % 8;
      sp[e] = q0 + r < p.sq ? float(qp[(q0 + r) * p.q_ss + i * 8 + c]) * scale : 0.0f;
    }
    simdgroup_barrier(mem_flags::mem_threadgroup);
    simdgroup_load(qf[i], sp, 8);
    acc[i] = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
    simdgroup_barrier(mem_flags::mem_threadgroup);
  }
  if (lane < uint(kRows)) {
    row_m[lane] = neg_inf();
    row_l[lane] = 0.0f;
  }

  for (long k0 = 0; k0 < kend; k0 += kKeys) {
    threadgroup_barrier(mem_flags::mem_threadgroup);  // every simdgroup is done with the last block
    for (long i = tid; i < kKeys * d; i += kPrefillThreads) {
      const long r = i / d, c = i % d;
      const long key = k0 + r;
      kt[r * D + c] = key < kend ? float(kp[key * p.k_ss + c]) : 0.0f;
      vt[r * D + c] = key < kend ? float(vp[key * p.v_ss + c]) : 0.0f;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);

    simdgroup_float8x8 s = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
    for (long i = 0; i < nd; ++i) {
      simdgroup_float8x8 kf;  // K^T: dims i*8.. x the block's keys
      simdgroup_load(kf, kt + i * 8, D, ulong2(0, 0), true);
      simdgroup_multiply_accumulate(s, qf[i], kf, s);
    }
    simdgroup_store(s, sp, kKeys);
    simdgroup_barrier(mem_flags::mem_threadgroup);

    if (lane < uint(kRows)) {
      const long r = lane;
      const long qi = q0 + r;
      const float m_old = row_m[r];
      float m_new = m_old;
      for (long c = 0; c < kKeys; ++c) {
        const long key = k0 + c;
        const bool seen = key < p.sk && (!p.causal || key <= qi + shift);
        const float x = seen ? sp[r * kKeys + c] : neg_inf();
        sp[r * kKeys + c] = x;
        m_new = max(m_new, x);
      }
      // Nothing seen yet: keep the (zero) accumulators and probabilities at 0.
      const bool none = m_new == neg_inf();
      const float alpha = none ? 1.0f : exp(m_old - m_new);
      float sum = 0.0f;
      for (long c = 0; c < kKeys; ++c) {
        const float e = none ? 0.0f : exp(sp[r * kKeys + c] - m_new);
        sp[r * kKeys + c] = e;
        sum += e;
      }
      row_m[r] = m_new;
      row_l[r] = row_l[r] * alpha + sum;
      for (long c = 0; c < kKeys; ++c) {
        corr[r * kKeys + c] = c == r ? alpha : 0.0f;
      }
    }
    simdgroup_barrier(mem_flags::mem_threadgroup);

    simdgroup_float8x8 pf, cf;
    simdgroup_load(pf, sp, kKeys);
    simdgroup_load(cf, corr, kKeys);
    for (long i = 0; i < nd; ++i) {
      simdgroup_float8x8 vf;
      simdgroup_load(vf, vt + i * 8, D);
      simdgroup_multiply(acc[i], cf, acc[i]);
      simdgroup_multiply_accumulate(acc[i], pf, vf, acc[i]);
    }
  }

  for (long i = 0; i < nd; ++i) {
    simdgroup_barrier(mem_flags::mem_threadgroup);
    simdgroup_store(acc[i], sp, 8);
    simdgroup_barrier(mem_flags::mem_threadgroup);
    for (long e = lane; e < kRows * 8; e += 32) {
      const long r = e / 8, c = e % 8;
      if (q0 + r < p.sq) {
        const float l = row_l[r];
        op[(q0 + r) * p.o_ss + i * 8 + c] = T(l > 0.0f ? sp[e] / l : 0.0f);
      }
    }
  }
}

// ---------------------------------------------------------------------------
// Decode: split-KV partials and their combination.

struct DecodeShape {
  long q_heads, group, sq, s_max, d, n_split, chunk, heads_per_group;
  long q_sb, q_sh, q_ss, k_sb, k_sh, k_ss, v_sb, v_sh, v_ss;
};

template <typename T>
inline void attention_decode(device const T* q, device const T* k, device const T* v,
                             device const int* seqlens, device float* part_o, device float* part_lse,
                             thread const DecodeShape& p, float scale, uint tg, uint sg, uint lane,
                             threadgroup float* qs_all) {
  // Threadgroup (b, kv head, head chunk, query, split); simdgroup sg takes query head
  // hk * group + chunk * heads_per_group + sg, so the heads sharing a kv head read its cache
  // slice together (the same rows at the same time: cache hits after the first simdgroup).
  const long n_chunks = p.group / p.heads_per_group;
  long rest = long(tg);
  const long split = rest % p.n_split;
  rest /= p.n_split;
  const long qi = rest % p.sq;
  rest /= p.sq;
  const long chunk_i = rest % n_chunks;
  rest /= n_chunks;
  const long kv_heads = p.q_heads / p.group;
  const long hk = rest % kv_heads;
  const long b = rest / kv_heads;
  const long h = hk * p.group + chunk_i * p.heads_per_group + long(sg);
  const long row = (b * p.q_heads + h) * p.sq + qi;
  threadgroup float* qs = qs_all + sg * kMaxD;
  const long d = p.d;
  const long len = clamp_l(long(seqlens[b]), 0, p.s_max);
  const long visible = clamp_l(len - p.sq + qi + 1, 0, len);
  const long start = split * p.chunk;
  const long end = min_l(start + p.chunk, visible);
  device const T* qp = q + b * p.q_sb + h * p.q_sh + qi * p.q_ss;
  device const T* kp = k + b * p.k_sb + hk * p.k_sh;
  device const T* vp = v + b * p.v_sb + hk * p.v_sh;

  for (long c = lane; c < d; c += 32) {
    qs[c] = float(qp[c]) * scale;
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);

  float m = neg_inf();
  float l = 0.0f;
  float acc[kLaneDims];
  for (int i = 0; i < kLaneDims; ++i) {
    acc[i] = 0.0f;
  }
  for (long j0 = start; j0 < end; j0 += 32) {
    const long j = j0 + lane;
    float s = neg_inf();
    if (j < end) {
      device const T* kr = kp + j * p.k_ss;
      float dot = 0.0f;
      for (long c = 0; c < d; ++c) {
        dot += qs[c] * float(kr[c]);
      }
      s = dot;
    }
    const float m_new = max(m, simd_max(s));  // finite: lane 0's key is in range
    const float e = j < end ? exp(s - m_new) : 0.0f;
    const float alpha = exp(m - m_new);
    l = l * alpha + simd_sum(e);
    m = m_new;
    for (int i = 0; i < kLaneDims; ++i) {
      acc[i] *= alpha;
    }
    const long n_keys = min_l(32, end - j0);
    for (long t = 0; t < n_keys; ++t) {
      const float et = simd_shuffle(e, ushort(t));
      device const T* vr = vp + (j0 + t) * p.v_ss;
      for (int i = 0; i < kLaneDims; ++i) {
        const long c = long(lane) + 32 * i;
        if (c < d) {
          acc[i] += et * float(vr[c]);
        }
      }
    }
  }

  const long out_row = row * p.n_split + split;
  for (int i = 0; i < kLaneDims; ++i) {
    const long c = long(lane) + 32 * i;
    if (c < d) {
      part_o[out_row * d + c] = l > 0.0f ? acc[i] / l : 0.0f;
    }
  }
  if (lane == 0) {
    part_lse[out_row] = l > 0.0f ? m + log(l) : neg_inf();
  }
}

template <typename T>
inline void attention_combine(device const float* part_o, device const float* part_lse, device T* o,
                              long q_heads, long sq, long d, long n_split, long o_sb, long o_sh, long o_ss,
                              uint tg, uint lane) {
  const long row = long(tg);
  const long qi = row % sq;
  const long h = (row / sq) % q_heads;
  const long b = row / (sq * q_heads);
  device const float* lse = part_lse + row * n_split;
  float mx = neg_inf();
  for (long s = lane; s < n_split; s += 32) {
    mx = max(mx, lse[s]);
  }
  mx = simd_max(mx);
  float w = 0.0f;
  if (mx != neg_inf()) {
    for (long s = lane; s < n_split; s += 32) {
      w += exp(lse[s] - mx);
    }
  }
  w = simd_sum(w);
  device T* op = o + b * o_sb + h * o_sh + qi * o_ss;
  for (long c = lane; c < d; c += 32) {
    float a = 0.0f;
    if (mx != neg_inf()) {
      for (long s = 0; s < n_split; ++s) {
        a += exp(lse[s] - mx) * part_o[(row * n_split + s) * d + c];
      }
      a /= w;
    }
    op[c] = T(a);
  }
}

// ---------------------------------------------------------------------------
// Kernels.

#define ATTENTION_PREFILL_KERNEL(T, D)                                                           \
  [[kernel]] void attention_prefill_##T##_d##D(                                                 \
      device const T *q [[buffer(0)]], device const T *k [[buffer(1)]],                          \
      device const T *v [[buffer(2)]], device T *o [[buffer(3)]],                                \
      constant long *shape [[buffer(4)]], constant float &scale [[buffer(5)]],                   \
      uint tg [[threadgroup_position_in_grid]], uint tid [[thread_index_in_threadgroup]],        \
      uint sg [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]) {     \
    threadgroup float kt[kKeys * D];                                                             \
    threadgroup float vt[kKeys * D];                                                         \
    threadgroup float scratch[kSimdgroups * kRows * kKeys];                                      \
    threadgroup float corr[kSimdgroups * kRows * kKeys];                                         \
    threadgroup float row_m[kSimdgroups * kRows];                                                \
    threadgroup float row_l[kSimdgroups * kRows];                                                \
    const PrefillShape p = {shape[0],  shape[1],  shape[2],  shape[3],  shape[4],  shape[5],     \
                            shape[6],  shape[7],  shape[8],  shape[9],  shape[10], shape[11],    \
                            shape[12], shape[13], shape[14], shape[15], shape[16], shape[17]};   \
    attention_prefill<T, D>(q, k, v, o, p, scale, tg, sg, lane, tid, kt, vt, scratch, corr,      \
                            row_m, row_l);                                                       \
  }

#define ATTENTION_PREFILL_KERNELS(T) \
  ATTENTION_PREFILL_KERNEL(T, 64)    \
  ATTENTION_PREFILL_KERNEL(T, 80)    \
  ATTENTION_PREFILL_KERNEL(T, 96)    \
  ATTENTION_PREFILL_KERNEL(T, 128)   \
  ATTENTION_PREFILL_KERNEL(T, 256)

#define ATTENTION_KERNELS(T)                                                                     \
  [[kernel]] void attention_decode_##T(                                                          \
      device const T *q [[buffer(0)]], device const T *k [[buffer(1)]],                          \
      device const T *v [[buffer(2)]], device const int *seqlens [[buffer(3)]],                  \
      device float *part_o [[buffer(4)]], device float *part_lse [[buffer(5)]],                  \
      constant long *shape [[buffer(6)]], constant float &scale [[buffer(7)]],                   \
      uint tg [[threadgroup_position_in_grid]], uint sg [[simdgroup_index_in_threadgroup]],      \
      uint lane [[thread_index_in_simdgroup]]) {                                                 \
    threadgroup float qs[kDecodeHeads * kMaxD];                                                  \
    const DecodeShape p = {shape[0],  shape[1],  shape[2],  shape[3],  shape[4],  shape[5],      \
                           shape[6],  shape[7],  shape[8],  shape[9],  shape[10], shape[11],     \
                           shape[12], shape[13], shape[14], shape[15], shape[16]};               \
    attention_decode<T>(q, k, v, seqlens, part_o, part_lse, p, scale, tg, sg, lane, qs);         \
  }                                                                                              \
  [[kernel]] void attention_combine_##T(                                                         \
      device const float *part_o [[buffer(0)]], device const float *part_lse [[buffer(1)]],      \
      device T *o [[buffer(2)]], constant long *shape [[buffer(3)]],                             \
      uint tg [[threadgroup_position_in_grid]], uint lane [[thread_index_in_simdgroup]]) {       \
    attention_combine<T>(part_o, part_lse, o, shape[0], shape[1], shape[2], shape[3], shape[4],  \
                         shape[5], shape[6], tg, lane);                                          \
  }

ATTENTION_KERNELS(float)
ATTENTION_KERNELS(half)
ATTENTION_PREFILL_KERNELS(float)
ATTENTION_PREFILL_KERNELS(half)
#if __METAL_VERSION__ >= 310
ATTENTION_KERNELS(bfloat)
ATTENTION_PREFILL_KERNELS(bfloat)
#endif
