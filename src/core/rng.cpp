#include "core/rng.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/vec4.hpp"
#include "math/fast.hpp"
#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace caviar {

namespace {
constexpr std::uint32_t kPhiloxM0 = 0xD2511F53u;
constexpr std::uint32_t kPhiloxM1 = 0xCD9E8D57u;
constexpr std::uint32_t kPhiloxW0 = 0x9E3779B9u;
constexpr std::uint32_t kPhiloxW1 = 0xBB67AE85u;

inline void mulhilo(std::uint32_t a, std::uint32_t b, std::uint32_t& hi, std::uint32_t& lo) {
  const std::uint64_t p = static_cast<std::uint64_t>(a) * b;
  hi = static_cast<std::uint32_t>(p >> 32);
  lo = static_cast<std::uint32_t>(p);
}

// 53 random bits to a double in (0, 1): the +0.5 keeps both ends open so log(u) is finite.
inline double to_unit(std::uint32_t hi, std::uint32_t lo) {
  const std::uint64_t bits = ((static_cast<std::uint64_t>(hi) << 32) | lo) >> 11;
  return (static_cast<double>(bits) + 0.5) * 0x1.0p-53;
}
}  // namespace

std::array<std::uint32_t, 4> philox4x32_10(std::array<std::uint32_t, 4> c,
                                           std::array<std::uint32_t, 2> k) {
  for (int round = 0; round < 10; ++round) {
    std::uint32_t hi0, lo0, hi1, lo1;
    mulhilo(kPhiloxM0, c[0], hi0, lo0);
    mulhilo(kPhiloxM1, c[2], hi1, lo1);
    c = {hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0};
    k[0] += kPhiloxW0;
    k[1] += kPhiloxW1;
  }
  return c;
}

std::array<double, 2> CounterRng::uniform2(std::uint64_t index, std::uint32_t step) const {
  const auto r =
      philox4x32_10({static_cast<std::uint32_t>(index), static_cast<std::uint32_t>(index >> 32),
                     step, static_cast<std::uint32_t>(stream_)},
                    {static_cast<std::uint32_t>(seed_), static_cast<std::uint32_t>(seed_ >> 32)});
  return {to_unit(r[0], r[1]), to_unit(r[2], r[3])};
}

namespace {
// Box-Muller: two standard normals from two uniforms in (0, 1).
inline std::array<double, 2> box_muller(double u1, double u2) {
  const double radius = std::sqrt(-2.0 * std::log(u1));
  const double angle = 2.0 * std::numbers::pi * u2;
  return {radius * std::cos(angle), radius * std::sin(angle)};
}

// Box-Muller on four pairs of uniforms u (u1, u2 interleaved) into z (the cos and sin normal of
// each pair, interleaved), with math::fast's logarithm, cosine and sine: plain arithmetic, no
// libm. Every normal of normals and poly_normal2 goes through this one function, which is never
// inlined, so a pair's bits do not depend on where it falls in a call (the compiler may fuse the
// multiply-adds of two inlined copies differently).
[[gnu::noinline]] void box_muller4(const double* u, double* z) {
  const Vec4 a = vload<Vec4>(u), b = vload<Vec4>(u + 4);
  const Vec4 u1 = __builtin_shufflevector(a, b, 0, 2, 4, 6),
             u2 = __builtin_shufflevector(a, b, 1, 3, 5, 7);
  const Vec4 squared = -2.0 * math::fast::log(u1);
  Vec4 radius;
#if defined(__AVX2__)
  radius = _mm256_sqrt_pd(squared);
#else
  for (int k = 0; k < 4; ++k) radius[k] = std::sqrt(squared[k]);
#endif
  Vec4 c, s;
  math::fast::cos_sin_turn(u2, c, s);
  const Vec4 zc = radius * c, zs = radius * s;
  vstore(z, __builtin_shufflevector(zc, zs, 0, 4, 1, 5));
  vstore(z + 4, __builtin_shufflevector(zc, zs, 2, 6, 3, 7));
}

#if defined(__AVX2__)
// to_unit on four lanes: (hi, lo) in the low halves of 64-bit lanes. The 53 bits become a double
// in two exact halves (each below 2^52, through the exponent of 2^52), and the same two roundings
// as to_unit's follow, so the lanes are to_unit's bits.
inline __m256d to_unit4(__m256i hi, __m256i lo) {
  const __m256i mask = _mm256_set1_epi64x(0xffffffff),
                magic = _mm256_set1_epi64x(0x4330000000000000);
  const __m256i bits =
      _mm256_srli_epi64(_mm256_or_si256(_mm256_slli_epi64(hi, 32), _mm256_and_si256(lo, mask)), 11);
  const __m256d two52 = _mm256_castsi256_pd(magic);
  const __m256d high = _mm256_sub_pd(
      _mm256_castsi256_pd(_mm256_or_si256(_mm256_srli_epi64(bits, 32), magic)), two52);
  const __m256d low = _mm256_sub_pd(
      _mm256_castsi256_pd(_mm256_or_si256(_mm256_and_si256(bits, mask), magic)), two52);
  const __m256d whole = _mm256_add_pd(_mm256_mul_pd(high, _mm256_set1_pd(0x1.0p32)), low);
  return _mm256_mul_pd(_mm256_add_pd(whole, _mm256_set1_pd(0.5)), _mm256_set1_pd(0x1.0p-53));
}

// Philox4x32-10 of the 8 counters (first + i, step, stream), i < 8, as two groups of four lanes
// (one 32-bit word in the low half of each 64-bit lane, for the 32 x 32 -> 64-bit multiply): out
// gets uniform2's 16 values. The high halves of the lanes hold garbage that the multiply ignores
// and that never reaches a low half.
inline void philox8(std::uint64_t first, std::uint32_t step, std::uint32_t stream,
                    std::uint64_t seed, double* out) {
  const __m256i m0 = _mm256_set1_epi64x(kPhiloxM0), m1 = _mm256_set1_epi64x(kPhiloxM1);
  __m256i c0[2], c1[2], c2[2], c3[2];
  for (int h = 0; h < 2; ++h) {
    c0[h] = _mm256_add_epi64(_mm256_set1_epi64x(static_cast<long long>(first + 4 * h)),
                             _mm256_setr_epi64x(0, 1, 2, 3));
    c1[h] = _mm256_srli_epi64(c0[h], 32);
    c2[h] = _mm256_set1_epi64x(step);
    c3[h] = _mm256_set1_epi64x(stream);
  }
  std::uint32_t k0 = static_cast<std::uint32_t>(seed), k1 = static_cast<std::uint32_t>(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    const __m256i key0 = _mm256_set1_epi64x(k0), key1 = _mm256_set1_epi64x(k1);
    for (int h = 0; h < 2; ++h) {
      const __m256i p0 = _mm256_mul_epu32(c0[h], m0), p1 = _mm256_mul_epu32(c2[h], m1);
      c0[h] = _mm256_xor_si256(_mm256_xor_si256(_mm256_srli_epi64(p1, 32), c1[h]), key0);
      c1[h] = p1;
      c2[h] = _mm256_xor_si256(_mm256_xor_si256(_mm256_srli_epi64(p0, 32), c3[h]), key1);
      c3[h] = p0;
    }
    k0 += kPhiloxW0;
    k1 += kPhiloxW1;
  }
  for (int h = 0; h < 2; ++h) {
    const __m256d a = to_unit4(c0[h], c1[h]), b = to_unit4(c2[h], c3[h]);
    const __m256d lo = _mm256_unpacklo_pd(a, b), hi = _mm256_unpackhi_pd(a, b);
    _mm256_storeu_pd(out + 8 * h, _mm256_permute2f128_pd(lo, hi, 0x20));
    _mm256_storeu_pd(out + 8 * h + 4, _mm256_permute2f128_pd(lo, hi, 0x31));
  }
}
#endif
}  // namespace

