#pragma once
// Branch-free exp, log, digamma, ln Gamma and cos and sin of 2 pi u for the vector kernels (the
// LDA's document fixed point and refresh of exp(E[ln beta]), the HMM's Gaussian emissions, the
// Box-Muller normals of core/rng.cpp), written once for a double and for GCC's generic vectors
// (Vec4, Vec8 in core/vec4.hpp). They are plain arithmetic, integer bit operations and selects,
// with no calls into libm and no division in exp.
//
// A vector lane performs the operations of the scalar call on its element, but GCC may fuse
// multiply-adds differently in vector and scalar code, so a lane can differ from the scalar call
// in the last bit (tests/unit/test_math.cpp: within 4 ulp; seen for digamma and lgamma near
// x = 4e-6). Kernels therefore send each element through a path fixed by the problem's shape
// (K, D), never by the thread or the rank count. Written with explicit vectors, a kernel
// vectorises on every instruction set; GCC's own vectoriser if-converts the scalar form's selects
// only with AVX-512's masks.
//
// Accuracy (checked against libm and math::digamma in the unit tests):
//   exp: within one ulp of std::exp for x in [-708, 709]; 0 below -708 (no subnormals).
//   log: a few ulp for positive normal x.
//   digamma: error below 1e-14 * max(1, |psi(x)|) for x > 0.
//   lgamma: error below 1e-13 * max(1, |ln Gamma(x)|) for x > 0.
//   cos_sin_turn: absolute error below 1.5 ulp of 1 for u in [0, 1].
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "core/vec4.hpp"

