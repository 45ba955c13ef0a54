#include "core/exact_sum.hpp"

#include <cmath>
#include <string>

#include "core/error.hpp"

namespace caviar {

namespace {
// Grid exponent below the bound: addends are < 2^118 grid units, so even the total of all of them
// (< 2^118 units by the bound) leaves 9 bits of headroom below Int128's 2^127.
constexpr int kGridBits = 118;
constexpr double kMaxUnits = 0x1p118;
// The finest grid is 2^-1074, double's smallest subnormal: below it nothing is representable.
constexpr int kMinExponent = -1074 + kGridBits;

// Int128 -> double, a function of the integer alone (so every rank converts identically), within
// one ulp of the nearest double: hi * 2^64 is exact in long double (64-bit significand), adding lo
// rounds once there and the conversion to double once more.
double to_double(Int128 v) {
  const bool neg = v < 0;
  const unsigned __int128 u =
      neg ? -static_cast<unsigned __int128>(v) : static_cast<unsigned __int128>(v);
  const auto hi = static_cast<std::uint64_t>(u >> 64);
  const auto lo = static_cast<std::uint64_t>(u);
  const long double x = std::ldexp(static_cast<long double>(hi), 64) + static_cast<long double>(lo);
  const double d = static_cast<double>(x);
  return neg ? -d : d;
}
}  // namespace

int bound_exponent(double bound) {
  if (!(bound >= 0) || !std::isfinite(bound))
    throw Error("exact sum: a bound is negative or not finite (" + std::to_string(bound) +
                "); are the data beyond double's range?");
  if (bound == 0) return kMinExponent;
  int e = 0;
  const double m = std::frexp(bound, &e);  // bound = m 2^e, m in [0.5, 1): bound < 2^e
  (void)m;
  return std::max(e, kMinExponent);
}

ExactSum::ExactSum(std::vector<int> exponents)
    : exp_(std::move(exponents)),
      up_(exp_.size()),
      up2_(exp_.size()),
      down_(exp_.size()),
      acc_(exp_.size(), 0) {
  for (std::size_t i = 0; i < exp_.size(); ++i) {
    if (exp_[i] > 1024 || exp_[i] < kMinExponent)
      throw Error("exact sum: exponent " + std::to_string(exp_[i]) + " out of range");
    const int up = kGridBits - exp_[i];
    up_[i] = std::ldexp(1.0, std::min(up, 1000));
    up2_[i] = std::ldexp(1.0, up - std::min(up, 1000));
    down_[i] = std::ldexp(1.0, exp_[i] - kGridBits);
  }
}

void ExactSum::set_zero() {
  std::fill(acc_.begin(), acc_.end(), Int128{0});
}

void ExactSum::add(std::span<const double> v) {
  if (v.size() != acc_.size()) throw Error("exact sum: size mismatch");
  bool ok = true;
  for (std::size_t i = 0; i < v.size(); ++i) {
    // v * 2^(118-e) is exact: a power-of-two scaling that |v| < 2^e keeps below 2^118 (the first
    // factor is >= 1 whenever there is a second, so nothing underflows in between); only when
    // e > 118 can the product be subnormal, and then it is below one grid unit anyway.
    const double units = v[i] * up_[i] * up2_[i];
    ok &= std::abs(units) < kMaxUnits;      // false for NaN and Inf too
    acc_[i] += static_cast<Int128>(units);  // truncation toward zero: depends on v[i] alone
  }
  if (!ok) {
    for (std::size_t i = 0; i < v.size(); ++i)
      if (!(std::abs(v[i] * up_[i] * up2_[i]) < kMaxUnits))
        throw Error("exact sum: addend " + std::to_string(v[i]) + " of entry " + std::to_string(i) +
                    " is not finite or exceeds its bound 2^" + std::to_string(exp_[i]));
  }
}

ExactSum& ExactSum::operator+=(const ExactSum& o) {
  if (o.exp_ != exp_) throw Error("exact sum: adding accumulators on different grids");
  for (std::size_t i = 0; i < acc_.size(); ++i) acc_[i] += o.acc_[i];
  return *this;
}

void ExactSum::result(std::span<double> out) const {
  if (out.size() != acc_.size()) throw Error("exact sum: size mismatch");
  // to_double rounds once; the scaling by a power of two is exact (the grid is a normal double).
  for (std::size_t i = 0; i < acc_.size(); ++i) out[i] = to_double(acc_[i]) * down_[i];
}

std::vector<double> ExactSum::result() const {
  std::vector<double> out(acc_.size());
  result(out);
  return out;
}

}  // namespace caviar
