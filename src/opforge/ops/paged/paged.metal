// paged.metal - attention over a paged KV cache, and appends into it, for Apple GPUs.
//
// Semantics (shared with the Triton and torch paths of opforge):
//   k_pages, v_pages (num_blocks, block_size, Hkv, D); block_tables (B, max_blocks) int; position j
//   of sequence b is slot j % block_size of block block_tables[b, j / block_size].  New tokens are
//   packed (T, H, D); sequence b owns rows cu_seqlens[b] .. cu_seqlens[b + 1] - 1.
//   Attention: sequence b holds len = cache_seqlens[b] positions (clamped to the table row's
//   capacity), its n new queries are the last n of them: query i sees positions j < len - n + i + 1.
//   A block id outside [0, num_blocks) is never dereferenced: its keys and values read as zeros.
//   Scores (q . k) * scale and the softmax in float32; a row that sees nothing is 0.
//   Appends: token cu_seqlens[b] + i goes to position cache_seqlens[b] + i; a position outside the
//   table row, or a block outside the pool, is not written.
//   Tensors are addressed by element strides; the last dimension is contiguous.
//
// Kernels, per T in {float, half, bfloat} (1-D grids):
//   paged_attention_T - one threadgroup per (token, kv head, chunk of up to 8 query heads of its
//       group, KV split), one simdgroup per query head.  The token's sequence is found by a binary
//       search over cu_seqlens.  Each lane scores one key of a block of 32 (its block id read from
//       the table), simd_max / simd_sum give the block's maximum and sum, and each lane
//       accumulates dimensions lane, lane + 32, ... of P V, the block's probabilities and block ids
//       taken from each lane with simd_shuffle.  The split writes its normalised partial output
//       and log-sum-exp (-inf if it saw no key).
//       Tokens of a sequence with more than max_n new tokens are left to paged_prefill.
//   paged_combine_T   - one 32-thread threadgroup per (token, query head): the splits merged.
//   paged_prefill_T_dD - one threadgroup of 4 simdgroups per (sequence, query head, tile of 32 of its
//       new tokens) for the sequences with at least min_n new tokens (D in {64, 80, 96, 128, 256}):
//       Q as simdgroup 8x8 matrices, blocks of 8 keys staged from their pages, S = Q K^T and P V by
//       8x8 multiply-accumulates, online softmax in float32, blocks past the tile's last row skipped.
//   paged_append_T    - one 32-thread threadgroup per (token, kv head): the row into its slot.
//   paged_rotary_append_T - one 32-thread threadgroup per (token, head of q, k or v): q and k
//       heads rotated (rotate-half or interleaved pairs, float32), q into q_out, k into its slot;
//       v heads copied into their slots.
//
// Host side: src/opforge/ops/paged/metal.py.

#include <metal_stdlib>
using namespace metal;

constant constexpr int kMaxD = 256;        // largest head dimension
constant constexpr int kLaneDims = 8;      // dimensions per lane (kMaxD / 32)
constant constexpr int kHeads = 8;         // at most this many query heads (simdgroups) per threadgroup

inline float neg_inf() {
  return as_type<float>(0xff800000u);
}

inline long clamp_l(long x, long lo, long hi) {
  return x < lo ? lo : (x > hi ? hi : x);
}

inline long min_l(long a, long b) {
  return a < b ? a : b;
}