namespace caviar::math::fast {

namespace detail {

// The unsigned integer type with T's layout: its bits, for the exponent field.
template <class T>
struct UintOf;
template <>
struct UintOf<double> {
  using type = std::uint64_t;
};
template <>
struct UintOf<Vec4> {
  using type = Vec4u;
};
template <>
struct UintOf<Vec8> {
  using type = Vec8u;
};
template <class T>
using Uint = typename UintOf<T>::type;

template <class T>
inline Uint<T> to_bits(T x) {
  Uint<T> u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}
template <class T>
inline T from_bits(Uint<T> u) {
  T x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}
}  // namespace detail

// exp(x) = 2^n exp(r), n = round(x / ln 2), |r| <= ln(2) / 2: the reduction of Cody and Waite
// (1980) with ln 2 split in a 32-bit head (n ln2_hi is exact for every |n| <= 1024) and its tail;
// exp(r) by its Taylor series to r^13 (the next term is below 2^-56 relative) by Horner's rule;
// 2^n put into the exponent bits.
template <class T>
inline T exp(T x) {
  constexpr double kLog2e = 1.4426950408889634074;
  constexpr double kLn2Hi = 6.93147180369123816490e-01;  // 32 significant bits
  constexpr double kLn2Lo = 1.90821492927058770002e-10;
  constexpr double kShifter = 0x1.8p52;  // adding it rounds to an integer in the low bits
  const T xc = x < -708.0 ? splat<T>(-708.0) : (x > 709.0 ? splat<T>(709.0) : x);
  const T t = xc * kLog2e + kShifter;
  const T n = t - kShifter;
  const T r = (xc - n * kLn2Hi) - n * kLn2Lo;
  T p = splat<T>(1.0 / 6227020800.0);  // 1/13!
  p = p * r + 1.0 / 479001600.0;
  p = p * r + 1.0 / 39916800.0;
  p = p * r + 1.0 / 3628800.0;
  p = p * r + 1.0 / 362880.0;
  p = p * r + 1.0 / 40320.0;
  p = p * r + 1.0 / 5040.0;
  p = p * r + 1.0 / 720.0;
  p = p * r + 1.0 / 120.0;
  p = p * r + 1.0 / 24.0;
  p = p * r + 1.0 / 6.0;
  p = p * r + 0.5;
  p = p * r + 1.0;
  p = p * r + 1.0;
  // 2^n from the integer n held in the low bits of t: n + 1023 in the exponent field.
  const auto nbits = detail::to_bits(t) - detail::to_bits(splat<T>(kShifter));
  const T scale = detail::from_bits<T>((nbits + 1023) << 52);
  return x < -708.0 ? splat<T>(0.0) : p * scale;
}

// ln x for positive normal x: x = m 2^e with m in [sqrt(1/2), sqrt(2)), ln m = 2 atanh(s) with
// s = (m - 1)/(m + 1), |s| <= 0.172, by its series to s^23.
template <class T>
inline T log(T x) {
  constexpr double kLn2Hi = 6.93147180369123816490e-01;
  constexpr double kLn2Lo = 1.90821492927058770002e-10;
  constexpr double kSqrt2 = 1.4142135623730950488;
  const auto bits = detail::to_bits(x);
  const T m0 = detail::from_bits<T>((bits & 0x000FFFFFFFFFFFFFull) | 0x3FF0000000000000ull);
  // 1 where m0 > sqrt 2. For a double as arithmetic rather than a select: GCC's vectoriser then
  // if-converts loops holding several logarithms.
  T big;
  if constexpr (std::is_same_v<T, double>)
    big = static_cast<double>(m0 > kSqrt2);
  else
    big = m0 > kSqrt2 ? splat<T>(1.0) : splat<T>(0.0);
  const T m = m0 * (1.0 - 0.5 * big);
  // The exponent as a double without an integer conversion: 2^52 + biased exponent, minus
  // 2^52 + 1023.
  const T e = detail::from_bits<T>((bits >> 52) | 0x4330000000000000ull) - (0x1p52 + 1023.0) + big;
  const T s = (m - 1.0) / (m + 1.0);
  const T s2 = s * s;
  T p = splat<T>(1.0 / 23);
  p = p * s2 + 1.0 / 21;
  p = p * s2 + 1.0 / 19;
  p = p * s2 + 1.0 / 17;
  p = p * s2 + 1.0 / 15;
  p = p * s2 + 1.0 / 13;
  p = p * s2 + 1.0 / 11;
  p = p * s2 + 1.0 / 9;
  p = p * s2 + 1.0 / 7;
  p = p * s2 + 1.0 / 5;
  p = p * s2 + 1.0 / 3;
  const T ln_m = 2.0 * s + 2.0 * s * s2 * p;
  return e * kLn2Hi + (e * kLn2Lo + ln_m);
}

// cos(2 pi u) and sin(2 pi u) for u in [0, 1]: 4 u = n + r with n the nearest integer and
// |r| <= 1/2, exactly (4 u, n and r lie on u's grid); cos and sin of (pi / 2) r by their Taylor
// series to r^18 and r^17 (the first omitted terms are below 1e-17); then the quadrant n mod 4
// swaps them (n odd) and negates them (cos for n = 1, 2; sin for n = 2, 3) through the sign bit.
// Within 1.5 ulp of 1 (the unit tests). For Box-Muller normals (core/rng.cpp).
template <class T>
inline void cos_sin_turn(T u, T& cosine, T& sine) {
  // (-1)^j (pi/2)^(2j) / (2j)! and (-1)^j (pi/2)^(2j+1) / (2j+1)!, rounded to double.
  constexpr double kCos[10] = {
      0x1.0000000000000p+0,  -0x1.3bd3cc9be45dep+0,  0x1.03c1f081b5ac4p-2,  -0x1.55d3c7e3cbffap-6,
      0x1.e1f506891babbp-11, -0x1.a6d1f2a204a8cp-16, 0x1.f9d38a3763cc3p-22, -0x1.b6e24f44b128fp-28,
      0x1.20c62c2f2d7f5p-34, -0x1.2a0c591af8314p-41};
  constexpr double kSin[9] = {0x1.921fb54442d18p+0,  -0x1.4abbce625be53p-1,  0x1.466bc6775aae2p-4,
                              -0x1.32d2cce62bd86p-8, 0x1.50783487ee782p-13,  -0x1.e3074fde8871fp-19,
                              0x1.e8f434d018d63p-25, -0x1.6fadb9f155744p-31, 0x1.aaec32af93359p-38};
  constexpr double kShifter = 0x1.8p52;  // adding it rounds to an integer in the low bits
  const T t = u * 4.0;
  const T shifted = t + kShifter;
  const T r = t - (shifted - kShifter);
  const T x = r * r;
  T c = splat<T>(kCos[9]);
  for (int j = 8; j >= 0; --j) c = c * x + kCos[j];
  T s = splat<T>(kSin[8]);
  for (int j = 7; j >= 0; --j) s = s * x + kSin[j];
  s = s * r;
  const auto q = detail::to_bits(shifted);  // n in the low bits
  const auto odd = (q & 1) != 0;
  const T c1 = odd ? s : c, s1 = odd ? c : s;
  cosine = detail::from_bits<T>(detail::to_bits(c1) ^ (((q + 1) & 2) << 62));
  sine = detail::from_bits<T>(detail::to_bits(s1) ^ ((q & 2) << 62));
}

// psi(x) for x > 0: psi(x) = psi(x + 10) - sum_{i<10} 1/(x + i), then the asymptotic series at
// y = x + 10 >= 10 to B_12 (first omitted term below 1e-15), as math::digamma. Divisions are the
// slow part of a vector lane, so the ten reciprocals are summed as two fractions N/D of five
// terms each (N/D + 1/a = (N a + D)/(D a)); above 1e50, where D would overflow, by 10/x + the
// first correction.
// digamma_rest gives c(x) in psi(x) = ln y - c(x) with y = x + 10, shared by digamma and
// exp_digamma.
template <class T>
inline T digamma_rest(T x, T y) {
  T n1 = splat<T>(1.0), d1 = x, n2 = splat<T>(1.0), d2 = x + 5.0;
  n1 = n1 * (x + 1.0) + d1, d1 *= x + 1.0, n2 = n2 * (x + 6.0) + d2, d2 *= x + 6.0;
  n1 = n1 * (x + 2.0) + d1, d1 *= x + 2.0, n2 = n2 * (x + 7.0) + d2, d2 *= x + 7.0;
  n1 = n1 * (x + 3.0) + d1, d1 *= x + 3.0, n2 = n2 * (x + 8.0) + d2, d2 *= x + 8.0;
  n1 = n1 * (x + 4.0) + d1, d1 *= x + 4.0, n2 = n2 * (x + 9.0) + d2, d2 *= x + 9.0;
  const T recip = x > 1e50 ? 10.0 / x : n1 / d1 + n2 / d2;
  const T r = 1.0 / y;
  const T f = r * r;
  const T series =
      f *
      (1.0 / 12 -
       f * (1.0 / 120 - f * (1.0 / 252 - f * (1.0 / 240 - f * (1.0 / 132 - f * (691.0 / 32760))))));
  return 0.5 * r + series + recip;
}

template <class T>
inline T digamma(T x) {
  const T y = x + 10.0;
  return fast::log(y) - digamma_rest(x, y);
}

// exp(psi(x) - c) = y exp(-(c(x) + c)) with psi(x) = ln y - c(x): the logarithm cancels, so the
// document fixed point and the refresh of exp(E[ln beta]) need one exp and no log per value.
// Relative error a few ulp (the exp's); 0 where the exponent is below -708.
template <class T>
inline T exp_digamma(T x, T c) {
  const T y = x + 10.0;
  return y * fast::exp<T>(-(digamma_rest(x, y) + c));
}

// ln Gamma(x) for x > 0: ln Gamma(x) = ln Gamma(x + 10) - ln(x (x + 1) ... (x + 9)), the product
// in two halves (one logarithm each; above 1e50, where they would overflow, ten logarithms are
// replaced by 10 ln x + 45/x), then Stirling's series at y = x + 10 to y^-9 (the first omitted
// term is below 1e-14 at y = 10). The subtraction of two large logarithms leaves an absolute error
// of about 2e-14 near the minimum of ln Gamma: used for sums of many terms (the ELBO), not for
// ratios of nearly equal gammas.
template <class T>
inline T lgamma(T x) {
  const T p1 = x * (x + 1.0) * (x + 2.0) * (x + 3.0) * (x + 4.0);
  const T p2 = (x + 5.0) * (x + 6.0) * (x + 7.0) * (x + 8.0) * (x + 9.0);
  // Both logarithms are always taken (of selected arguments), so there are no branches.
  const auto big = x > 1e50;
  const T l1 = fast::log<T>(big ? x : p1), l2 = fast::log<T>(big ? splat<T>(1.0) : p2);
  const T inv = 45.0 / x;
  const T shift = big ? 10.0 * l1 + inv : l1 + l2;
  const T y = x + 10.0;
  const T r = 1.0 / y;
  const T f = r * r;
  // sum_k B_2k / (2k (2k - 1) y^(2k - 1)), k = 1..5
  const T series =
      r * (1.0 / 12 - f * (1.0 / 360 - f * (1.0 / 1260 - f * (1.0 / 1680 - f * (1.0 / 1188)))));
  constexpr double kHalfLog2Pi = 0.91893853320467274178;
  return (y - 0.5) * fast::log(y) - y + kHalfLog2Pi + series - shift;
}

}  // namespace caviar::math::fast
