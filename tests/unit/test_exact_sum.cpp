// ExactSum: the order of the addends, and how they are grouped, must not change a single bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include <omp.h>

#include "core/error.hpp"
#include "core/exact_sum.hpp"
#include "core/partition.hpp"
#include "models/gmm/gmm.hpp"

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

namespace caviar {
namespace {

// The kernel splits each addend's grid units into three int64 pieces with conversions instead of
// floor/trunc: check it against the 128-bit truncation at the edges (addends just below the bound,
// at the 2^40 and 2^80 piece boundaries, subnormal, both signs) and at the extreme exponents.
TEST(ExactSum, KernelEdgesMatchA128BitReference) {
  const std::vector<int> exps{-956, -905, -904, -1, 0, 1, 118, 119, 1023, 1024};
  std::vector<std::vector<double>> rows;
  for (double units : {0x1p118 * (1 - 0x1p-53), 0x1p80, 0x1p80 - 1, 0x1p80 + 0x1p28, 0x1p40,
                       0x1p40 - 1, 0x1p40 + 0.5, 1.0, 0.75, 0x1p-30, 123456789.987654321}) {
    for (double sign : {1.0, -1.0}) {
      std::vector<double> row;
      for (int e : exps) row.push_back(sign * std::ldexp(units, e - 118));
      rows.push_back(row);
    }
  }
  rows.push_back(std::vector<double>(exps.size(), 4.9e-324));  // the smallest subnormal
  rows.push_back(std::vector<double>(exps.size(), -0.0));
  ExactSum s(exps);
  for (const auto& row : rows) {
    ExactSum one(exps);  // one addend at a time: each must be its own truncation
    one.add(row);
    const auto raw = one.raw();
    for (std::size_t i = 0; i < exps.size(); ++i) {
      const long double units = std::ldexp(static_cast<long double>(row[i]), 118 - exps[i]);
      const auto ref = static_cast<Int128>(units);  // exact: units has 53 significant bits
      EXPECT_TRUE(raw[i] == ref) << "entry " << i << " addend " << row[i];
    }
    s.add(row);
  }
  // The same addends in pieces: prepare(count) once, then ranges in any order.
  ExactSum pieces(exps);
  pieces.prepare(static_cast<std::int64_t>(rows.size()));
  for (std::size_t r = rows.size(); r-- > 0;) {
    pieces.add_range(5, std::span<const double>(rows[r]).subspan(5));
    pieces.add_range(0, std::span<const double>(rows[r]).first(5));
  }
  EXPECT_TRUE(same_bits(pieces.result(), s.result()));
}

// prepare() must carry the limbs before they could overflow, however the addends are grouped.
TEST(ExactSum, PiecesCarryLikeWholeAdds) {
  const std::vector<int> exps{30, 30};
  const std::vector<double> v{0x1p30 * (1 - 0x1p-52) / (1 << 23), -0x1p30 / (1 << 23) / 3};
  ExactSum whole(exps), pieces(exps);
  const int n = (1 << 22) + 1000;
  for (int i = 0; i < n; ++i) whole.add(v);
  for (int done = 0; done < n;) {
    const int count = std::min(n - done, 1 << 19);
    pieces.prepare(count);
    for (int i = 0; i < count; ++i) {
      pieces.add_range(1, std::span<const double>(v).subspan(1));
      pieces.add_range(0, std::span<const double>(v).first(1));
    }
    done += count;
  }
  EXPECT_TRUE(same_bits(pieces.result(), whole.result()));
  EXPECT_TRUE(pieces.raw()[0] == whole.raw()[0] && pieces.raw()[1] == whole.raw()[1]);
  EXPECT_THROW(pieces.prepare(-1), Error);
  EXPECT_THROW(pieces.add_range(1, std::vector<double>{1.0, 2.0}), Error);  // out of bounds
  EXPECT_THROW(pieces.add_range(0, std::vector<double>{0x1p30}), Error);    // at the bound
}

TEST(ExactSum, ZerosLikeSharesTheGrid) {
  const auto v = wide_addends(300, 4, 11);
  const auto e = exponents_for(v);
  ExactSum all(e);
  ExactSum a = all.zeros_like(), b = all.zeros_like();
  for (std::size_t i = 0; i < v.size(); ++i) {
    all.add(v[i]);
    (i % 3 ? a : b).add(v[i]);
  }
  EXPECT_EQ(a.exponents(), e);
  a += b;
  EXPECT_TRUE(same_bits(a.result(), all.result()));
  ExactSum empty = all.zeros_like();
  EXPECT_TRUE(same_bits(empty.result(), std::vector<double>(4, 0.0)));
}

}  // namespace
}  // namespace caviar

