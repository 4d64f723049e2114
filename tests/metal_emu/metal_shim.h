// metal_shim.h - what a Metal Shading Language compute kernel sees, in C++20.
//
// The emulator compiles a .metal file (after a small mechanical rewrite done
// by _source.py: `[[...]]` attributes dropped, `threadgroup` variables moved to
// per-threadgroup storage) with this header in front of it.  It provides the
// scalar and vector types, the `metal::` math the kernels use, the simdgroup
// collectives and the barriers.  The execution model lives in emu_exec.h.
//
// Types: `half` is _Float16; `bfloat` is a 16-bit storage type whose
// conversions from float round to nearest even and whose arithmetic is done
// in float and rounded back, as on the GPU.
#pragma once

#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>
#include <source_location>
#include <type_traits>

#include "emu_exec.h"

// ---------------------------------------------------------------------------
// Scalar types.

typedef unsigned int uint;
typedef unsigned short ushort;
typedef unsigned char uchar;
typedef unsigned long ulong;
typedef _Float16 half;

struct bfloat {
  uint16_t bits;

  static uint16_t round_from(float f) {
    uint32_t u = std::bit_cast<uint32_t>(f);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
    u += 0x7FFFu + ((u >> 16) & 1u);  // round to nearest, ties to even
    return static_cast<uint16_t>(u >> 16);
  }

  bfloat() = default;
  template <class U>
    requires(std::is_arithmetic_v<U> || std::is_same_v<U, _Float16>)
  bfloat(U v) : bits(round_from(static_cast<float>(v))) {}
  operator float() const { return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16); }
  explicit operator half() const { return static_cast<half>(static_cast<float>(*this)); }

  bfloat operator-() const {
    bfloat r;
    r.bits = static_cast<uint16_t>(bits ^ 0x8000u);
    return r;
  }
};

namespace emu {
template <class T>
inline constexpr bool is_scalar_v =
    std::is_arithmetic_v<T> || std::is_same_v<T, half> || std::is_same_v<T, bfloat>;
}  // namespace emu

// bfloat with bfloat stays bfloat; with any other type it computes in float.
#define EMU_BF_ARITH(op)                                                           \
  inline bfloat operator op(bfloat a, bfloat b) {                                 \
    return bfloat(static_cast<float>(a) op static_cast<float>(b));                \
  }                                                                                \
  template <class U>                                                               \
    requires(emu::is_scalar_v<U> && !std::is_same_v<U, bfloat>)                    \
  inline auto operator op(bfloat a, U b) {                                         \
    return static_cast<float>(a) op static_cast<std::common_type_t<float, U>>(b);   \
  }                                                                                \
  template <class U>                                                               \
    requires(emu::is_scalar_v<U> && !std::is_same_v<U, bfloat>)                    \
  inline auto operator op(U a, bfloat b) {                                         \
    return static_cast<std::common_type_t<float, U>>(a) op static_cast<float>(b);   \
  }                                                                                \
  template <class U>                                                               \
    requires(emu::is_scalar_v<U>)                                                  \
  inline bfloat& operator op##=(bfloat & a, U b) {                                 \
    a = bfloat(static_cast<float>(a) op static_cast<float>(b));                    \
    return a;                                                                      \
  }
EMU_BF_ARITH(+)
EMU_BF_ARITH(-)
EMU_BF_ARITH(*)
EMU_BF_ARITH(/)
#undef EMU_BF_ARITH

#define EMU_BF_CMP(op)                                                                   \
  inline bool operator op(bfloat a, bfloat b) {                                         \
    return static_cast<float>(a) op static_cast<float>(b);                              \
  }                                                                                      \
  template <class U>                                                                     \
    requires(emu::is_scalar_v<U> && !std::is_same_v<U, bfloat>)                          \
  inline bool operator op(bfloat a, U b) {                                               \
    return static_cast<float>(a) op b;                                                   \
  }                                                                                      \
  template <class U>                                                                     \
    requires(emu::is_scalar_v<U> && !std::is_same_v<U, bfloat>)                          \
  inline bool operator op(U a, bfloat b) {                                               \
    return a op static_cast<float>(b);                                                   \
  }
EMU_BF_CMP(<)
EMU_BF_CMP(>)
EMU_BF_CMP(<=)
EMU_BF_CMP(>=)
EMU_BF_CMP(==)
EMU_BF_CMP(!=)
#undef EMU_BF_CMP

// ---------------------------------------------------------------------------
// Vector types: float2..4, half2..4, bfloat2..4, int2..4, uint2..4, ...
// Sizes and alignments follow Metal (a 3-vector is padded to 4 elements).