// The sequence of packed token t: the largest b in [0, batch) with cu[b] <= t.
inline long find_sequence(device const int* cu, long batch, long t) {
  long lo = 0;
  long hi = batch - 1;
  while (lo < hi) {
    const long mid = (lo + hi + 1) / 2;
    if (long(cu[mid]) <= t) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

// The block holding position pos of sequence b, or -1 if the position is outside the table row
// or the entry is not a block of the pool.
inline long block_of(device const int* tables, long b, long pos, long block_size, long max_blocks,
                     long num_blocks) {
  if (pos < 0 || pos / block_size >= max_blocks) {
    return -1;
  }
  const long blk = long(tables[b * max_blocks + pos / block_size]);
  return blk >= 0 && blk < num_blocks ? blk : -1;
}

// ---------------------------------------------------------------------------
// Attention.

struct AttentionShape {
  long tokens, batch, q_heads, group, heads_per_group, d, block_size, max_blocks, num_blocks, n_split, chunk;
  long q_st, q_sh, k_sb, k_ss, k_sh, v_sb, v_ss, v_sh, max_n;
};

template <typename T>
inline void paged_attention(device const T* q, device const T* k, device const T* v, device const int* tables,
                            device const int* lens, device const int* cu, device float* part_o,
                            device float* part_lse, thread const AttentionShape& p, float scale, uint tg, uint sg,
                            uint lane, threadgroup float* qs_all) {
  const long n_chunks = p.group / p.heads_per_group;
  const long kv_heads = p.q_heads / p.group;
  long rest = long(tg);
  const long split = rest % p.n_split;
  rest /= p.n_split;
  const long chunk_i = rest % n_chunks;
  rest /= n_chunks;
  const long hk = rest % kv_heads;
  const long t = rest / kv_heads;
  const long h = hk * p.group + chunk_i * p.heads_per_group + long(sg);
  const long b = find_sequence(cu, p.batch, t);
  const long first = long(cu[b]);
  const long n = long(cu[b + 1]) - first;
  const long len = clamp_l(long(lens[b]), 0, p.max_blocks * p.block_size);
  const long visible = clamp_l(len - n + (t - first) + 1, 0, len);
  const long start = split * p.chunk;
  // a sequence with more than max_n new tokens is the tiled kernel's: no key read (combine skips it)
  const long end = n > p.max_n ? start : min_l(start + p.chunk, visible);
  const long d = p.d;
  threadgroup float* qs = qs_all + sg * kMaxD;
  device const T* qp = q + t * p.q_st + h * p.q_sh;
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
    const long j = j0 + long(lane);
    float s = neg_inf();
    int blk = -1;
    if (j < end) {
      blk = int(block_of(tables, b, j, p.block_size, p.max_blocks, p.num_blocks));
      float dot = 0.0f;
      if (blk >= 0) {
        device const T* kr = k + long(blk) * p.k_sb + (j % p.block_size) * p.k_ss + hk * p.k_sh;
        for (long c = 0; c < d; ++c) {
          dot += qs[c] * float(kr[c]);
        }
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
    for (long u = 0; u < n_keys; ++u) {
      const float eu = simd_shuffle(e, ushort(u));
      const int bu = simd_shuffle(blk, ushort(u));
      if (bu < 0) {
        continue;  // a key outside the pool: its value reads as zeros
      }
      device const T* vr = v + long(bu) * p.v_sb + ((j0 + u) % p.block_size) * p.v_ss + hk * p.v_sh;
      for (int i = 0; i < kLaneDims; ++i) {
        const long c = long(lane) + 32 * i;
        if (c < d) {
          acc[i] += eu * float(vr[c]);
        }
      }
    }
  }

  const long out_row = (t * p.q_heads + h) * p.n_split + split;
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
inline void paged_combine(device const float* part_o, device const float* part_lse, device T* o,
                          device const int* cu, long batch, long q_heads, long max_n, long d, long n_split, uint tg,
                          uint lane) {
  const long row = long(tg);
  const long b = find_sequence(cu, batch, row / q_heads);
  if (long(cu[b + 1]) - long(cu[b]) > max_n) {
    return;  // the tiled kernel's row
  }
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
  for (long c = lane; c < d; c += 32) {
    float a = 0.0f;
    if (mx != neg_inf()) {
      for (long s = 0; s < n_split; ++s) {
        if (lse[s] != neg_inf()) {
          a += exp(lse[s] - mx) * part_o[(row * n_split + s) * d + c];
        }
      }
      a /= w;
    }
    o[row * d + c] = T(a);
  }
}

// ---------------------------------------------------------------------------
// Tiled prefill: sequences with more than min_n new tokens.

constant constexpr int kRows = 8;        // query rows per simdgroup
constant constexpr int kKeys = 8;        // keys per step
constant constexpr int kSimdgroups = 4;  // simdgroups per threadgroup
constant constexpr int kTileRows = kRows * kSimdgroups;
constant constexpr int kPrefillThreads = 32 * kSimdgroups;

struct PrefillShape {
  long batch, q_heads, group, max_query_len, min_n, block_size, max_blocks, num_blocks;
  long q_st, q_sh, k_sb, k_ss, k_sh, v_sb, v_ss, v_sh, o_st, o_sh;
};

// One threadgroup per (sequence, query head, tile of 32 of the sequence's new tokens), 8 rows per
// simdgroup: Q (scaled) held as D/8 simdgroup 8x8 matrices; blocks of 8 keys staged once per
// threadgroup from their pages (zeros past the tile's last visible key or for a block outside
// the pool); S = Q K^T and P V by 8x8 multiply-accumulates; online softmax in float32 on 8 lanes.
template <typename T, int D>
inline void paged_prefill(device const T* q, device const T* k, device const T* v, device T* o,
                          device const int* tables, device const int* lens, device const int* cu,
                          thread const PrefillShape& p, float scale, uint tg, uint sg, uint lane, uint tid,
                          threadgroup float* kt, threadgroup float* vt, threadgroup float* scratch,
                          threadgroup float* corr_all, threadgroup float* row_m_all, threadgroup float* row_l_all) {
  const long q_blocks = (p.max_query_len + kTileRows - 1) / kTileRows;
  const long blk = long(tg) % q_blocks;
  const long h = (long(tg) / q_blocks) % p.q_heads;
  const long b = long(tg) / (q_blocks * p.q_heads);
  const long first = long(cu[b]);
  const long n = long(cu[b + 1]) - first;
  if (n < p.min_n || blk * kTileRows >= n) {
    return;  // the whole threadgroup: another kernel's sequence, or a tile past its tokens
  }
  const long hk = h / p.group;
  const long q0 = blk * kTileRows + long(sg) * kRows;  // this simdgroup's first query row
  constexpr long d = D;
  constexpr long nd = D / 8;
  const long len = clamp_l(long(lens[b]), 0, p.max_blocks * p.block_size);
  const long shift = len - n;  // query i sees keys j <= i + shift
  device const T* qp = q + first * p.q_st + h * p.q_sh;
  device T* op = o + first * p.o_st + h * p.o_sh;
  threadgroup float* sp = scratch + sg * (kRows * kKeys);
  threadgroup float* corr = corr_all + sg * (kRows * kKeys);
  threadgroup float* row_m = row_m_all + sg * kRows;
  threadgroup float* row_l = row_l_all + sg * kRows;

  const long last_row = min_l(blk * kTileRows + kTileRows, n) - 1;
  const long kend = clamp_l(last_row + shift + 1, 0, len);  // keys the tile's last row sees

  simdgroup_float8x8 qf[nd];
  simdgroup_float8x8 acc[nd];
  for (long i = 0; i < nd; ++i) {
    for (long e = lane; e < kRows * 8; e += 32) {
      const long r = e / 8, c = e % 8;
      sp[e] = q0 + r < n ? float(qp[(q0 + r) * p.q_st + i * 8 + c]) * scale : 0.0f;
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
      const long kb = key < kend ? block_of(tables, b, key, p.block_size, p.max_blocks, p.num_blocks) : -1;
      const long slot = key % p.block_size;
      kt[r * D + c] = kb >= 0 ? float(k[kb * p.k_sb + slot * p.k_ss + hk * p.k_sh + c]) : 0.0f;
      vt[r * D + c] = kb >= 0 ? float(v[kb * p.v_sb + slot * p.v_ss + hk * p.v_sh + c]) : 0.0f;
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
        const bool seen = key < len && key <= qi + shift;
        const float x = seen ? sp[r * kKeys + c] : neg_inf();
        sp[r * kKeys + c] = x;
        m_new = max(m_new, x);
      }
      const bool none = m_new == neg_inf();  // nothing seen yet: accumulators and probabilities stay 0
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
      if (q0 + r < n) {
        const float l = row_l[r];
        op[(q0 + r) * p.o_st + i * 8 + c] = T(l > 0.0f ? sp[e] / l : 0.0f);
      }
    }
  }
}

// ---------------------------------------------------------------------------
// Appends.

struct AppendShape {
  long tokens, batch, kv_heads, d, block_size, max_blocks, num_blocks;
  long k_st, k_sh, v_st, v_sh, kp_sb, kp_ss, kp_sh, vp_sb, vp_ss, vp_sh;
};

// Position of token t in its sequence's cache, and its block (-1: not writable).
inline long token_block(device const int* tables, device const int* lens, device const int* cu, long batch, long t,
                        long block_size, long max_blocks, long num_blocks, thread long& pos) {
  const long b = find_sequence(cu, batch, t);
  pos = long(lens[b]) + t - long(cu[b]);
  return block_of(tables, b, pos, block_size, max_blocks, num_blocks);
}

template <typename T>
inline void paged_append(device const T* k, device const T* v, device T* kp, device T* vp, device const int* tables,
                         device const int* lens, device const int* cu, thread const AppendShape& p, uint tg,
                         uint lane) {
  const long t = long(tg) / p.kv_heads;
  const long h = long(tg) % p.kv_heads;
  long pos = 0;
  const long blk = token_block(tables, lens, cu, p.batch, t, p.block_size, p.max_blocks, p.num_blocks, pos);
  if (blk < 0) {
    return;
  }
  const long slot = pos % p.block_size;
  device const T* kr = k + t * p.k_st + h * p.k_sh;
  device const T* vr = v + t * p.v_st + h * p.v_sh;
  device T* ko = kp + blk * p.kp_sb + slot * p.kp_ss + h * p.kp_sh;
  device T* vo = vp + blk * p.vp_sb + slot * p.vp_ss + h * p.vp_sh;
  for (long c = lane; c < p.d; c += 32) {
    ko[c] = kr[c];
    vo[c] = vr[c];
  }
}

struct RotaryAppendShape {
  long tokens, batch, q_heads, kv_heads, d, half, max_pos, interleaved, pos_given, copy_q_tail;
  long block_size, max_blocks, num_blocks;
  long q_st, q_sh, qo_st, qo_sh, k_st, k_sh, v_st, v_sh, kp_sb, kp_ss, kp_sh, vp_sb, vp_ss, vp_sh, c_s, s_s;
};

// Rotate one head (x -> o), pairs (i, i + half) or (2i, 2i + 1); cos/sin zero outside the table.
template <typename T>
inline void rotate_head(device const T* x, device T* o, device const float* cos_t, device const float* sin_t,
                        long pos, thread const RotaryAppendShape& p, bool copy_tail, uint lane) {
  const bool in_table = pos >= 0 && pos < p.max_pos;
  for (long i = lane; i < p.half; i += 32) {
    const float c = in_table ? cos_t[pos * p.c_s + i] : 0.0f;
    const float s = in_table ? sin_t[pos * p.s_s + i] : 0.0f;
    const long i1 = p.interleaved ? 2 * i : i;
    const long i2 = p.interleaved ? 2 * i + 1 : i + p.half;
    const float x1 = float(x[i1]);
    const float x2 = float(x[i2]);
    o[i1] = T(x1 * c - x2 * s);
    o[i2] = T(x2 * c + x1 * s);
  }
  if (copy_tail) {
    for (long c = 2 * p.half + lane; c < p.d; c += 32) {
      o[c] = x[c];
    }
  }
}

template <typename T>
inline void paged_rotary_append(device const T* q, device const T* k, device const T* v, device T* qo, device T* kp,
                                device T* vp, device const float* cos_t, device const float* sin_t,
                                device const int* positions, device const int* tables, device const int* lens,
                                device const int* cu, thread const RotaryAppendShape& p, uint tg, uint lane) {
  const long heads = p.q_heads + 2 * p.kv_heads;
  const long t = long(tg) / heads;
  const long h = long(tg) % heads;
  long cpos = 0;
  const long blk = token_block(tables, lens, cu, p.batch, t, p.block_size, p.max_blocks, p.num_blocks, cpos);
  const long pos = p.pos_given ? long(positions[t]) : cpos;
  if (h < p.q_heads) {
    rotate_head<T>(q + t * p.q_st + h * p.q_sh, qo + t * p.qo_st + h * p.qo_sh, cos_t, sin_t, pos, p,
                   p.copy_q_tail != 0, lane);
    return;
  }
  if (blk < 0) {
    return;
  }
  const long slot = cpos % p.block_size;
  if (h < p.q_heads + p.kv_heads) {
    const long hk = h - p.q_heads;
    rotate_head<T>(k + t * p.k_st + hk * p.k_sh, kp + blk * p.kp_sb + slot * p.kp_ss + hk * p.kp_sh, cos_t, sin_t,
                   pos, p, true, lane);
  } else {
    const long hv = h - p.q_heads - p.kv_heads;
    device const T* vr = v + t * p.v_st + hv * p.v_sh;
    device T* vo = vp + blk * p.vp_sb + slot * p.vp_ss + hv * p.vp_sh;
    for (long c = lane; c < p.d; c += 32) {
      vo[c] = vr[c];
    }
  }
}

// ---------------------------------------------------------------------------
// Kernels.

#define PAGED_KERNELS(T)                                                                         \
  [[kernel]] void paged_attention_##T(                                                           \
      device const T *q [[buffer(0)]], device const T *k [[buffer(1)]],                          \
      device const T *v [[buffer(2)]], device const int *tables [[buffer(3)]],                   \
      device const int *lens [[buffer(4)]], device const int *cu [[buffer(5)]],                  \
      device float *part_o [[buffer(6)]], device float *part_lse [[buffer(7)]],                  \
      constant long *shape [[buffer(8)]], constant float &scale [[buffer(9)]],                   \
      uint tg [[threadgroup_position_in_grid]], uint sg [[simdgroup_index_in_threadgroup]],      \
      uint lane [[thread_index_in_simdgroup]]) {                                                 \
    threadgroup float qs[kHeads * kMaxD];                                                        \
    const AttentionShape p = {shape[0],  shape[1],  shape[2],  shape[3],  shape[4],              \
                              shape[5],  shape[6],  shape[7],  shape[8],  shape[9],              \
                              shape[10], shape[11], shape[12], shape[13], shape[14],             \
                              shape[15], shape[16], shape[17], shape[18], shape[19]};            \
    paged_attention<T>(q, k, v, tables, lens, cu, part_o, part_lse, p, scale, tg, sg, lane, qs);  \
  }                                                                                              \
  [[kernel]] void paged_combine_##T(                                                             \
      device const float *part_o [[buffer(0)]], device const float *part_lse [[buffer(1)]],      \
      device T *o [[buffer(2)]], device const int *cu [[buffer(3)]], constant long *shape [[buffer(4)]], \
      uint tg [[threadgroup_position_in_grid]], uint lane [[thread_index_in_simdgroup]]) {       \
    paged_combine<T>(part_o, part_lse, o, cu, shape[0], shape[1], shape[2], shape[3], shape[4], tg, lane); \
  }                                                                                              \
  [[kernel]] void paged_append_##T(                                                              \
      device const T *k [[buffer(0)]], device const T *v [[buffer(1)]], device T *kp [[buffer(2)]], \
      device T *vp [[buffer(3)]], device const int *tables [[buffer(4)]],                        \
      device const int *lens [[buffer(5)]], device const int *cu [[buffer(6)]],                  \
      constant long *shape [[buffer(7)]], uint tg [[threadgroup_position_in_grid]],              \
      uint lane [[thread_index_in_simdgroup]]) {                                                 \
    const AppendShape p = {shape[0],  shape[1],  shape[2],  shape[3],  shape[4],  shape[5],      \
                           shape[6],  shape[7],  shape[8],  shape[9],  shape[10], shape[11],     \
                           shape[12], shape[13], shape[14], shape[15], shape[16]};               \
    paged_append<T>(k, v, kp, vp, tables, lens, cu, p, tg, lane);                                \
  }                                                                                              \
  [[kernel]] void paged_rotary_append_##T(                                                       \
      device const T *q [[buffer(0)]], device const T *k [[buffer(1)]],                          \
      device const T *v [[buffer(2)]], device T *qo [[buffer(3)]], device T *kp [[buffer(4)]],   \
      device T *vp [[buffer(5)]], device const float *cos_t [[buffer(6)]],                       \
      device const float *sin_t [[buffer(7)]], device const int *positions [[buffer(8)]],        \
      device const int *tables [[buffer(9)]], device const int *lens [[buffer(10)]],             \
      device const int *cu [[buffer(11)]], constant long *shape [[buffer(12)]],                  \
      uint tg [[threadgroup_position_in_grid]], uint lane [[thread_index_in_simdgroup]]) {       \
    const RotaryAppendShape p = {                                                                \
        shape[0],  shape[1],  shape[2],  shape[3],  shape[4],  shape[5],  shape[6],  shape[7],   \
        shape[8],  shape[9],  shape[10], shape[11], shape[12], shape[13], shape[14], shape[15],  \
        shape[16], shape[17], shape[18], shape[19], shape[20], shape[21], shape[22], shape[23],  \
        shape[24], shape[25], shape[26], shape[27], shape[28]};                                  \
    paged_rotary_append<T>(q, k, v, qo, kp, vp, cos_t, sin_t, positions, tables, lens, cu, p, tg, lane); \
  }

