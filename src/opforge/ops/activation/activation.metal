// activation.metal - gelu (exact and tanh), silu, relu, swiglu and geglu for Apple GPUs.
//
// Semantics (shared with the Triton and torch paths of opforge):
//   x, up, y: T in {float, half, bfloat}.  Each element is computed in float32 and rounded
//   once to T; the gated forms multiply by float(up) before that rounding.
//   gelu:       0.5 * x * (1 + erf(x / sqrt(2))), evaluated as 0.5 * x * erfc(-x / sqrt(2)) so
//               that it does not cancel for x << 0 (erfc from a fitted form, ~1.2e-7 relative).
//   gelu_tanh:  0.5 * x * (1 + tanh(u)), u = sqrt(2/pi) * (x + 0.044715 x^3), evaluated as
//               x / (1 + exp(-2u)), the same function with one exponential.
//   silu:       x / (1 + exp(-x)).
//   relu:       x < 0 ? 0 : x (NaN stays NaN).
//   swiglu:     silu(gate) * up;  geglu(_tanh): gelu(_tanh)(gate) * up.
//
// One kernel per (activation, T), named act_T, one element per thread.  The inputs are seen
// as rows of n_cols elements: element g is column g % n_cols of row g / n_cols, and row r
// starts at (r / inner) * so + (r % inner) * si elements from its tensor (so strided rows,
// e.g. the two halves of a fused projection, run in place).  A contiguous or dense tensor is
// one row of numel elements.  The output is packed in the same walk order (row r at
// r * n_cols); the host gives it the input's layout when the input was dense.
//
// Host side: src/opforge/ops/activation/metal.py.

#include <metal_stdlib>
using namespace metal;

// erfc(|z|), from the rational-exponential fit of Numerical Recipes (6.2), ~1.2e-7 relative.
inline float erfc_abs(float z) {
  const float a = abs(z);
  const float t = 1.0f / (1.0f + 0.5f * a);
  float p = 0.17087277f;
  p = p * t - 0.82215223f;
  p = p * t + 1.48851587f;
  p = p * t - 1.13520398f;
  p = p * t + 0.27886807f;
  p = p * t - 0.18628806f;
  p = p * t + 0.09678418f;
  p = p * t + 0.37409196f;
  p = p * t + 1.00002368f;
  return t * precise::exp(t * p - a * a - 1.26551223f);
}

inline float act_gelu(float v) {
  const float e = erfc_abs(v * 0.7071067811865476f);
  return v * (v >= 0.0f ? 1.0f - 0.5f * e : 0.5f * e);
}

inline float act_gelu_tanh(float v) {
  const float u = 0.7978845608028654f * (v + 0.044715f * v * v * v);
  return v / (1.0f + precise::exp(-2.0f * u));
}

inline float act_silu(float v) {
  return v / (1.0f + precise::exp(-v));
}

inline float act_relu(float v) {
  return v < 0.0f ? 0.0f : v;
}

#define ACT_PARAMS(T)                                                                       \
  device const T *x [[buffer(0)]], device const T *u [[buffer(1)]], device T *y [[buffer(2)]], \
      constant long &n_cols [[buffer(3)]], constant long &total [[buffer(4)]],              \
      constant long &x_inner [[buffer(5)]], constant long &x_so [[buffer(6)]],              \
      constant long &x_si [[buffer(7)]], constant long &u_inner [[buffer(8)]],              \
      constant long &u_so [[buffer(9)]], constant long &u_si [[buffer(10)]],                \
      constant long &base [[buffer(11)]], uint gid [[thread_position_in_grid]]

inline long elem_offset(long g, long n_cols, long inner, long so, long si) {
  const long row = g / n_cols;
  return (row / inner) * so + (row % inner) * si + (g - row * n_cols);
}

#define ACT_KERNEL(name, fn, GATED, T)                                                      \
  [[kernel]] void name##_##T(ACT_PARAMS(T)) {                                               \
    const long g = base + long(gid);                                                        \
    if (g < total) {                                                                        \
      float o = fn(float(x[elem_offset(g, n_cols, x_inner, x_so, x_si)]));                  \
      if (GATED) {                                                                          \
        o *= float(u[elem_offset(g, n_cols, u_inner, u_so, u_si)]);                         \
      }                                                                                     \
      y[g] = T(o);                                                                          \
    }                                                                                       \
  }

#define ACT_ALL(T)                                  \
  ACT_KERNEL(gelu, act_gelu, false, T)              \
  ACT_KERNEL(gelu_tanh, act_gelu_tanh, false, T)    \
  ACT_KERNEL(silu, act_silu, false, T)              \
  ACT_KERNEL(relu, act_relu, false, T)              \
  ACT_KERNEL(swiglu, act_silu, true, T)             \
  ACT_KERNEL(geglu, act_gelu, true, T)              \
  ACT_KERNEL(geglu_tanh, act_gelu_tanh, true, T)

ACT_ALL(float)
ACT_ALL(half)
#if __METAL_VERSION__ >= 310
ACT_ALL(bfloat)
#endif
