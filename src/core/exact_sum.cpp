#include "core/exact_sum.hpp"

#include <bit>
#include <cmath>
#include <limits>
#include <string>

#include "core/error.hpp"

namespace caviar {

namespace {
// Grid exponent below the bound: addends are < 2^118 grid units, so even the total of all of them
// (< 2^118 units by the bound) leaves 9 bits of headroom below Int128's 2^127.
constexpr int kGridBits = 118;
// The finest grid is 2^-1074, double's smallest subnormal: below it nothing is representable.
constexpr int kMinExponent = -1074 + kGridBits;
// Carry the int64 limbs into 128 bits after this many addends per entry: each adds a piece of
// magnitude < 2^40, so the limbs stay below 2^62.
constexpr std::int64_t kMaxPending = std::int64_t{1} << 22;

// Int128 -> double, a function of the integer alone (so every rank converts identically), within
// one ulp of the nearest double: |v| is first rounded to 64 significant bits (to nearest, ties to
// even) and that to double (the same, via the exact uint64 -> double rounding). This is what
// converting through x87 long double (64-bit significand) gives, written in integer operations,
// which cost a fraction of the long double ones (result() runs once per pass over ~K D^2/2
// entries).
double to_double(Int128 v) {
  const bool neg = v < 0;
  const UInt128 u = neg ? -static_cast<UInt128>(v) : static_cast<UInt128>(v);
  const auto hi = static_cast<std::uint64_t>(u >> 64);
  double d;
  if (hi == 0) {
    d = static_cast<double>(static_cast<std::uint64_t>(u));  // one rounding
  } else {
    const int sh = 64 - std::countl_zero(hi);  // bits beyond the top 64: 1..64
    auto q = static_cast<std::uint64_t>(u >> sh);
    const UInt128 rem = u & ((UInt128{1} << sh) - 1), half = UInt128{1} << (sh - 1);
    bool carry_out = false;
    if (rem > half || (rem == half && (q & 1))) carry_out = ++q == 0;  // q was 2^64 - 1
    // The value is now q 2^sh (or 2^(64 + sh) on carry), then rounded to double and scaled
    // exactly (no overflow: it is below 2^128).
    d = carry_out ? 0x1p64 : static_cast<double>(q);
    d *= std::bit_cast<double>(static_cast<std::uint64_t>(sh + 1023) << 52);
  }
  return neg ? -d : d;
}

// The grid 2^(e - 118) of exponent e (in [-956, 1024]), built from its bits when it is a normal
// double (std::ldexp would cost more than the rest of result()).
double grid(int e) {
  const int g = e - kGridBits;
  if (g < -1022) return std::ldexp(1.0, g);  // subnormal
  return std::bit_cast<double>(static_cast<std::uint64_t>(g + 1023) << 52);
}

// trunc(x) for |x| < 2^51, as an int64 (returned) and as a double (xd), with bit and integer
// operations only, so that the kernel below vectorises with AVX2 as well (double -> int64
// conversion has a vector instruction only from AVX-512DQ on). |x| + 2^52 rounds |x| to the
// nearest integer in the low bits of the sum; where that rounded up (compared as bit patterns,
// which order non-negative doubles), one is taken off. The sign is put back last.
inline std::int64_t trunc_small(double x, double& xd) {
  const auto xb = std::bit_cast<std::int64_t>(x);
  const std::int64_t neg = -static_cast<std::int64_t>(static_cast<std::uint64_t>(xb) >> 63);
  const std::int64_t sign_bit = xb & std::numeric_limits<std::int64_t>::min();
  const double a = std::bit_cast<double>(xb & std::numeric_limits<std::int64_t>::max());
  const double y = a + 0x1p52;  // 2^52 + round(|x|), exactly
  const double ra = y - 0x1p52;
  const std::int64_t up =  // -1 where round(|x|) > |x|, else 0
      -static_cast<std::int64_t>(std::bit_cast<std::int64_t>(ra) > std::bit_cast<std::int64_t>(a));
  xd =
      std::bit_cast<double>(std::bit_cast<std::int64_t>(
                                ra - std::bit_cast<double>(up & std::bit_cast<std::int64_t>(1.0))) |
                            sign_bit);
  const std::int64_t t = std::bit_cast<std::int64_t>(y) - std::bit_cast<std::int64_t>(0x1p52) + up;
  return (t ^ neg) - neg;
}

// The kernel: adds v[i] to entry i's limbs on the grid 2^(e[i] - 118), for i < n. Returns nonzero
// if some addend is not finite or not below 2^e[i] (its entry is then left unchanged).
//
// Written so that GCC vectorises it without -ffast-math: no floor/trunc calls (their vector forms
// need -fno-trapping-math), no floating-point comparisons (bit tests instead), and truncations by
// trunc_small (4.2 instead of 9-11 ns per entry at AVX2 in a standalone test, the same integers
// for 6e7 addends of exponents across the whole range, zeros, signs, NaN and the bound).
std::uint64_t add_kernel(const double* __restrict v, const int* __restrict e,
                         std::int64_t* __restrict l0, std::int64_t* __restrict l1,
                         std::int64_t* __restrict l2, std::size_t n) {
  std::int64_t bad = 0;
  for (std::size_t i = 0; i < n; ++i) {
    // units = v 2^(118 - e), exact: a power-of-two scaling that |v| < 2^e keeps below 2^118. The
    // scale is built from its exponent bits, as two factors since 2^(118 - e) exceeds double's
    // range for e < -905 (the first factor is >= 1 whenever the second is > 1, so nothing
    // underflows in between; only when e > 118 can the product be subnormal, and then it is below
    // one grid unit anyway). e is in [-956, 1024] (checked at construction), so both biased
    // exponents below are in [117, 2023].
    const std::int64_t s = kGridBits - static_cast<std::int64_t>(e[i]);
    const std::int64_t s1 = s < 1000 ? s : 1000;
    const double f1 = std::bit_cast<double>((s1 + 1023) << 52);
    const double f2 = std::bit_cast<double>((s - s1 + 1023) << 52);
    const auto bits = std::bit_cast<std::int64_t>(v[i] * f1 * f2);
    // |units| >= 2^118, Inf or NaN: the biased exponent field is >= 1023 + 118.
    const std::int64_t big = ((bits >> 52) & 0x7ff) >= 1023 + kGridBits;
    bad |= big;
    const double u = std::bit_cast<double>(bits & (big - 1));  // 0 if big
    // Truncation toward zero, split as trunc(u) = h 2^80 + m 2^40 + l with pieces of u's sign:
    // h = trunc(u 2^-80) (|h| < 2^38); r1 = u - h 2^80 is exact (both are multiples of ulp(u),
    // which is at most 2^65, and |r1| <= |u|), and |r1| < 2^80; likewise m = trunc(r1 2^-40),
    // r2 = r1 - m 2^40 exactly, |r2| < 2^40, and l = trunc(r2). The only rounding is the final
    // truncation of the fraction: a function of v alone.
    double hd, md, ld;
    const std::int64_t h = trunc_small(u * 0x1p-80, hd);
    const double r1 = u - hd * 0x1p80;
    const std::int64_t m = trunc_small(r1 * 0x1p-40, md);
    const double r2 = r1 - md * 0x1p40;
    l0[i] += h;
    l1[i] += m;
    l2[i] += trunc_small(r2, ld);
  }
  return static_cast<std::uint64_t>(bad);
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

ExactSum::ExactSum(std::vector<int> exponents) {
  for (int e : exponents)
    if (e > 1024 || e < kMinExponent)
      throw Error("exact sum: exponent " + std::to_string(e) + " out of range");
  for (auto& l : limb_) l.assign(exponents.size(), 0);
  exp_ = std::make_shared<const std::vector<int>>(std::move(exponents));
}

ExactSum ExactSum::zeros_like() const {
  ExactSum z;
  z.exp_ = exp_;
  for (auto& l : z.limb_) l.assign(size(), 0);
  return z;
}

void ExactSum::set_zero() {
  std::fill(acc_.begin(), acc_.end(), Int128{0});
  if (pending_ != 0)
    for (auto& l : limb_) std::fill(l.begin(), l.end(), 0);
  pending_ = 0;
}

void ExactSum::carry() {
  if (acc_.size() != size()) acc_.assign(size(), 0);
  if (pending_ == 0) return;  // nothing was added since the last carry: the limbs are zero
  for (std::size_t i = 0; i < acc_.size(); ++i) {
    acc_[i] += (static_cast<Int128>(limb_[0][i]) << 80) + (static_cast<Int128>(limb_[1][i]) << 40) +
               static_cast<Int128>(limb_[2][i]);
    limb_[0][i] = limb_[1][i] = limb_[2][i] = 0;
  }
  pending_ = 0;
}

void ExactSum::add(std::span<const double> v) {
  if (v.size() != size()) throw Error("exact sum: size mismatch");
  add_at(0, v);
}

void ExactSum::add_at(std::size_t offset, std::span<const double> v) {
  prepare(1);
  add_range(offset, v);
}

void ExactSum::prepare(std::int64_t count) {
  if (count < 0 || count > kMaxPending) throw Error("exact sum: bad number of addends");
  if (pending_ + count > kMaxPending) carry();
  pending_ += count;
}

void ExactSum::add_range(std::size_t offset, std::span<const double> v) {
  if (offset > size() || v.size() > size() - offset) throw Error("exact sum: range out of bounds");
  if (add_kernel(v.data(), exp_->data() + offset, limb_[0].data() + offset,
                 limb_[1].data() + offset, limb_[2].data() + offset, v.size()) != 0)
    throw_bad_addend(offset, v);
}

void ExactSum::throw_bad_addend(std::size_t offset, std::span<const double> v) const {
  for (std::size_t i = 0; i < v.size(); ++i) {
    const int e = (*exp_)[offset + i];
    if (!(std::abs(v[i]) < std::ldexp(1.0, e)))  // 2^1024 is Inf: then only non-finite v fails
      throw Error("exact sum: addend " + std::to_string(v[i]) + " of entry " +
                  std::to_string(offset + i) + " is not finite or exceeds its bound 2^" +
                  std::to_string(e));
  }
  throw Error("exact sum: an addend is not finite or exceeds its bound");
}

ExactSum& ExactSum::operator+=(const ExactSum& o) {
  if (o.exp_ != exp_ && *o.exp_ != *exp_)
    throw Error("exact sum: adding accumulators on different grids");
  carry();
  for (std::size_t i = 0; i < acc_.size(); ++i)
    acc_[i] += (o.acc_.empty() ? Int128{0} : o.acc_[i]) +
               (static_cast<Int128>(o.limb_[0][i]) << 80) +
               (static_cast<Int128>(o.limb_[1][i]) << 40) + static_cast<Int128>(o.limb_[2][i]);
  return *this;
}

void ExactSum::absorb(ExactSum& o) {
  if (o.exp_ != exp_ && *o.exp_ != *exp_)
    throw Error("exact sum: adding accumulators on different grids");
  carry();
  const bool o_acc = !o.acc_.empty();
  for (std::size_t i = 0; i < acc_.size(); ++i) {
    acc_[i] += (o_acc ? o.acc_[i] : Int128{0}) + (static_cast<Int128>(o.limb_[0][i]) << 80) +
               (static_cast<Int128>(o.limb_[1][i]) << 40) + static_cast<Int128>(o.limb_[2][i]);
    o.limb_[0][i] = o.limb_[1][i] = o.limb_[2][i] = 0;
    if (o_acc) o.acc_[i] = 0;
  }
  o.pending_ = 0;
}

void ExactSum::result(std::span<double> out) const {
  if (out.size() != size()) throw Error("exact sum: size mismatch");
  // to_double rounds once; the scaling by a power of two is exact unless the result is subnormal
  // (then it rounds once more, as any double arithmetic would there).
  const int* e = exp_->data();
  for (std::size_t i = 0; i < size(); ++i) {
    const Int128 v = (acc_.empty() ? Int128{0} : acc_[i]) +
                     (static_cast<Int128>(limb_[0][i]) << 80) +
                     (static_cast<Int128>(limb_[1][i]) << 40) + static_cast<Int128>(limb_[2][i]);
    out[i] = to_double(v) * grid(e[i]);
  }
}

std::vector<double> ExactSum::result() const {
  std::vector<double> out(size());
  result(out);
  return out;
}

}  // namespace caviar
