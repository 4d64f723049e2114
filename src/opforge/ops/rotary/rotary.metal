// rotary.metal - rotary embedding and KV-cache append for Apple GPUs.
//
// Semantics (shared with the Triton and torch paths of opforge):
//   rope_T_I: x, o (B, H, S, D) of T in {float, half, bfloat}, addressed through their strides
//   (b, h, s; the last dim is contiguous); cos, sin float tables (P, HALF) with row strides;
//   positions of I in {int, long}, pos[b * spb + s * sps] (spb = 0 for (S,) positions).
//   One thread per (b, h, s, j), j < W: for j < HALF it rotates the pair (i1, i2) =
//   interleaved ? (2j, 2j + 1) : (j, j + HALF) in float32 by the angle of the token's position,
//   o[i1] = x1 cos - x2 sin, o[i2] = x2 cos + x1 sin, rounded once to T; for HALF <= j < W it
//   copies feature 2 * HALF + (j - HALF) (W = HALF in place, where the tail is already there).
//   A position outside [0, P) reads nothing and gives cos = sin = 0: zeros in the rotated
//   features. x and o may be the same buffer (in place): each thread reads before it writes,
//   and no two threads touch the same element.
//
//   kv_append_T_I: one thread per (b, h, s, d) of k/v (B, H, S_new, D) copies k and v to the
//   caches (B, H, S_max, D) at position lens[b * slen] + s; outside [0, S_max) it writes nothing.
//
// Host side: src/opforge/ops/rotary/metal.py.

#include <metal_stdlib>
using namespace metal;

#define ROPE_KERNEL(T, I)                                                                        \
  [[kernel]] void rope_##T##_##I(                                                                \
      device const T *x [[buffer(0)]], device T *o [[buffer(1)]],                                \
      device const float *cosv [[buffer(2)]], device const float *sinv [[buffer(3)]],            \
      device const I *pos [[buffer(4)]], constant long &S [[buffer(5)]],                         \
      constant long &H [[buffer(6)]], constant long &HALF [[buffer(7)]],                         \
      constant long &P [[buffer(8)]], constant long &spb [[buffer(9)]],                          \
      constant long &sps [[buffer(10)]], constant long &scos [[buffer(11)]],                     \
      constant long &ssin [[buffer(12)]], constant long &sxb [[buffer(13)]],                     \
      constant long &sxh [[buffer(14)]], constant long &sxs [[buffer(15)]],                      \
      constant long &sob [[buffer(16)]], constant long &soh [[buffer(17)]],                      \
      constant long &sos [[buffer(18)]], constant long &W [[buffer(19)]],                        \
      constant long &inter [[buffer(20)]], constant long &total [[buffer(21)]],                  \
      constant long &base [[buffer(22)]], uint gid [[thread_position_in_grid]]) {                \
    const long g = base + long(gid);                                                             \
    if (g >= total) {                                                                            \
      return;                                                                                    \
    }                                                                                            \
    const long j = g % W;                                                                        \
    const long row = g / W;                                                                      \
    const long s = row % S;                                                                      \
    const long bh = row / S;                                                                     \
    const long h = bh % H;                                                                       \
    const long b = bh / H;                                                                       \
    device const T *xr = x + (b * sxb + h * sxh + s * sxs);                                      \
    device T *orow = o + (b * sob + h * soh + s * sos);                                          \
    if (j < HALF) {                                                                              \
      const long p = long(pos[b * spb + s * sps]);                                               \
      const bool ok = p >= 0 && p < P;                                                           \
      const float c = ok ? cosv[p * scos + j] : 0.0f;                                            \
      const float sn = ok ? sinv[p * ssin + j] : 0.0f;                                           \
      const long i1 = inter ? 2 * j : j;                                                         \
      const long i2 = inter ? 2 * j + 1 : j + HALF;                                              \
      const float x1 = float(xr[i1]);                                                            \
      const float x2 = float(xr[i2]);                                                            \
      orow[i1] = T(x1 * c - x2 * sn);                                                            \
      orow[i2] = T(x2 * c + x1 * sn);                                                            \
    } else {                                                                                     \
      const long e = HALF + j;                                                                   \
      orow[e] = xr[e];                                                                           \
    }                                                                                            \
  }

#define KV_APPEND_KERNEL(T, I)                                                                   \
  [[kernel]] void kv_append_##T##_##I(                                                           \
      device T *kc [[buffer(0)]], device T *vc [[buffer(1)]], device const T *k [[buffer(2)]],   \
      device const T *v [[buffer(3)]], device const I *lens [[buffer(4)]],                       \
      constant long &S_new [[buffer(5)]], constant long &H [[buffer(6)]],                        \
      constant long &D [[buffer(7)]], constant long &S_max [[buffer(8)]],                        \
      constant long &slen [[buffer(9)]], constant long &skcb [[buffer(10)]],                     \
      constant long &skch [[buffer(11)]], constant long &skcs [[buffer(12)]],                    \
      constant long &svcb [[buffer(13)]], constant long &svch [[buffer(14)]],                    \
      constant long &svcs [[buffer(15)]], constant long &skb [[buffer(16)]],                     \
      constant long &skh [[buffer(17)]], constant long &sks [[buffer(18)]],                      \
      constant long &svb [[buffer(19)]], constant long &svh [[buffer(20)]],                      \
      constant long &svs [[buffer(21)]], constant long &total [[buffer(22)]],                    \
      constant long &base [[buffer(23)]], uint gid [[thread_position_in_grid]]) {                \
    const long g = base + long(gid);                                                             \
    if (g >= total) {                                                                            \
      return;                                                                                    \
    }                                                                                            \
    const long d = g % D;                                                                        \
    const long row = g / D;                                                                      \
    const long s = row % S_new;                                                                  \
    const long bh = row / S_new;                                                                 \
    const long h = bh % H;                                                                       \
    const long b = bh / H;                                                                       \
    const long p = long(lens[b * slen]) + s;                                                     \
    if (p < 0 || p >= S_max) {                                                                   \
      return;                                                                                    \
    }                                                                                            \
    kc[b * skcb + h * skch + p * skcs + d] = k[b * skb + h * skh + s * sks + d];                 \
    vc[b * svcb + h * svch + p * svcs + d] = v[b * svb + h * svh + s * svs + d];                 \
  }

#define ROTARY_ALL(T)      \
  ROPE_KERNEL(T, int)      \
  ROPE_KERNEL(T, long)     \
  KV_APPEND_KERNEL(T, int) \
  KV_APPEND_KERNEL(T, long)

ROTARY_ALL(float)
ROTARY_ALL(half)
#if __METAL_VERSION__ >= 310
ROTARY_ALL(bfloat)
#endif