template <class T, int N>
struct vec_fields;
template <class T>
struct vec_fields<T, 2> {
  T x, y;
};
template <class T>
struct vec_fields<T, 3> {
  T x, y, z;
};
template <class T>
struct vec_fields<T, 4> {
  T x, y, z, w;
};

template <class T, int N>
struct alignas(sizeof(T) * (N == 3 ? 4 : N)) vec : vec_fields<T, N> {
  vec() = default;
  template <class U>
    requires emu::is_scalar_v<U>
  vec(U s) {  // broadcast
    for (int i = 0; i < N; ++i) (*this)[i] = static_cast<T>(s);
  }
  template <class... U>
    requires(sizeof...(U) == N && N > 1 && (emu::is_scalar_v<U> && ...))
  vec(U... parts) {
    int i = 0;
    ((void)((*this)[i++] = static_cast<T>(parts)), ...);
  }
  template <class U>
  explicit vec(const vec<U, N>& o) {
    for (int i = 0; i < N; ++i) (*this)[i] = static_cast<T>(o[i]);
  }

  T& operator[](int i) { return (&this->x)[i]; }
  const T& operator[](int i) const { return (&this->x)[i]; }

  static vec from_dim3(uint32_t a, uint32_t b, uint32_t c) {
    vec r;
    const uint32_t d[3] = {a, b, c};
    for (int i = 0; i < N; ++i) r[i] = static_cast<T>(i < 3 ? d[i] : 0);
    return r;
  }

  vec operator-() const {
    vec r;
    for (int i = 0; i < N; ++i) r[i] = static_cast<T>(-(*this)[i]);
    return r;
  }
};

#define EMU_VEC_ARITH(op)                                                       \
  template <class T, int N>                                                     \
  inline vec<T, N> operator op(const vec<T, N>& a, const vec<T, N>& b) {        \
    vec<T, N> r;                                                                \
    for (int i = 0; i < N; ++i) r[i] = static_cast<T>(a[i] op b[i]);            \
    return r;                                                                   \
  }                                                                             \
  template <class T, int N, class U>                                            \
    requires emu::is_scalar_v<U>                                                \
  inline vec<T, N> operator op(const vec<T, N>& a, U b) {                       \
    return a op vec<T, N>(b);                                                   \
  }                                                                             \
  template <class T, int N, class U>                                            \
    requires emu::is_scalar_v<U>                                                \
  inline vec<T, N> operator op(U a, const vec<T, N>& b) {                       \
    return vec<T, N>(a) op b;                                                   \
  }                                                                             \
  template <class T, int N, class V>                                            \
  inline vec<T, N>& operator op##=(vec<T, N> & a, const V & b) {                \
    a = a op b;                                                                 \
    return a;                                                                   \
  }
EMU_VEC_ARITH(+)
EMU_VEC_ARITH(-)
EMU_VEC_ARITH(*)
EMU_VEC_ARITH(/)
#undef EMU_VEC_ARITH

#define EMU_VEC_TYPES(T, name) \
  typedef vec<T, 2> name##2;   \
  typedef vec<T, 3> name##3;   \
  typedef vec<T, 4> name##4;
EMU_VEC_TYPES(float, float)
EMU_VEC_TYPES(half, half)
EMU_VEC_TYPES(bfloat, bfloat)
EMU_VEC_TYPES(int, int)
EMU_VEC_TYPES(uint, uint)
EMU_VEC_TYPES(short, short)
EMU_VEC_TYPES(ushort, ushort)
EMU_VEC_TYPES(char, char)
EMU_VEC_TYPES(uchar, uchar)
EMU_VEC_TYPES(long, long)
EMU_VEC_TYPES(ulong, ulong)
EMU_VEC_TYPES(bool, bool)
#undef EMU_VEC_TYPES

// ---------------------------------------------------------------------------
// metal:: math.

