#pragma once
// Branch-free exp, log and digamma for the LDA kernels. Written as plain arithmetic and integer
// bit operations (no calls into libm) so that GCC vectorises loops over them
// (`#pragma omp simd`): the document fixed point needs K digammas and K exps per sweep and
// refreshing exp(E[ln beta]) needs K per word, which in scalar libm calls cost more than the
// sweep's matrix-vector products.
//
// Every lane computes exactly the same operations whether a loop is vectorised or not, so results
// do not depend on which elements fall into a vector body or a remainder loop.
//
// Accuracy (checked against std::exp, std::log and math::digamma in unit.lda):
//   fast_exp: relative error of a few ulp for x in [-708, 709]; 0 below -708 (no subnormals).
//   fast_log: a few ulp for positive normal x.
//   fast_digamma: error below 1e-14 * max(1, |psi(x)|) for x > 0.
//   fast_lgamma: error below 1e-13 * max(1, |ln Gamma(x)|) for x > 0.
#include <bit>
#include <cstdint>

namespace caviar::lda::fast {

// exp(x) = 2^n exp(r), n = round(x / ln 2), |r| <= ln(2) / 2 (Cody & Waite reduction with a
// split ln 2), exp(r) by its Taylor series to r^13 (the next term is below 2^-56 relative).
inline double exp(double x) {
  constexpr double kLog2e = 1.4426950408889634074;
  constexpr double kLn2Hi = 6.93147180369123816490e-01;  // 32 significant bits
  constexpr double kLn2Lo = 1.90821492927058770002e-10;
  constexpr double kShifter = 0x1.8p52;  // adding it rounds to an integer in the low bits
  const double xc = x < -708.0 ? -708.0 : (x > 709.0 ? 709.0 : x);
  const double t = xc * kLog2e + kShifter;
  const double n = t - kShifter;
  const double r = (xc - n * kLn2Hi) - n * kLn2Lo;
  double p = 1.0 / 6227020800.0;  // 1/13!
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
  const std::uint64_t nbits =
      std::bit_cast<std::uint64_t>(t) - std::bit_cast<std::uint64_t>(kShifter);
  const double scale = std::bit_cast<double>((nbits + 1023) << 52);
  return x < -708.0 ? 0.0 : p * scale;
}

// ln x for positive normal x: x = m 2^e with m in [sqrt(1/2), sqrt(2)), ln m = 2 atanh(s) with
// s = (m - 1)/(m + 1), |s| <= 0.172, by its series to s^23.
inline double log(double x) {
  constexpr double kLn2Hi = 6.93147180369123816490e-01;
  constexpr double kLn2Lo = 1.90821492927058770002e-10;
  constexpr double kSqrt2 = 1.4142135623730950488;
  const std::uint64_t bits = std::bit_cast<std::uint64_t>(x);
  const double m0 = std::bit_cast<double>((bits & 0x000FFFFFFFFFFFFFull) | 0x3FF0000000000000ull);
  // Arithmetic rather than selects: GCC then if-converts loops holding several logarithms.
  const double big = static_cast<double>(m0 > kSqrt2);
  const double m = m0 * (1.0 - 0.5 * big);
  // The exponent as a double without an integer conversion (which GCC treats as possibly
  // trapping and will not if-convert): 2^52 + biased exponent, minus 2^52 + 1023.
  const double e =
      std::bit_cast<double>((bits >> 52) | 0x4330000000000000ull) - (0x1p52 + 1023.0) + big;
  const double s = (m - 1.0) / (m + 1.0);
  const double s2 = s * s;
  double p = 1.0 / 23;
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
  const double ln_m = 2.0 * s + 2.0 * s * s2 * p;
  return e * kLn2Hi + (e * kLn2Lo + ln_m);
}

// psi(x) for x > 0: psi(x) = psi(x + 10) - sum_{i<10} 1/(x + i), then the asymptotic series at
// y = x + 10 >= 10 to B_12 (first omitted term below 1e-15), as math::digamma. Divisions are the
// slow part of a vector lane, so the ten reciprocals are summed as two fractions N/D of five
// terms each (N/D + 1/a = (N a + D)/(D a)); above 1e50, where D would overflow, by 10/x + the
// first correction.
// The parts of psi(x) = ln y - c(x) with y = x + 10, shared by digamma and exp_digamma.
inline double digamma_rest(double x, double y) {
  // Written out (no inner loop), so that loops over digamma if-convert and vectorise.
  double n1 = 1.0, d1 = x, n2 = 1.0, d2 = x + 5.0;
  n1 = n1 * (x + 1.0) + d1, d1 *= x + 1.0, n2 = n2 * (x + 6.0) + d2, d2 *= x + 6.0;
  n1 = n1 * (x + 2.0) + d1, d1 *= x + 2.0, n2 = n2 * (x + 7.0) + d2, d2 *= x + 7.0;
  n1 = n1 * (x + 3.0) + d1, d1 *= x + 3.0, n2 = n2 * (x + 8.0) + d2, d2 *= x + 8.0;
  n1 = n1 * (x + 4.0) + d1, d1 *= x + 4.0, n2 = n2 * (x + 9.0) + d2, d2 *= x + 9.0;
  const double recip = x > 1e50 ? 10.0 / x : n1 / d1 + n2 / d2;
  const double r = 1.0 / y;
  const double f = r * r;
  const double series =
      f *
      (1.0 / 12 -
       f * (1.0 / 120 - f * (1.0 / 252 - f * (1.0 / 240 - f * (1.0 / 132 - f * (691.0 / 32760))))));
  return 0.5 * r + series + recip;
}

inline double digamma(double x) {
  const double y = x + 10.0;
  return fast::log(y) - digamma_rest(x, y);
}

// exp(psi(x) - c) = y exp(-(c(x) + c)) with psi(x) = ln y - c(x): the logarithm cancels, so the
// document fixed point and the refresh of exp(E[ln beta]) need one exp and no log per value.
// Relative error a few ulp (the exp's); 0 where the exponent is below -708.
inline double exp_digamma(double x, double c) {
  const double y = x + 10.0;
  return y * fast::exp(-(digamma_rest(x, y) + c));
}

// ln Gamma(x) for x > 0: ln Gamma(x) = ln Gamma(x + 10) - ln(x (x + 1) ... (x + 9)), the product
// in two halves (one logarithm each; above 1e50, where they would overflow, ten logarithms are
// replaced by 10 ln x + 45/x), then Stirling's series at y = x + 10 to y^-9 (the first omitted
// term is below 1e-14 at y = 10). The subtraction of two large logarithms leaves an absolute error
// of about 2e-14 near the minimum of ln Gamma: used for sums of many terms (the ELBO), not for
// ratios of nearly equal gammas.
inline double lgamma(double x) {
  const double p1 = x * (x + 1.0) * (x + 2.0) * (x + 3.0) * (x + 4.0);
  const double p2 = (x + 5.0) * (x + 6.0) * (x + 7.0) * (x + 8.0) * (x + 9.0);
  // Both logarithms are always taken (of selected arguments), so the loop has no branches.
  const bool big = x > 1e50;
  const double l1 = fast::log(big ? x : p1), l2 = fast::log(big ? 1.0 : p2);
  const double inv = 45.0 / x;
  const double shift = big ? 10.0 * l1 + inv : l1 + l2;
  const double y = x + 10.0;
  const double r = 1.0 / y;
  const double f = r * r;
  // sum_k B_2k / (2k (2k - 1) y^(2k - 1)), k = 1..5
  const double series =
      r * (1.0 / 12 - f * (1.0 / 360 - f * (1.0 / 1260 - f * (1.0 / 1680 - f * (1.0 / 1188)))));
  constexpr double kHalfLog2Pi = 0.91893853320467274178;
  return (y - 0.5) * fast::log(y) - y + kHalfLog2Pi + series - shift;
}

}  // namespace caviar::lda::fast
