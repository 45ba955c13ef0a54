// Special functions and the counter-based RNG against published or closed-form values.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>
#include <random>
#include <vector>

#include "core/partition.hpp"
#include "core/rng.hpp"
#include "core/vec4.hpp"
#include "math/special.hpp"

namespace caviar {
namespace {

TEST(Philox, Random123KnownAnswers) {
  // Random123's kat_vectors for philox4x32-10.
  using A4 = std::array<std::uint32_t, 4>;
  EXPECT_EQ(philox4x32_10({0, 0, 0, 0}, {0, 0}),
            (A4{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}));
  EXPECT_EQ(
      philox4x32_10({0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff}),
      (A4{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}));
  EXPECT_EQ(
      philox4x32_10({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0}),
      (A4{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}));
}

TEST(CounterRng, UniformAndNormalMoments) {
  const CounterRng rng(42, Stream::kGenerateRows);
  double su = 0, su2 = 0, sn = 0, sn2 = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    const auto u = rng.uniform2(i, 7);
    const auto z = rng.normal2(i, 8);
    ASSERT_GT(u[0], 0.0);
    ASSERT_LT(u[0], 1.0);
    su += u[0] + u[1];
    su2 += u[0] * u[0] + u[1] * u[1];
    sn += z[0] + z[1];
    sn2 += z[0] * z[0] + z[1] * z[1];
  }
  // Means and variances within ~5 standard errors.
  EXPECT_NEAR(su / (2 * n), 0.5, 5 * std::sqrt(1.0 / 12 / (2 * n)));
  EXPECT_NEAR(su2 / (2 * n) - 0.25, 1.0 / 12, 0.002);
  EXPECT_NEAR(sn / (2 * n), 0.0, 5 / std::sqrt(2.0 * n));
  EXPECT_NEAR(sn2 / (2 * n), 1.0, 0.01);
}

TEST(CounterRng, SameCounterSameDraw) {
  const CounterRng a(1, Stream::kKmeansPlusPlus), b(1, Stream::kKmeansPlusPlus);
  const CounterRng other_stream(1, Stream::kInitResponsibilities);
  EXPECT_EQ(a.uniform2(123456789012ull, 3), b.uniform2(123456789012ull, 3));
  EXPECT_NE(a.uniform2(5, 3), other_stream.uniform2(5, 3));
  EXPECT_NE(a.uniform2(5, 3), a.uniform2(5, 4));
}

TEST(Special, DigammaKnownValues) {
  const double euler_gamma = 0.57721566490153286061;
  EXPECT_NEAR(math::digamma(1.0), -euler_gamma, 1e-14);
  EXPECT_NEAR(math::digamma(0.5), -euler_gamma - 2 * std::log(2.0), 1e-14);
  EXPECT_NEAR(math::digamma(2.0), 1 - euler_gamma, 1e-14);
  EXPECT_NEAR(math::digamma(10.0), 2.251752589066721107647456, 1e-14);
  EXPECT_NEAR(math::digamma(1e-3), -1000.5755719318103, 1e-9);
  // Recurrence psi(x+1) = psi(x) + 1/x across the switch to the asymptotic series.
  for (double x : {0.3, 2.7, 5.5, 9.999, 10.0, 17.25, 1234.5})
    EXPECT_NEAR(math::digamma(x + 1), math::digamma(x) + 1 / x,
                1e-13 * (1 + std::abs(std::log(x))));
  EXPECT_TRUE(std::isnan(math::digamma(0.0)));
}

TEST(Special, MultigammaReducesToLgamma) {
  EXPECT_NEAR(math::log_multigamma(3.7, 1), std::lgamma(3.7), 1e-14);
  // Gamma_2(a) = sqrt(pi) Gamma(a) Gamma(a - 1/2).
  EXPECT_NEAR(math::log_multigamma(2.5, 2),
              0.5 * std::log(std::numbers::pi) + std::lgamma(2.5) + std::lgamma(2.0), 1e-13);
}

TEST(Special, WishartEntropyOneDimIsGammaEntropy) {
  // A 1-D Wishart(w, nu) is Gamma(shape nu/2, scale 2w); its entropy is
  // a + ln(scale) + ln Gamma(a) + (1 - a) psi(a).
  const double w = 0.7, nu = 5.3, a = nu / 2, scale = 2 * w;
  const double e_logdet = math::expected_logdet_wishart(std::log(w), nu, 1);
  EXPECT_NEAR(e_logdet, math::digamma(a) + std::log(scale), 1e-14);
  const double expected = a + std::log(scale) + std::lgamma(a) + (1 - a) * math::digamma(a);
  EXPECT_NEAR(math::wishart_entropy(std::log(w), nu, 1, e_logdet), expected, 1e-13);
}

TEST(Special, LogSumExpStable) {
  Eigen::VectorXd v(3);
  v << 1000.0, 1000.0, -std::numeric_limits<double>::infinity();
  EXPECT_NEAR(math::log_sum_exp(v), 1000.0 + std::log(2.0), 1e-12);
  v << -1e308, -1e308, -1e308;
  EXPECT_TRUE(std::isfinite(math::log_sum_exp(v)));
}

TEST(Vec4Exp, WithinOneUlpOfStdExp) {
  // Every 2^-12 from -708 to 0 and 10^5 random points, against std::exp (glibc's is correctly
  // rounded in practice); 0 below -708; exactly 1 at 0.
  std::mt19937_64 gen(3);
  std::uniform_real_distribution<double> unif(-708.0, 0.0);
  std::vector<double> xs;
  for (double x = -708.0; x <= 0.0; x += 1.0 / 4096) xs.push_back(x);
  for (int i = 0; i < 100000; ++i) xs.push_back(unif(gen));
  while (xs.size() % 4) xs.push_back(0.0);
  double worst = 0;
  for (std::size_t i = 0; i < xs.size(); i += 4) {
    const Vec4 e = exp4(load4(&xs[i]));
    for (int l = 0; l < 4; ++l) {
      const double want = std::exp(xs[i + l]);
      worst = std::max(worst, std::abs(e[l] - want) / want);
    }
  }
  EXPECT_LE(worst, std::numeric_limits<double>::epsilon());
  const Vec4 edge = exp4(Vec4{0.0, -708.5, -1e300, -std::numeric_limits<double>::infinity()});
  EXPECT_EQ(edge[0], 1.0);
  EXPECT_EQ(edge[1], 0.0);
  EXPECT_EQ(edge[2], 0.0);
  EXPECT_EQ(edge[3], 0.0);
  EXPECT_TRUE(std::isnan(exp4(Vec4{} + std::numeric_limits<double>::quiet_NaN())[0]));
}

TEST(Partition, BlockAlignedAndCovering) {
  for (std::int64_t n : {1, 255, 256, 257, 1000, 100000}) {
    for (int p = 1; p <= 5; ++p) {
      std::int64_t next = 0;
      for (int r = 0; r < p; ++r) {
        const RowRange rr = partition_rows(n, p, r);
        EXPECT_EQ(rr.begin, next);
        EXPECT_TRUE(rr.begin % kBlockRows == 0 || rr.begin == n);
        next = rr.end;
      }
      EXPECT_EQ(next, n);
    }
  }
}

}  // namespace
}  // namespace caviar
