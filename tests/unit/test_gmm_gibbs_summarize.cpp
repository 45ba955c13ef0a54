// The Hungarian assignment against brute force over every permutation, and a chain's relabelled
// summaries on draws whose labels are switched on purpose.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "core/error.hpp"
#include "models/gmm_gibbs/summarize.hpp"

namespace caviar::gmm_gibbs {
namespace {

double total(const Eigen::MatrixXd& c, const std::vector<int>& a) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += c(static_cast<Eigen::Index>(i), a[i]);
  return s;
}

// The least total cost over all n! assignments.
double brute_force(const Eigen::MatrixXd& c) {
  std::vector<int> p(static_cast<std::size_t>(c.rows()));
  std::iota(p.begin(), p.end(), 0);
  double best = total(c, p);
  while (std::next_permutation(p.begin(), p.end())) best = std::min(best, total(c, p));
  return best;
}

bool is_permutation(std::vector<int> a) {
  std::sort(a.begin(), a.end());
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i] != static_cast<int>(i)) return false;
  return true;
}

TEST(Hungarian, MatchesBruteForceOnRandomMatrices) {
  std::mt19937_64 gen(12345);
  std::uniform_real_distribution<double> unif(-3.0, 10.0);
  std::uniform_int_distribution<int> small(0, 3);  // many ties
  for (int n = 1; n <= 7; ++n)
    for (int rep = 0; rep < 40; ++rep) {
      Eigen::MatrixXd c(n, n);
      for (int i = 0; i < n; ++i)
        for (int j = 0; j < n; ++j) c(i, j) = rep % 2 ? unif(gen) : small(gen);
      const std::vector<int> a = min_cost_assignment(c);
      ASSERT_EQ(a.size(), static_cast<std::size_t>(n));
      ASSERT_TRUE(is_permutation(a));
      EXPECT_NEAR(total(c, a), brute_force(c), 1e-12) << "n = " << n << ", rep " << rep;
    }
}

TEST(Hungarian, KnownExample) {
  Eigen::MatrixXd c(3, 3);
  c << 4, 1, 3, 2, 0, 5, 3, 2, 2;  // scipy's linear_sum_assignment example: 1 + 2 + 2 = 5
  const std::vector<int> a = min_cost_assignment(c);
  EXPECT_EQ(a, (std::vector<int>{1, 0, 2}));
}

TEST(Hungarian, RefusesBadCosts) {
  EXPECT_THROW(min_cost_assignment(Eigen::MatrixXd::Zero(2, 3)), Error);
  Eigen::MatrixXd c = Eigen::MatrixXd::Zero(2, 2);
  c(1, 0) = std::nan("");
  EXPECT_THROW(min_cost_assignment(c), Error);
}

// Three draws of K = 3 in D = 1 whose components sit at 0, 10, 20 (plus a little noise) in
// switched orders: relabelled, each reference component sees its own draws.
TEST(SummarizeChain, UndoesLabelSwitching) {
  Mixture ref{3, 1, {0.2, 0.3, 0.5}, {0.0, 10.0, 20.0}, {1.0, 2.0, 3.0}};
  MixtureDraws d;
  d.n = 3;
  d.k = 3;
  d.d = 1;
  // draw 0 in the reference order, draw 1 as (20, 0, 10), draw 2 as (10, 20, 0)
  d.means = {0.1, 10.2, 19.7, 20.3, -0.1, 9.9, 10.0, 20.0, 0.3};
  d.weights = {0.2, 0.3, 0.5, 0.5, 0.2, 0.3, 0.3, 0.5, 0.2};
  d.covariances = {1.0, 2.0, 3.0, 3.0, 1.0, 2.0, 2.0, 3.0, 1.0};
  const ChainSummary s = summarize_chain(d, ref);
  EXPECT_EQ(s.matching, (std::vector<std::int64_t>{0, 1, 2, 1, 2, 0, 2, 0, 1}));
  EXPECT_NEAR(s.means.mean[0], (0.1 - 0.1 + 0.3) / 3, 1e-15);
  EXPECT_NEAR(s.means.mean[2], (19.7 + 20.3 + 20.0) / 3, 1e-14);
  for (int k = 0; k < 3; ++k) {
    EXPECT_DOUBLE_EQ(s.weights.mean[k], ref.weights[k]);
    EXPECT_NEAR(s.weights.sd[k], 0.0, 1e-15);
    EXPECT_DOUBLE_EQ(s.covariances.mean[k], ref.covariances[k]);
  }
  const double m0 = (0.1 - 0.1 + 0.3) / 3;
  const double var0 =
      ((0.1 - m0) * (0.1 - m0) + (-0.1 - m0) * (-0.1 - m0) + (0.3 - m0) * (0.3 - m0)) / 2;
  EXPECT_NEAR(s.means.sd[0], std::sqrt(var0), 1e-15);
  const double m1 = (10.2 + 9.9 + 10.0) / 3, m2 = (19.7 + 20.3 + 20.0) / 3;
  EXPECT_NEAR(s.max_diff_mean, std::max({std::abs(m0), std::abs(m1 - 10.0), std::abs(m2 - 20.0)}),
              1e-14);
  EXPECT_NEAR(s.max_diff_covariance, 0.0, 1e-15);
}

TEST(SummarizeChain, RefusesOtherShapes) {
  Mixture ref{2, 1, {0.5, 0.5}, {0.0, 1.0}, {}};
  MixtureDraws d;
  d.n = 1;
  d.k = 3;
  d.d = 1;
  d.weights = {0.3, 0.3, 0.4};
  d.means = {0.0, 1.0, 2.0};
  EXPECT_THROW(summarize_chain(d, ref), Error);
}

// (alpha0 + N_k) / (K alpha0 + N) and (beta0 m0 + S_k) / (beta0 + N_k), by hand.
TEST(CollapsedPosteriorMeans, ConjugateUpdate) {
  const MixtureDraws d = collapsed_posterior_means(1, 2, 2, {3.0, 5.0}, {6.0, -3.0, 10.0, 20.0},
                                                   0.5, 2.0, {1.0, -1.0});
  EXPECT_DOUBLE_EQ(d.weights[0], 3.5 / 9.0);
  EXPECT_DOUBLE_EQ(d.weights[1], 5.5 / 9.0);
  EXPECT_DOUBLE_EQ(d.means[0], (2.0 + 6.0) / 5.0);
  EXPECT_DOUBLE_EQ(d.means[1], (-2.0 - 3.0) / 5.0);
  EXPECT_DOUBLE_EQ(d.means[2], (2.0 + 10.0) / 7.0);
  EXPECT_DOUBLE_EQ(d.means[3], (-2.0 + 20.0) / 7.0);
  EXPECT_TRUE(d.covariances.empty());
}

}  // namespace
}  // namespace caviar::gmm_gibbs