namespace caviar::gmm {
namespace {

// The mixture's exact statistics (Stats::make_exact) must be the exact sum of its blocks'
// statistics, whatever the thread count and however a thread groups its blocks (above D = 32 the
// second moments of queued blocks are formed component by component and added in pieces). The
// reference takes each 256-row block on its own, with the fast (double) path, whose one-block
// result is that block's statistics exactly (0 + v = v), and sums those on the same grid.
struct ExactCase {
  Covariance cov;
  int d, k;
};

class GmmExactStats : public ::testing::TestWithParam<ExactCase> {};

RowMatrix test_rows(int n, int d, std::uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<double> z;
  RowMatrix x(n, d);
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < d; ++j) x(i, j) = 3.0 * (i % 4) + (1 + j % 5) * z(gen) + 100.0;
  return x;
}

bool same_bits(std::span<const double> a, std::span<const double> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0;
}

TEST_P(GmmExactStats, EqualTheExactSumOfTheBlocksForAnyThreadCount) {
  const ExactCase c = GetParam();
  const int n = 9 * int(kBlockRows) + 77;  // 10 blocks, the last one partial
  const RowMatrix x = test_rows(n, c.d, 5);
  const Eigen::VectorXd shift = x.colwise().mean().transpose();
  Model model(c.cov, c.k, default_prior(c.cov, c.d, c.k), shift);
  // Responsibilities with one empty component (its blocks add nothing), then a posterior from
  // them, so that local_step's responsibilities are varied.
  std::mt19937_64 gen(9);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  RowMatrix resp(n, c.k);
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < c.k; ++j) resp(i, j) = j == 1 ? 0.0 : u(gen) * u(gen);
    resp.row(i) /= resp.row(i).sum();
  }
  {
    Stats s = model.make_stats();
    model.accumulate(x, resp, s);
    model.update(s);
  }
  const Eigen::VectorXd max_abs =
      (x.rowwise() - shift.transpose()).cwiseAbs().colwise().maxCoeff().transpose();
  const std::vector<int> exps = model.exact_exponents(n, max_abs);

  for (const bool e_step : {false, true}) {
    // Reference: block by block.
    ExactSum ref(exps);
    Stats fast_ref = model.make_stats();
    std::vector<double> ref_log_norms;
    for (int r0 = 0; r0 < n; r0 += int(kBlockRows)) {
      const int rows = std::min(int(kBlockRows), n - r0);
      const RowMatrix xb = x.middleRows(r0, rows);
      Stats b = model.make_stats();
      if (e_step)
        model.local_step(xb, b);
      else
        model.accumulate(xb, resp.middleRows(r0, rows), b);
      for (std::size_t i = 0; i < b.buffer().size(); ++i) fast_ref.buffer()[i] += b.buffer()[i];
      ref_log_norms.push_back(b.log_norm());
      b.log_norm() = 0.0;  // summed apart in exact mode
      ref.add(b.buffer());
    }
    std::sort(ref_log_norms.begin(), ref_log_norms.end());
    const std::vector<double> want = ref.result();

    const int saved = omp_get_max_threads();
    for (int threads : {1, 2, 3}) {
      omp_set_num_threads(threads);
      Stats s = model.make_stats();
      s.make_exact(exps);
      if (e_step)
        model.local_step(x, s);
      else
        model.accumulate(x, resp, s);
      EXPECT_TRUE(same_bits(s.exact_part().sum.result(), want))
          << "e_step " << e_step << " threads " << threads;
      auto ln = s.exact_part().block_log_norms;
      std::sort(ln.begin(), ln.end());
      EXPECT_TRUE(same_bits(ln, ref_log_norms)) << "e_step " << e_step << " threads " << threads;
      if (threads == 1) {
        // The fast path on one thread adds the same block values in block order.
        Stats f = model.make_stats();
        if (e_step)
          model.local_step(x, f);
        else
          model.accumulate(x, resp, f);
        EXPECT_TRUE(same_bits(f.buffer(), fast_ref.buffer())) << "e_step " << e_step;
      }
    }
    omp_set_num_threads(saved);
    // The sums are the statistics: the component left empty has none, the others some.
    Stats loaded = model.make_stats();
    loaded.make_exact(exps);
    loaded.exact_part().sum = ref;
    loaded.load_exact(0.0);
    if (!e_step) {
      EXPECT_EQ(loaded.n(1), 0.0);
    }
    EXPECT_NEAR(loaded.rows(), n, 0);
    double total = 0;
    for (int k = 0; k < c.k; ++k) total += loaded.n(k);
    EXPECT_NEAR(total, n, 1e-9 * n);
  }
}

