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
  const UInt128 u = neg ? -static_cast<UInt128>(v) : static_cast<UInt128>(v);
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
  for (auto& l : limb_) l.assign(exp_.size(), 0);
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
  for (auto& l : limb_) std::fill(l.begin(), l.end(), 0);
  pending_ = 0;
}

void ExactSum::carry() {
  for (std::size_t i = 0; i < acc_.size(); ++i) {
    acc_[i] += (static_cast<Int128>(limb_[0][i]) << 80) + (static_cast<Int128>(limb_[1][i]) << 40) +
               static_cast<Int128>(limb_[2][i]);
    limb_[0][i] = limb_[1][i] = limb_[2][i] = 0;
  }
  pending_ = 0;
}

void ExactSum::add(std::span<const double> v) {
  if (v.size() != acc_.size()) throw Error("exact sum: size mismatch");
  add_at(0, v);
}

void ExactSum::add_at(std::size_t offset, std::span<const double> v) {
  if (offset + v.size() > acc_.size()) throw Error("exact sum: range out of bounds");
  if (pending_ >= (std::int64_t{1} << 22)) carry();
  ++pending_;
  const double* up = up_.data() + offset;
  const double* up2 = up2_.data() + offset;
  std::int64_t* l0 = limb_[0].data() + offset;
  std::int64_t* l1 = limb_[1].data() + offset;
  std::int64_t* l2 = limb_[2].data() + offset;
  bool ok = true;
  const std::size_t n = v.size();
#pragma omp simd reduction(&& : ok)
  for (std::size_t i = 0; i < n; ++i) {
    // v * 2^(118-e) is exact: a power-of-two scaling that |v| < 2^e keeps below 2^118 (the first
    // factor is >= 1 whenever there is a second, so nothing underflows in between); only when
    // e > 118 can the product be subnormal, and then it is below one grid unit anyway.
    const double units = v[i] * up[i] * up2[i];
    const bool in_range = std::abs(units) < kMaxUnits;  // false for NaN and Inf too
    ok = ok && in_range;
    // Truncation toward zero (a function of v[i] alone), then |t| = h 2^80 + m 2^40 + l exactly:
    // each step removes the top bits of an integer-valued double, and what is left is a multiple
    // of its ulp below 2^80 (resp. 2^40), so it has at most 53 significant bits.
    const double t = std::abs(std::trunc(in_range ? units : 0.0));
    const double h = std::floor(t * 0x1p-80);
    const double r = t - h * 0x1p80;
    const double m = std::floor(r * 0x1p-40);
    const double l = r - m * 0x1p40;
    const double sign = units < 0 ? -1.0 : 1.0;
    l0[i] += static_cast<std::int64_t>(sign * h);
    l1[i] += static_cast<std::int64_t>(sign * m);
    l2[i] += static_cast<std::int64_t>(sign * l);
  }
  if (!ok) {
    for (std::size_t i = 0; i < n; ++i)
      if (!(std::abs(v[i] * up[i] * up2[i]) < kMaxUnits))
        throw Error("exact sum: addend " + std::to_string(v[i]) + " of entry " +
                    std::to_string(offset + i) + " is not finite or exceeds its bound 2^" +
                    std::to_string(exp_[offset + i]));
  }
}

ExactSum& ExactSum::operator+=(const ExactSum& o) {
  if (o.exp_ != exp_) throw Error("exact sum: adding accumulators on different grids");
  carry();
  for (std::size_t i = 0; i < acc_.size(); ++i)
    acc_[i] += o.acc_[i] + (static_cast<Int128>(o.limb_[0][i]) << 80) +
               (static_cast<Int128>(o.limb_[1][i]) << 40) + static_cast<Int128>(o.limb_[2][i]);
  return *this;
}

void ExactSum::result(std::span<double> out) const {
  if (out.size() != acc_.size()) throw Error("exact sum: size mismatch");
  // to_double rounds once; the scaling by a power of two is exact (the grid is a normal double).
  for (std::size_t i = 0; i < acc_.size(); ++i) {
    const Int128 v = acc_[i] + (static_cast<Int128>(limb_[0][i]) << 80) +
                     (static_cast<Int128>(limb_[1][i]) << 40) + static_cast<Int128>(limb_[2][i]);
    out[i] = to_double(v) * down_[i];
  }
}

std::vector<double> ExactSum::result() const {
  std::vector<double> out(acc_.size());
  result(out);
  return out;
}

}  // namespace caviar