namespace metal {

using ::bfloat;
using ::half;
using ::uchar;
using ::uint;
using ::ulong;
using ::ushort;

namespace detail {
// Apply a float function to a scalar of any floating type, rounding back.
template <class T, class F>
inline T via_float(T x, F f) {
  return static_cast<T>(f(static_cast<float>(x)));
}
}  // namespace detail

#define EMU_UNARY(name, body)                                                         \
  inline float name(float x) { return body; }                                         \
  inline half name(half h) { return detail::via_float(h, [](float x) { return body; }); } \
  inline bfloat name(bfloat b) {                                                      \
    return detail::via_float(b, [](float x) { return body; });                        \
  }                                                                                   \
  template <class T, int N>                                                           \
  inline vec<T, N> name(const vec<T, N>& v) {                                         \
    vec<T, N> r;                                                                      \
    for (int i = 0; i < N; ++i) r[i] = name(v[i]);                                    \
    return r;                                                                         \
  }
EMU_UNARY(sqrt, std::sqrt(x))
EMU_UNARY(rsqrt, 1.0f / std::sqrt(x))
EMU_UNARY(exp, std::exp(x))
EMU_UNARY(exp2, std::exp2(x))
EMU_UNARY(log, std::log(x))
EMU_UNARY(log2, std::log2(x))
EMU_UNARY(sin, std::sin(x))
EMU_UNARY(cos, std::cos(x))
EMU_UNARY(tanh, std::tanh(x))
EMU_UNARY(floor, std::floor(x))
EMU_UNARY(ceil, std::ceil(x))
EMU_UNARY(round, std::round(x))
EMU_UNARY(trunc, std::trunc(x))
EMU_UNARY(fabs, std::fabs(x))
EMU_UNARY(saturate, std::fmin(std::fmax(x, 0.0f), 1.0f))
#undef EMU_UNARY

template <class T>
  requires emu::is_scalar_v<T>
inline T abs(T x) {
  return x < T(0) ? static_cast<T>(-x) : x;
}
template <class T>
  requires emu::is_scalar_v<T>
inline T min(T a, T b) {
  return b < a ? b : a;
}
template <class T>
  requires emu::is_scalar_v<T>
inline T max(T a, T b) {
  return a < b ? b : a;
}
template <class T>
  requires emu::is_scalar_v<T>
inline T fmin(T a, T b) {
  return static_cast<T>(std::fmin(static_cast<float>(a), static_cast<float>(b)));
}
template <class T>
  requires emu::is_scalar_v<T>
inline T fmax(T a, T b) {
  return static_cast<T>(std::fmax(static_cast<float>(a), static_cast<float>(b)));
}
template <class T>
  requires emu::is_scalar_v<T>
inline T clamp(T x, T lo, T hi) {
  return min(max(x, lo), hi);
}
template <class T>
  requires emu::is_scalar_v<T>
inline T fma(T a, T b, T c) {
  return static_cast<T>(std::fma(static_cast<float>(a), static_cast<float>(b),
                                 static_cast<float>(c)));
}
template <class T>
  requires emu::is_scalar_v<T>
inline T pow(T a, T b) {
  return static_cast<T>(std::pow(static_cast<float>(a), static_cast<float>(b)));
}
template <class T>
  requires emu::is_scalar_v<T>
inline T mix(T a, T b, T t) {
  return static_cast<T>(a + (b - a) * t);
}
template <class T>
inline T select(T a, T b, bool c) {
  return c ? b : a;
}
template <class T>
  requires emu::is_scalar_v<T>
inline bool isnan(T x) {
  return std::isnan(static_cast<float>(x));
}
template <class T>
  requires emu::is_scalar_v<T>
inline bool isinf(T x) {
  return std::isinf(static_cast<float>(x));
}
// Vector forms of the templated scalar functions, component by component.
#define EMU_VEC_FN1(name)                                  \
  template <class T, int N>                                \
  inline vec<T, N> name(const vec<T, N>& a) {              \
    vec<T, N> r;                                           \
    for (int i = 0; i < N; ++i) r[i] = name(a[i]);         \
    return r;                                              \
  }
#define EMU_VEC_FN2(name)                                           \
  template <class T, int N>                                         \
  inline vec<T, N> name(const vec<T, N>& a, const vec<T, N>& b) {   \
    vec<T, N> r;                                                    \
    for (int i = 0; i < N; ++i) r[i] = name(a[i], b[i]);            \
    return r;                                                       \
  }
#define EMU_VEC_FN3(name)                                                              \
  template <class T, int N>                                                            \
  inline vec<T, N> name(const vec<T, N>& a, const vec<T, N>& b, const vec<T, N>& c) {  \
    vec<T, N> r;                                                                       \
    for (int i = 0; i < N; ++i) r[i] = name(a[i], b[i], c[i]);                         \
    return r;                                                                          \
  }
EMU_VEC_FN1(abs)
EMU_VEC_FN2(min)
EMU_VEC_FN2(max)
EMU_VEC_FN2(fmin)
EMU_VEC_FN2(fmax)
EMU_VEC_FN2(pow)
EMU_VEC_FN3(clamp)
EMU_VEC_FN3(fma)
EMU_VEC_FN3(mix)
#undef EMU_VEC_FN1
#undef EMU_VEC_FN2
#undef EMU_VEC_FN3
template <class T, int N>
inline T dot(const vec<T, N>& a, const vec<T, N>& b) {
  T s = T(0);
  for (int i = 0; i < N; ++i) s = static_cast<T>(s + a[i] * b[i]);
  return s;
}
template <class To, class From>
inline To as_type(const From& v) {
  static_assert(sizeof(To) == sizeof(From), "as_type needs equal sizes");
  return std::bit_cast<To>(v);
}

// Metal's precise:: and fast:: variants: the emulator computes both in float.
namespace precise {
using metal::cos;
using metal::exp;
using metal::exp2;
using metal::log;
using metal::log2;
using metal::pow;
using metal::rsqrt;
using metal::sin;
using metal::sqrt;
using metal::tanh;
}  // namespace precise
namespace fast {
using namespace metal::precise;
}  // namespace fast

// ---------------------------------------------------------------------------
// Barriers.

enum class mem_flags : int {
  mem_none = 0,
  mem_device = 1,
  mem_threadgroup = 2,
  mem_texture = 4,
  mem_threadgroup_imageblock = 8,
};
inline mem_flags operator|(mem_flags a, mem_flags b) {
  return static_cast<mem_flags>(static_cast<int>(a) | static_cast<int>(b));
}

inline void threadgroup_barrier(mem_flags = mem_flags::mem_none,
                                std::source_location loc = std::source_location::current()) {
  emu::barrier_wait(loc);
}

// ---------------------------------------------------------------------------
// SIMD-group collectives over 32 lanes (only the active lanes take part).

namespace detail {

template <class T>
inline T poisoned() {
  T v;
  std::memset(static_cast<void*>(&v), 0xFF, sizeof(T));
  return v;
}
template <class T>
inline const T& in(emu::SimdCall* c) {
  return *static_cast<const T*>(c->in);
}
template <class T>
inline T& out(emu::SimdCall* c) {
  return *static_cast<T*>(c->out);
}

struct OpSum {
  template <class T>
  T operator()(const T& a, const T& b) const {
    return static_cast<T>(a + b);
  }
};
struct OpProduct {
  template <class T>
  T operator()(const T& a, const T& b) const {
    return static_cast<T>(a * b);
  }
};
struct OpMin {
  template <class T>
  T operator()(const T& a, const T& b) const {
    return metal::min(a, b);
  }
};
struct OpMax {
  template <class T>
  T operator()(const T& a, const T& b) const {
    return metal::max(a, b);
  }
};
struct OpAnd {
  template <class T>
  T operator()(const T& a, const T& b) const {
    return static_cast<T>(a & b);
  }
};
struct OpOr {
  template <class T>
  T operator()(const T& a, const T& b) const {
    return static_cast<T>(a | b);
  }
};
struct OpXor {
  template <class T>
  T operator()(const T& a, const T& b) const {
    return static_cast<T>(a ^ b);
  }
};

// Reduction over the active lanes, in lane order; everyone gets the result.
template <class T, class Op>
void apply_reduce(emu::SimdCall** lanes) {
  T acc{};
  bool any = false;
  for (uint32_t i = 0; i < emu::kSimdWidth; ++i) {
    if (!lanes[i]) continue;
    acc = any ? Op{}(acc, in<T>(lanes[i])) : in<T>(lanes[i]);
    any = true;
  }
  for (uint32_t i = 0; i < emu::kSimdWidth; ++i)
    if (lanes[i]) out<T>(lanes[i]) = acc;
}

// Prefix scans over the active lanes in lane order.
template <class T, class Op, bool Inclusive>
void apply_scan(emu::SimdCall** lanes) {
  T acc{};
  bool any = false;
  for (uint32_t i = 0; i < emu::kSimdWidth; ++i) {
    if (!lanes[i]) continue;
    const T v = in<T>(lanes[i]);
    const T next = any ? Op{}(acc, v) : v;
    if (Inclusive) {
      out<T>(lanes[i]) = next;
    } else {
      out<T>(lanes[i]) = any ? acc : static_cast<T>(std::is_same_v<Op, OpProduct> ? 1 : 0);
    }
    acc = next;
    any = true;
  }
}

enum ShuffleKind { kIndex, kDown, kUp, kXor, kRotateDown, kRotateUp };

// Each lane reads the value of a source lane; an inactive source yields
// poison (the hardware result is undefined), a source beyond the simdgroup
// keeps the lane's own value for the down/up shifts.
template <class T, int Kind>
void apply_shuffle(emu::SimdCall** lanes) {
  constexpr int W = static_cast<int>(emu::kSimdWidth);
  T result[W];
  for (int i = 0; i < W; ++i) {
    if (!lanes[i]) continue;
    const int a = lanes[i]->arg;
    int src = i;
    switch (Kind) {
      case kIndex: src = a; break;
      case kDown: src = i + a < W ? i + a : i; break;
      case kUp: src = i - a >= 0 ? i - a : i; break;
      case kXor: src = (i ^ a) & (W - 1); break;
      case kRotateDown: src = (i + a) % W; break;
      case kRotateUp: src = ((i - a) % W + W) % W; break;
    }
    result[i] = (src >= 0 && src < W && lanes[src]) ? in<T>(lanes[src]) : poisoned<T>();
  }
  for (int i = 0; i < W; ++i)
    if (lanes[i]) out<T>(lanes[i]) = result[i];
}

template <class T>
void apply_broadcast_first(emu::SimdCall** lanes) {
  const T* first = nullptr;
  for (uint32_t i = 0; i < emu::kSimdWidth && !first; ++i)
    if (lanes[i]) first = &in<T>(lanes[i]);
  for (uint32_t i = 0; i < emu::kSimdWidth; ++i)
    if (lanes[i]) out<T>(lanes[i]) = *first;
}

template <bool All>
void apply_vote(emu::SimdCall** lanes) {
  bool r = All;
  for (uint32_t i = 0; i < emu::kSimdWidth; ++i)
    if (lanes[i]) r = All ? (r && in<bool>(lanes[i])) : (r || in<bool>(lanes[i]));
  for (uint32_t i = 0; i < emu::kSimdWidth; ++i)
    if (lanes[i]) out<bool>(lanes[i]) = r;
}

inline void apply_is_first(emu::SimdCall** lanes) {
  bool first = true;
  for (uint32_t i = 0; i < emu::kSimdWidth; ++i) {
    if (!lanes[i]) continue;
    out<bool>(lanes[i]) = first;
    first = false;
  }
}

inline void apply_nothing(emu::SimdCall**) {}

template <class T>
inline T collective(const T& v, int32_t arg, emu::SimdApply apply,
                    const std::source_location& loc) {
  T result;
  emu::SimdCall call{apply, &v, &result, arg, loc.file_name(), loc.line(), loc.column()};
  emu::simd_wait(&call);
  return result;
}

}  // namespace detail

using SL = std::source_location;

#define EMU_SIMD_REDUCE(name, Op)                                                        \
  template <class T>                                                                     \
  inline T name(T v, SL loc = SL::current()) {                                           \
    return detail::collective(v, 0, &detail::apply_reduce<T, detail::Op>, loc);           \
  }
EMU_SIMD_REDUCE(simd_sum, OpSum)
EMU_SIMD_REDUCE(simd_product, OpProduct)
EMU_SIMD_REDUCE(simd_min, OpMin)
EMU_SIMD_REDUCE(simd_max, OpMax)
EMU_SIMD_REDUCE(simd_and, OpAnd)
EMU_SIMD_REDUCE(simd_or, OpOr)
EMU_SIMD_REDUCE(simd_xor, OpXor)
#undef EMU_SIMD_REDUCE

#define EMU_SIMD_SCAN(name, Op, Inclusive)                                                    \
  template <class T>                                                                          \
  inline T name(T v, SL loc = SL::current()) {                                                \
    return detail::collective(v, 0, &detail::apply_scan<T, detail::Op, Inclusive>, loc);      \
  }
EMU_SIMD_SCAN(simd_prefix_inclusive_sum, OpSum, true)
EMU_SIMD_SCAN(simd_prefix_exclusive_sum, OpSum, false)
EMU_SIMD_SCAN(simd_prefix_inclusive_product, OpProduct, true)
EMU_SIMD_SCAN(simd_prefix_exclusive_product, OpProduct, false)
#undef EMU_SIMD_SCAN

#define EMU_SIMD_SHUFFLE(name, Kind)                                                    \
  template <class T>                                                                    \
  inline T name(T v, ushort arg, SL loc = SL::current()) {                              \
    return detail::collective(v, static_cast<int32_t>(arg),                             \
                              &detail::apply_shuffle<T, detail::Kind>, loc);            \
  }
EMU_SIMD_SHUFFLE(simd_shuffle, kIndex)
EMU_SIMD_SHUFFLE(simd_broadcast, kIndex)
EMU_SIMD_SHUFFLE(simd_shuffle_down, kDown)
EMU_SIMD_SHUFFLE(simd_shuffle_up, kUp)
EMU_SIMD_SHUFFLE(simd_shuffle_xor, kXor)
EMU_SIMD_SHUFFLE(simd_shuffle_rotate_down, kRotateDown)
EMU_SIMD_SHUFFLE(simd_shuffle_rotate_up, kRotateUp)
#undef EMU_SIMD_SHUFFLE

template <class T>
inline T simd_broadcast_first(T v, SL loc = SL::current()) {
  return detail::collective(v, 0, &detail::apply_broadcast_first<T>, loc);
}
inline bool simd_all(bool v, SL loc = SL::current()) {
  return detail::collective(v, 0, &detail::apply_vote<true>, loc);
}
inline bool simd_any(bool v, SL loc = SL::current()) {
  return detail::collective(v, 0, &detail::apply_vote<false>, loc);
}
inline bool simd_is_first(SL loc = SL::current()) {
  return detail::collective(false, 0, &detail::apply_is_first, loc);
}
inline void simdgroup_barrier(mem_flags = mem_flags::mem_none, SL loc = SL::current()) {
  detail::collective(false, 0, &detail::apply_nothing, loc);
}

// ---------------------------------------------------------------------------
// simdgroup_matrix<T, 8, 8>: 8x8 matrices held by the 32 lanes of a simdgroup.
//
// On the GPU each lane holds two elements of the matrix.  The emulator gives
// every lane a full 64-element copy but treats only the lane's own two
// elements as its data: every collective (load, store, multiply) assembles the
// matrix from the owning lanes' copies and writes its result to every lane.
// A lane can only change its own elements (through thread_elements()), so the
// copies can never disagree where it matters.
//
// Lane ownership (what thread_elements() exposes): lane l holds row
//   r = (q & 4) + (l / 2) % 4,   columns c = (q & 2) * 2 + (l % 2) * 2 and c + 1,
// with q = l / 4.  That is the layout measured on Apple GPUs and published
// with the reverse-engineered simdgroup_matrix internals (Philip Turner's
// metal-flash-attention, after patent US11256518B2); Apple does not document
// it, so here it is a model.  Nothing in opforge's kernels depends on it
// except through thread_elements().
//
// Every operation is a collective of all 32 lanes: lanes reaching it at the
// same call site take part, and if any lane of the simdgroup does not (it
// diverged, returned, or the simdgroup has fewer than 32 lanes) the launch
// fails with an error naming the call site.  All lanes must also pass the
// same pointer, stride, origin and transpose flag (uniform arguments).
//
// Addressing (load and store alike): with base = src + origin.y * elements_per_row
// + origin.x, element (r, c) of the matrix is base[r * elements_per_row + c], or
// base[c * elements_per_row + r] with transpose.  Arithmetic is float32, each
// product summed in k order, then rounded to the destination element type.

template <class T, int C, int R>
struct alignas(16) simdgroup_matrix {
  static_assert(C == 8 && R == 8, "the emulator models 8x8 simdgroup matrices only");
  T e[64];