#define PAGED_PREFILL_KERNEL(T, D)                                                               \
  [[kernel]] void paged_prefill_##T##_d##D(                                                     \
      device const T *q [[buffer(0)]], device const T *k [[buffer(1)]],                          \
      device const T *v [[buffer(2)]], device T *o [[buffer(3)]],                                \
      device const int *tables [[buffer(4)]], device const int *lens [[buffer(5)]],              \
      device const int *cu [[buffer(6)]], constant long *shape [[buffer(7)]],                    \
      constant float &scale [[buffer(8)]], uint tg [[threadgroup_position_in_grid]],             \
      uint tid [[thread_index_in_threadgroup]], uint sg [[simdgroup_index_in_threadgroup]],      \
      uint lane [[thread_index_in_simdgroup]]) {                                                 \
    threadgroup float kt[kKeys * D];                                                             \
    threadgroup float vt[kKeys * D];                                                             \
    threadgroup float scratch[kSimdgroups * kRows * kKeys];                                      \
    threadgroup float corr[kSimdgroups * kRows * kKeys];                                         \
    threadgroup float row_m[kSimdgroups * kRows];                                                \
    threadgroup float row_l[kSimdgroups * kRows];                                                \
    const PrefillShape p = {shape[0],  shape[1],  shape[2],  shape[3],  shape[4],  shape[5],     \
                            shape[6],  shape[7],  shape[8],  shape[9],  shape[10], shape[11],    \
                            shape[12], shape[13], shape[14], shape[15], shape[16], shape[17]};   \
    paged_prefill<T, D>(q, k, v, o, tables, lens, cu, p, scale, tg, sg, lane, tid, kt, vt, scratch, corr, \
                        row_m, row_l);                                                           \
  }

#define PAGED_PREFILL_KERNELS(T) \
  PAGED_PREFILL_KERNEL(T, 64)    \
  PAGED_PREFILL_KERNEL(T, 80)    \
  PAGED_PREFILL_KERNEL(T, 96)    \
  PAGED_PREFILL_KERNEL(T, 128)   \
  PAGED_PREFILL_KERNEL(T, 256)

PAGED_KERNELS(float)
PAGED_KERNELS(half)
PAGED_PREFILL_KERNELS(float)
PAGED_PREFILL_KERNELS(half)
#if __METAL_VERSION__ >= 310
PAGED_KERNELS(bfloat)
PAGED_PREFILL_KERNELS(bfloat)
#endif
