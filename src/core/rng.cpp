#include "core/rng.hpp"

#include <cmath>
#include <numbers>

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

std::array<double, 2> CounterRng::normal2(std::uint64_t index, std::uint32_t step) const {
  const auto [u1, u2] = uniform2(index, step);
  const double radius = std::sqrt(-2.0 * std::log(u1));
  const double angle = 2.0 * std::numbers::pi * u2;
  return {radius * std::cos(angle), radius * std::sin(angle)};
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
