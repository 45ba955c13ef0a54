// ExactSum: the order of the addends, and how they are grouped, must not change a single bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/error.hpp"
#include "core/exact_sum.hpp"

namespace caviar {
namespace {

bool same_bits(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0;
}

// Addends spread over 80 binades with both signs: the worst case for a naive sum's order.
std::vector<std::vector<double>> wide_addends(int n, int entries, std::uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> mant(-1, 1);
  std::uniform_int_distribution<int> expo(-60, 20);
  std::vector<std::vector<double>> v(n, std::vector<double>(entries));
  for (auto& row : v)
    for (auto& x : row) x = std::ldexp(mant(gen), expo(gen));
  return v;
}

std::vector<int> exponents_for(const std::vector<std::vector<double>>& v) {
  std::vector<double> bound(v[0].size(), 0);
  for (const auto& row : v)
    for (std::size_t i = 0; i < row.size(); ++i) bound[i] += std::abs(row[i]);
  std::vector<int> e;
  for (double b : bound) e.push_back(bound_exponent(b));
  return e;
}

TEST(ExactSum, OrderAndGroupingDoNotChangeABit) {
  auto v = wide_addends(5000, 3, 1);
  const auto e = exponents_for(v);
  ExactSum in_order(e);
  for (const auto& row : v) in_order.add(row);
  const auto reference = in_order.result();

  std::mt19937_64 gen(7);
  bool naive_changed = false;
  for (int trial = 0; trial < 5; ++trial) {
    std::shuffle(v.begin(), v.end(), gen);
    // Random groups, each summed on its own (as blocks, threads or ranks would), then merged.
    std::vector<ExactSum> groups(1 + trial * 3, ExactSum(e));
    std::uniform_int_distribution<std::size_t> pick(0, groups.size() - 1);
    std::vector<double> naive(3, 0);
    for (const auto& row : v) {
      groups[pick(gen)].add(row);
      for (int i = 0; i < 3; ++i) naive[i] += row[i];
    }
    ExactSum total(e);
    for (const auto& g : groups) total += g;
    EXPECT_TRUE(same_bits(total.result(), reference)) << "trial " << trial;
    for (int i = 0; i < 3; ++i) naive_changed |= naive[i] != reference[i];
  }
  // The data are hard enough that a plain double sum does depend on the order (else the test
  // above would prove nothing).
  EXPECT_TRUE(naive_changed);
}

TEST(ExactSum, MatchesTheExactSum) {
  // Multiples of 2^-20 below 2^30: the exact sum of 20000 of them fits a long double's 64 bits.
  std::mt19937_64 gen(3);
  std::uniform_int_distribution<std::int64_t> k(-(std::int64_t{1} << 50), std::int64_t{1} << 50);
  std::vector<std::vector<double>> v(20000, std::vector<double>(1));
  long double exact = 0, bound = 0;
  for (auto& row : v) {
    row[0] = std::ldexp(static_cast<double>(k(gen)), -20);
    exact += row[0];
    bound += std::abs(row[0]);
  }
  ExactSum s({bound_exponent(static_cast<double>(bound))});
  for (const auto& row : v) s.add(row);
  EXPECT_EQ(s.result()[0], static_cast<double>(exact));

  // Cancellation that a double sum loses entirely: 1e16 + 1 - 1e16.
  ExactSum c({bound_exponent(2e16 + 1)});
  for (double x : {1e16, 1.0, -1e16}) c.add(std::vector<double>{x});
  EXPECT_EQ(c.result()[0], 1.0);
  EXPECT_EQ(1e16 + 1.0 - 1e16, 0.0);
}

TEST(ExactSum, TinyAndHugeScales) {
  for (double scale : {1e-300, 1e-150, 1.0, 1e150, 1e300}) {
    const std::vector<double> a{3 * scale, -scale}, b{scale, 0.5 * scale};
    ExactSum s({bound_exponent(4 * scale), bound_exponent(1.5 * scale)});
    s.add(a);
    s.add(b);
    const auto r = s.result();
    EXPECT_NEAR(r[0], 4 * scale, 4 * scale * 1e-15) << scale;
    EXPECT_NEAR(r[1], -0.5 * scale, 0.5 * scale * 1e-15) << scale;
  }
}

TEST(ExactSum, RejectsBrokenBoundsAndNonFinite) {
  EXPECT_EQ(bound_exponent(1.0), 1);
  EXPECT_EQ(bound_exponent(0.75), 0);
  EXPECT_EQ(bound_exponent(0.0), -956);
  EXPECT_THROW(bound_exponent(std::nan("")), Error);
  EXPECT_THROW(bound_exponent(HUGE_VAL), Error);
  ExactSum s({3});
  EXPECT_NO_THROW(s.add(std::vector<double>{7.9}));
  EXPECT_THROW(s.add(std::vector<double>{8.0}), Error);
  EXPECT_THROW(s.add(std::vector<double>{std::nan("")}), Error);
  EXPECT_THROW(s.add(std::vector<double>{1, 2}), Error);
  ExactSum other({4});
  EXPECT_THROW(s += other, Error);
}

}  // namespace
}  // namespace caviar

namespace caviar {
namespace {

// add() splits addends into int64 limbs (vectorised) and carries them into 128 bits every 2^22
// adds; the result must equal the plain 128-bit sum of the truncated grid units, exactly, for
// addends of both signs and all magnitudes, across several carries.
TEST(ExactSum, LimbsMatchA128BitReference) {
  const std::vector<int> exps{0, 40, -300, 700};
  ExactSum s(exps);
  std::vector<Int128> ref(exps.size(), 0);
  std::mt19937_64 gen(7);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  const int n_adds = (1 << 22) + (1 << 20) + 12345;
  std::vector<double> v(exps.size());
  for (int a = 0; a < n_adds; ++a) {
    for (std::size_t i = 0; i < exps.size(); ++i) {
      // |v| < 2^(e - 23): 2^23 such addends stay below the bound 2^e.
      const double mag = std::ldexp(unit(gen), exps[i] - 23 - static_cast<int>(unit(gen) * 90));
      v[i] = unit(gen) < 0.5 ? -mag : mag;
      const double units = std::ldexp(v[i], 118 - exps[i]);
      ref[i] += static_cast<Int128>(units);  // the library's truncating conversion
    }
    s.add(v);
  }
  const auto raw = s.raw();
  for (std::size_t i = 0; i < exps.size(); ++i) EXPECT_TRUE(raw[i] == ref[i]) << "entry " << i;
}

}  // namespace
}  // namespace caviar
