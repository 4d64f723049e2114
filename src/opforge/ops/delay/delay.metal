// delay.metal - the multi-codebook delay pattern (apply and revert) for Apple GPUs.
//
// Semantics (shared with the Triton and torch paths of opforge):
//   delay_I: codes, out (B, T, C) of I in {int, long}, addressed through their strides;
//   delays int (C,) packed.  One thread per output element (b, t, c):
//   src = t - sign * delays[c]; out = codes[b, src, c] if 0 <= src < T, fill_before if
//   src < 0, fill_after if src >= T (sign = 1 applies the pattern, -1 reverts it).
//   Nothing is read outside [0, T).
//
// Host side: src/opforge/ops/delay/metal.py.

#include <metal_stdlib>
using namespace metal;

#define DELAY_KERNEL(I)                                                                          \
  [[kernel]] void delay_##I(                                                                     \
      device const I *codes [[buffer(0)]], device const int *delays [[buffer(1)]],               \
      device I *out [[buffer(2)]], constant long &T [[buffer(3)]], constant long &C [[buffer(4)]], \
      constant long &scb [[buffer(5)]], constant long &sct [[buffer(6)]],                        \
      constant long &scc [[buffer(7)]], constant long &sob [[buffer(8)]],                        \
      constant long &sot [[buffer(9)]], constant long &soc [[buffer(10)]],                       \
      constant long &sign [[buffer(11)]], constant long &fill_before [[buffer(12)]],             \
      constant long &fill_after [[buffer(13)]], constant long &total [[buffer(14)]],             \
      constant long &base [[buffer(15)]], uint gid [[thread_position_in_grid]]) {                \
    const long g = base + long(gid);                                                             \
    if (g >= total) {                                                                            \
      return;                                                                                    \
    }                                                                                            \
    const long c = g % C;                                                                        \
    const long bt = g / C;                                                                       \
    const long t = bt % T;                                                                       \
    const long b = bt / T;                                                                       \
    const long src = t - sign * long(delays[c]);                                                 \
    I y;                                                                                         \
    if (src < 0) {                                                                               \
      y = I(fill_before);                                                                        \
    } else if (src >= T) {                                                                       \
      y = I(fill_after);                                                                         \
    } else {                                                                                     \
      y = codes[b * scb + src * sct + c * scc];                                                  \
    }                                                                                            \
    out[b * sob + t * sot + c * soc] = y;                                                        \
  }

DELAY_KERNEL(int)
DELAY_KERNEL(long)