std::array<double, 2> CounterRng::normal2(std::uint64_t index, std::uint32_t step) const {
  const auto [u1, u2] = uniform2(index, step);
  return box_muller(u1, u2);
}

void CounterRng::uniforms(std::uint64_t first, std::uint32_t step, std::span<double> out) const {
  std::size_t i = 0;
#if defined(__AVX2__)
  for (; i + 16 <= out.size(); i += 16)
    philox8(first + i / 2, step, static_cast<std::uint32_t>(stream_), seed_, out.data() + i);
#endif
  for (; i < out.size(); i += 2) {
    const auto u = uniform2(first + i / 2, step);
    out[i] = u[0];
    if (i + 1 < out.size()) out[i + 1] = u[1];
  }
}

std::array<double, 2> CounterRng::poly_normal2(std::uint64_t index, std::uint32_t step) const {
  const auto [u1, u2] = uniform2(index, step);
  double u[8] = {u1, u2, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5}, z[8];
  box_muller4(u, z);
  return {z[0], z[1]};
}

void CounterRng::normals(std::uint64_t first, std::uint32_t step, std::span<double> out) const {
  // The uniforms in batches of a few cache lines, then Box-Muller four pairs at a time; the last
  // group of a call is padded with uniforms of 1/2.
  constexpr std::size_t kBatch = 64;
  double u[kBatch], z[kBatch];
  for (std::size_t i = 0; i < out.size(); i += kBatch) {
    const std::size_t m = std::min(kBatch, (out.size() - i + 1) / 2 * 2);
    uniforms(first + i / 2, step, {u, m});
    std::fill(u + m, u + (m + 7) / 8 * 8, 0.5);
    for (std::size_t k = 0; k < m; k += 8) box_muller4(u + k, z + k);
    std::copy(z, z + std::min(kBatch, out.size() - i), out.data() + i);
  }
}

double sample_gamma(std::uint64_t seed, std::uint32_t stream, std::uint64_t index, double shape) {
  const CounterRng rng(seed, static_cast<Stream>(stream));
  double boost = 1.0;
  if (shape < 1.0) {
    // Gamma(a) = Gamma(a + 1) U^(1/a); step 0 is reserved for this uniform.
    boost = std::pow(rng.uniform2(index, 0)[0], 1.0 / shape);
    shape += 1.0;
  }
  const double d = shape - 1.0 / 3.0, c = 1.0 / std::sqrt(9.0 * d);
  for (std::uint32_t attempt = 1;; ++attempt) {
    const double x = rng.normal2(index, 2 * attempt)[0];
    const double u = rng.uniform2(index, 2 * attempt + 1)[0];
    const double t = 1.0 + c * x;
    if (t <= 0) continue;
    const double v = t * t * t;
    // Marsaglia & Tsang's squeeze accepts almost every draw without the two logarithms; it
    // implies the exact test, so the draws are those of the exact test alone.
    if (u < 1.0 - 0.0331 * (x * x) * (x * x)) return boost * d * v;
    if (std::log(u) < 0.5 * x * x + d - d * v + d * std::log(v)) return boost * d * v;
  }
}

}  // namespace caviar