// Above D = 32 the second moments skip rows whose responsibility is below 2^-140 (Accumulator::
// drain): that must not lose anything the sums can show. Responsibilities span 1 down to 1e-300 and
// exact zeros, with the small ones on rows far from the shift (so a threshold even at 1e-30 would
// move the sums by far more than the tolerance); the sums must match a dense long-double sum over
// every row, in fast and exact mode.
TEST(GmmLargeDimStats, SecondMomentsMatchADenseSumOverEveryRow) {
  const int d = 40, k = 3, n = 3 * int(kBlockRows) + 5;
  RowMatrix x = test_rows(n, d, 21);
  const std::array<double, 7> small{1e-8, 1e-20, 1e-30, 1e-41, 1e-45, 1e-300, 0.0};
  RowMatrix resp(n, k);
  for (int i = 0; i < n; ++i) {
    const double tiny = small[std::size_t(i) % small.size()];
    if (tiny < 1e-6 && tiny > 1e-42) x.row(i).array() *= 1e4;  // far rows carry the small weights
    resp(i, 0) = tiny;
    resp(i, 1) = 0.25 + 0.5 * (i % 2);
    resp(i, 2) = 1.0 - resp(i, 0) - resp(i, 1);
  }
  const Eigen::VectorXd shift = Eigen::VectorXd::Constant(d, 100.0);
  Model model(Covariance::kFull, k, default_prior(Covariance::kFull, d, k), shift);
  const RowMatrix xc = x.rowwise() - shift.transpose();
  const Eigen::VectorXd max_abs = xc.cwiseAbs().colwise().maxCoeff().transpose();
  for (const bool exact : {false, true}) {
    Stats s = model.make_stats();
    if (exact) s.make_exact(model.exact_exponents(n, max_abs));
    model.accumulate(x, resp, s);
    if (exact) s.load_exact(0.0);
    for (int c = 0; c < k; ++c) {
      const Eigen::MatrixXd got = s.sxx_matrix(c);
      for (int i = 0; i < d; ++i) {
        for (int j = 0; j < d; ++j) {
          long double want = 0, mag = 0;
          for (int r = 0; r < n; ++r) {
            const long double t = (long double)resp(r, c) * xc(r, i) * xc(r, j);
            want += t;
            mag += std::fabs(t);
          }
          ASSERT_LE(std::fabs((long double)got(i, j) - want), 1e-13L * mag)
              << "exact " << exact << " component " << c << " entry " << i << "," << j;
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Paths, GmmExactStats,
    ::testing::Values(ExactCase{Covariance::kFull, 40, 5},  // queued, per-component path
                      ExactCase{Covariance::kFull, 6, 4},   // one GEMM per block
                      ExactCase{Covariance::kDiag, 40, 5}),
    [](const auto& p) { return to_string(p.param.cov) + "_D" + std::to_string(p.param.d); });

}  // namespace
}  // namespace caviar::gmm

namespace caviar {
namespace {

// result() converts each 128-bit sum with integer operations; it must give the bits of the
// conversion through x87 long double it replaced (round to 64 significant bits, then to double),
// including at ties and carries.
double via_long_double(Int128 v) {
  const bool neg = v < 0;
  const UInt128 u = neg ? -static_cast<UInt128>(v) : static_cast<UInt128>(v);
  const long double x =
      std::ldexp(static_cast<long double>(static_cast<std::uint64_t>(u >> 64)), 64) +
      static_cast<long double>(static_cast<std::uint64_t>(u));
  const double d = static_cast<double>(x);
  return neg ? -d : d;
}

TEST(ExactSum, ResultConvertsAsLongDoubleDid) {
  std::mt19937_64 gen(13);
  std::vector<Int128> values;
  for (int i = 0; i < 20000; ++i) {
    const int bits = 1 + static_cast<int>(gen() % 126);
    UInt128 u = (static_cast<UInt128>(gen()) << 64) | gen();
    u >>= 128 - bits;
    if (i % 4 == 1) u |= (UInt128{1} << (bits > 66 ? bits - 66 : 0)) - 1;  // long runs of ones
    if (i % 4 == 2 && bits > 66) {  // exact ties at the 64-bit rounding
      const int sh = bits - 64;
      u = (u >> sh << sh) | (UInt128{1} << (sh - 1));
    }
    values.push_back(gen() & 1 ? -static_cast<Int128>(u) : static_cast<Int128>(u));
  }
  for (int sh = 1; sh <= 62; ++sh) {  // 2^64 - 1 carried into 2^64 at each position
    const UInt128 u = ((UInt128{1} << 64) - 1) << sh | (UInt128{1} << (sh - 1)) | 1;
    values.push_back(static_cast<Int128>(u));
  }
  ExactSum s(std::vector<int>(values.size(), 118));  // grid 2^0: result() = the integers
  std::copy(values.begin(), values.end(), s.raw().begin());
  const auto r = s.result();
  for (std::size_t i = 0; i < values.size(); ++i) {
    const double want = via_long_double(values[i]);
    EXPECT_EQ(std::memcmp(&r[i], &want, sizeof(double)), 0) << "value " << i;
  }
}

}  // namespace
}  // namespace caviar