  simdgroup_matrix() { std::memset(static_cast<void*>(e), 0xFF, sizeof(e)); }  // poison
  // MSL: a diagonal matrix with dval on the diagonal.
  explicit simdgroup_matrix(T dval) {
    for (int i = 0; i < 64; ++i) e[i] = (i / 8 == i % 8) ? dval : T(0);
  }
  static int owned_offset(uint32_t lane) {
    const uint32_t q = lane / 4;
    const uint32_t r = (q & 4) + (lane / 2) % 4;
    const uint32_t c = (q & 2) * 2 + (lane % 2) * 2;
    return static_cast<int>(r * 8 + c);
  }
  vec<T, 2>& thread_elements() {
    return *reinterpret_cast<vec<T, 2>*>(&e[owned_offset(emu::this_lane().coords.thread_index_in_simdgroup)]);
  }
};

typedef simdgroup_matrix<float, 8, 8> simdgroup_float8x8;
typedef simdgroup_matrix<half, 8, 8> simdgroup_half8x8;
typedef simdgroup_matrix<bfloat, 8, 8> simdgroup_bfloat8x8;

template <class T, int C, int R>
inline simdgroup_matrix<T, C, R> make_filled_simdgroup_matrix(T value) {
  simdgroup_matrix<T, C, R> m;
  for (int i = 0; i < 64; ++i) m.e[i] = value;
  return m;
}

namespace detail {

// The error a collective reports; the first one wins.
inline void sgm_error(emu::SimdCall** lanes, const char* what, const char* detail_text) {
  const emu::SimdCall* any = nullptr;
  for (uint32_t i = 0; i < emu::kSimdWidth && !any; ++i) any = lanes[i];
  std::string msg = std::string(what) + " at " + any->file + ":" + std::to_string(any->line) + ": " + detail_text;
  if (emu::tls_worker->error.empty()) emu::tls_worker->error = msg;
}

inline bool sgm_all_lanes(emu::SimdCall** lanes, const char* what) {
  int n = 0;
  for (uint32_t i = 0; i < emu::kSimdWidth; ++i) n += lanes[i] != nullptr;
  if (n == static_cast<int>(emu::kSimdWidth)) return true;
  std::string d = "only " + std::to_string(n) +
                  " of 32 lanes of the simdgroup took part (simdgroup matrix operations need all 32 lanes; "
                  "the others diverged, returned, or do not exist)";
  sgm_error(lanes, what, d.c_str());
  return false;
}

// The matrix as the lanes hold it: element (r, c) from the lane that owns it.
template <class M>
inline void sgm_gather(emu::SimdCall** lanes, const M* const* mats, float* out) {
  for (uint32_t l = 0; l < emu::kSimdWidth; ++l) {
    const int o = M::owned_offset(l);
    out[o] = static_cast<float>(mats[l]->e[o]);
    out[o + 1] = static_cast<float>(mats[l]->e[o + 1]);
  }
  (void)lanes;
}

template <class P>
struct SgmMemArgs {
  P ptr;
  ulong elements_per_row;
  ulong2 origin;
  bool transpose;
  const void* mat;  // store: the matrix to store
};

template <class P>
inline bool sgm_uniform(emu::SimdCall** lanes, const char* what) {
  const auto& a = in<SgmMemArgs<P>>(lanes[0]);
  for (uint32_t i = 1; i < emu::kSimdWidth; ++i) {
    const auto& b = in<SgmMemArgs<P>>(lanes[i]);
    if (b.ptr != a.ptr || b.elements_per_row != a.elements_per_row || b.origin.x != a.origin.x ||
        b.origin.y != a.origin.y || b.transpose != a.transpose) {
      sgm_error(lanes, what, "lanes passed different pointers, strides, origins or transpose flags");
      return false;
    }
  }
  return true;
}

inline size_t sgm_index(const ulong& epr, const ulong2& origin, bool transpose, int r, int c) {
  const size_t base = origin.y * epr + origin.x;
  return transpose ? base + size_t(c) * epr + r : base + size_t(r) * epr + c;
}

template <class T, class U>
void apply_sgm_load(emu::SimdCall** lanes) {
  if (!sgm_all_lanes(lanes, "simdgroup_load") || !sgm_uniform<const U*>(lanes, "simdgroup_load")) return;
  const auto& a = in<SgmMemArgs<const U*>>(lanes[0]);
  simdgroup_matrix<T, 8, 8> m;
  for (int r = 0; r < 8; ++r)
    for (int c = 0; c < 8; ++c)
      m.e[r * 8 + c] = static_cast<T>(a.ptr[sgm_index(a.elements_per_row, a.origin, a.transpose, r, c)]);
  for (uint32_t i = 0; i < emu::kSimdWidth; ++i) out<simdgroup_matrix<T, 8, 8>>(lanes[i]) = m;
}

template <class T, class U>
void apply_sgm_store(emu::SimdCall** lanes) {
  if (!sgm_all_lanes(lanes, "simdgroup_store") || !sgm_uniform<U*>(lanes, "simdgroup_store")) return;
  using M = simdgroup_matrix<T, 8, 8>;
  const M* mats[emu::kSimdWidth];
  for (uint32_t i = 0; i < emu::kSimdWidth; ++i) mats[i] = static_cast<const M*>(in<SgmMemArgs<U*>>(lanes[i]).mat);
  float v[64];
  sgm_gather(lanes, mats, v);
  const auto& a = in<SgmMemArgs<U*>>(lanes[0]);
  for (int r = 0; r < 8; ++r)
    for (int c = 0; c < 8; ++c)
      a.ptr[sgm_index(a.elements_per_row, a.origin, a.transpose, r, c)] = static_cast<U>(static_cast<T>(v[r * 8 + c]));
}

struct SgmMulArgs {
  const void* a;
  const void* b;
  const void* c;  // nullptr: simdgroup_multiply
};

template <class TD, class TA, class TB, class TC>
void apply_sgm_mma(emu::SimdCall** lanes) {
  const emu::SimdCall* first = nullptr;
  for (uint32_t i = 0; i < emu::kSimdWidth && !first; ++i) first = lanes[i];
  const bool acc = static_cast<const SgmMulArgs*>(first->in)->c != nullptr;
  const char* what = acc ? "simdgroup_multiply_accumulate" : "simdgroup_multiply";
  if (!sgm_all_lanes(lanes, what)) return;
  using MA = simdgroup_matrix<TA, 8, 8>;
  using MB = simdgroup_matrix<TB, 8, 8>;
  using MC = simdgroup_matrix<TC, 8, 8>;
  const MA* am[emu::kSimdWidth];
  const MB* bm[emu::kSimdWidth];
  const MC* cm[emu::kSimdWidth];
  for (uint32_t i = 0; i < emu::kSimdWidth; ++i) {
    const auto& x = in<SgmMulArgs>(lanes[i]);
    am[i] = static_cast<const MA*>(x.a);
    bm[i] = static_cast<const MB*>(x.b);
    cm[i] = static_cast<const MC*>(x.c);
  }
  float av[64], bv[64], cv[64] = {};
  sgm_gather(lanes, am, av);
  sgm_gather(lanes, bm, bv);
  if (acc) sgm_gather(lanes, cm, cv);
  simdgroup_matrix<TD, 8, 8> d;
  for (int r = 0; r < 8; ++r)
    for (int c = 0; c < 8; ++c) {
      float s = 0.0f;
      for (int k = 0; k < 8; ++k) s += av[r * 8 + k] * bv[k * 8 + c];
      d.e[r * 8 + c] = static_cast<TD>(s + cv[r * 8 + c]);
    }
  // Results are written after every input was read: d may alias a, b or c.
  for (uint32_t i = 0; i < emu::kSimdWidth; ++i) out<simdgroup_matrix<TD, 8, 8>>(lanes[i]) = d;
}

}  // namespace detail

template <class T, class U>
inline void simdgroup_load(simdgroup_matrix<T, 8, 8>& d, const U* src, ulong elements_per_row = 8,
                           ulong2 matrix_origin = ulong2(0), bool transpose_matrix = false,
                           SL loc = SL::current()) {
  detail::SgmMemArgs<const U*> a{src, elements_per_row, matrix_origin, transpose_matrix, nullptr};
  emu::SimdCall call{&detail::apply_sgm_load<T, U>, &a, &d, 0, loc.file_name(), loc.line(), loc.column()};
  emu::simd_wait(&call);
}

template <class T, class U>
inline void simdgroup_store(const simdgroup_matrix<T, 8, 8>& m, U* dst, ulong elements_per_row = 8,
                            ulong2 matrix_origin = ulong2(0), bool transpose_matrix = false,
                            SL loc = SL::current()) {
  detail::SgmMemArgs<U*> a{dst, elements_per_row, matrix_origin, transpose_matrix, &m};
  emu::SimdCall call{&detail::apply_sgm_store<T, U>, &a, nullptr, 0, loc.file_name(), loc.line(), loc.column()};
  emu::simd_wait(&call);
}

template <class TD, class TA, class TB, class TC>
inline void simdgroup_multiply_accumulate(simdgroup_matrix<TD, 8, 8>& d, const simdgroup_matrix<TA, 8, 8>& a,
                                          const simdgroup_matrix<TB, 8, 8>& b,
                                          const simdgroup_matrix<TC, 8, 8>& c, SL loc = SL::current()) {
  detail::SgmMulArgs x{&a, &b, &c};
  emu::SimdCall call{&detail::apply_sgm_mma<TD, TA, TB, TC>, &x, &d, 0, loc.file_name(), loc.line(),
                     loc.column()};
  emu::simd_wait(&call);
}

template <class TD, class TA, class TB>
inline void simdgroup_multiply(simdgroup_matrix<TD, 8, 8>& d, const simdgroup_matrix<TA, 8, 8>& a,
                               const simdgroup_matrix<TB, 8, 8>& b, SL loc = SL::current()) {
  detail::SgmMulArgs x{&a, &b, nullptr};
  emu::SimdCall call{&detail::apply_sgm_mma<TD, TA, TB, TD>, &x, &d, 0, loc.file_name(), loc.line(),
                     loc.column()};
  emu::simd_wait(&call);
}

#define EMU_VEC_ALIASES(name) \
  using ::name##2;            \
  using ::name##3;            \
  using ::name##4;
EMU_VEC_ALIASES(float)
EMU_VEC_ALIASES(half)
EMU_VEC_ALIASES(bfloat)
EMU_VEC_ALIASES(int)
EMU_VEC_ALIASES(uint)
EMU_VEC_ALIASES(short)
EMU_VEC_ALIASES(ushort)
EMU_VEC_ALIASES(char)
EMU_VEC_ALIASES(uchar)
EMU_VEC_ALIASES(long)
EMU_VEC_ALIASES(ulong)
EMU_VEC_ALIASES(bool)
#undef EMU_VEC_ALIASES

}  // namespace metal

#define HALF_MAX 65504.0f
#define HALF_MIN 6.103515625e-05f
#define MAXHALF HALF_MAX

// ---------------------------------------------------------------------------
// Address spaces: after the rewrite they only qualify pointers and references.
#define device
#define constant
#define thread
#define threadgroup
