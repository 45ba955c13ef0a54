#pragma once
// Four doubles as GCC's generic vector type: one AVX register, two SSE registers elsewhere.
// Arithmetic on it is element-wise, so a kernel written with it computes each lane exactly as the
// scalar code with the same operations would.
#include <cstdint>
#include <cstring>

namespace caviar {

using Vec4 = double __attribute__((vector_size(32)));
using Vec4i = std::int64_t __attribute__((vector_size(32)));

// Four doubles from p, which need not be aligned.
inline Vec4 load4(const double* p) {
  Vec4 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// e^x for x <= 0, within one ulp of the correctly rounded value for x >= -708 and 0 below (where
// e^x is subnormal or underflows). The reduction of Cody and Waite (1980), x = n ln 2 + r with
// |r| <= ln 2 / 2 (ln 2 split in a 42-bit head and its tail, so that n ln2_hi is exact for every
// |n| <= 1022), the degree-13 Taylor polynomial of e^r by Horner's rule (the first omitted term,
// r^14 / 14!, is below 4e-18), and 2^n put into the exponent bits. No division, unlike Eigen's
// rational exp, which took about nine times as long per value here. Not for x > 0: 2^n would
// overflow the exponent field there.
inline Vec4 exp4(Vec4 x) {
  constexpr double kShift = 6755399441055744.0;  // 1.5 * 2^52: adding it rounds to an integer
  constexpr std::int64_t kShiftBits = 0x4338000000000000;  // its bit pattern
  const Vec4 xc = x < -708.0 ? Vec4{} - 708.0 : x;
  const Vec4 nf = xc * 1.4426950408889634 + kShift;  // round(x / ln 2), in the low bits
  const Vec4 n = nf - kShift;
  Vec4 r = xc - n * 0.6931471805598903;  // ln 2, head
  r = r - n * 5.497923018708371e-14;     // ln 2, tail
  constexpr double kCoef[] = {1.0 / 479001600,
                              1.0 / 39916800,
                              1.0 / 3628800,
                              1.0 / 362880,
                              1.0 / 40320,
                              1.0 / 5040,
                              1.0 / 720,
                              1.0 / 120,
                              1.0 / 24,
                              1.0 / 6,
                              0.5,
                              1.0,
                              1.0};
  Vec4 p = Vec4{} + 1.0 / 6227020800;  // 1 / 13!
  for (const double c : kCoef) p = p * r + c;
  Vec4i bits;
  std::memcpy(&bits, &nf, sizeof bits);
  const Vec4i scale = ((bits - kShiftBits) + 1023) << 52;  // 2^n
  Vec4 s;
  std::memcpy(&s, &scale, sizeof s);
  return x < -708.0 ? Vec4{} : p * s;
}

}  // namespace caviar
