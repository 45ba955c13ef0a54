// The Gaussian-mixture model against independent computations written out here.
#include <gtest/gtest.h>

#include <Eigen/LU>
#include <cmath>
#include <numbers>
#include <random>

#include "core/error.hpp"
#include "data/minibatch.hpp"
#include "gmm_test_util.hpp"
#include "models/gmm/gmm.hpp"

namespace caviar::gmm {
namespace {

using Eigen::MatrixXd;
using Eigen::VectorXd;

RowMatrix random_data(int n, int d, unsigned seed, double offset = 0.0) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<double> z;
  RowMatrix x(n, d);
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < d; ++j) x(i, j) = offset + (i % 3) * 2.5 + (1 + j) * z(gen);
  return x;
}

using testing::lmvgamma;
using testing::random_resp;
// CAVI on one process with the model API; the ELBO after each E-step.
std::vector<double> run_cavi(Model& model, const RowMatrix& x, const RowMatrix& r0, int iters) {
  return testing::run_fit(model, x, r0, iters);
}

// With K = 1 the variational posterior is the exact Normal-Wishart posterior, so the ELBO must
// equal the log marginal likelihood:
//   ln p(X) = -ND/2 ln pi + ln Gamma_D(nu_N/2) - ln Gamma_D(nu_0/2)
//             + nu_0/2 ln|W_0| ... written with scale inverses as below (Murphy 2007, eq. 266).
double log_evidence_normal_wishart(const RowMatrix& x, const VectorXd& m0, double beta0,
                                   const MatrixXd& w0_inv, double nu0) {
  const double n = static_cast<double>(x.rows());
  const int d = static_cast<int>(x.cols());
  const VectorXd xbar = x.colwise().mean().transpose();
  const RowMatrix xc = x.rowwise() - xbar.transpose();
  const MatrixXd scatter = xc.transpose() * xc;
  const double beta_n = beta0 + n, nu_n = nu0 + n;
  const MatrixXd wn_inv =
      w0_inv + scatter + (beta0 * n / beta_n) * (xbar - m0) * (xbar - m0).transpose();
  return -0.5 * n * d * std::log(std::numbers::pi) + lmvgamma(nu_n / 2, d) - lmvgamma(nu0 / 2, d) +
         0.5 * nu0 * std::log(w0_inv.determinant()) - 0.5 * nu_n * std::log(wn_inv.determinant()) +
         0.5 * d * std::log(beta0 / beta_n);
}

TEST(Gmm, SingleComponentElboIsLogEvidence) {
  for (int d : {1, 2, 5}) {
    const RowMatrix x = random_data(300, d, 11 + d, 3.0);
    Prior p = default_prior(Covariance::kFull, d, 1);
    p.beta0 = 0.7;
    p.nu0 = d + 1.5;
    p.m0 = VectorXd::LinSpaced(d, -1, 1);
    MatrixXd a = MatrixXd::Random(d, d);
    p.W0_inv = a * a.transpose() + MatrixXd::Identity(d, d);
    Model model(Covariance::kFull, 1, p, x.colwise().mean().transpose());
    const auto trace = run_cavi(model, x, RowMatrix::Ones(x.rows(), 1), 2);
    const double expected = log_evidence_normal_wishart(x, p.m0, p.beta0, p.W0_inv, p.nu0);
    EXPECT_NEAR(trace.back(), expected, 1e-10 * std::abs(expected)) << "D=" << d;
  }
}

TEST(Gmm, DiagonalSingleComponentElboIsSumOfOneDimEvidences) {
  // The diagonal model factorises over dimensions: each is a 1-D Normal-Wishart.
  const int d = 4;
  const RowMatrix x = random_data(250, d, 5, -2.0);
  Prior p = default_prior(Covariance::kDiag, d, 1);
  p.W0_inv << 0.5, 1.0, 2.0, 4.0;
  p.nu0 = 2.5;
  Model model(Covariance::kDiag, 1, p, VectorXd::Zero(d));
  const auto trace = run_cavi(model, x, RowMatrix::Ones(x.rows(), 1), 1);
  double expected = 0;
  for (int j = 0; j < d; ++j) {
    const RowMatrix xj = x.col(j);
    expected += log_evidence_normal_wishart(xj, p.m0.segment(j, 1), p.beta0,
                                            p.W0_inv.block(j, 0, 1, 1), p.nu0);
  }
  EXPECT_NEAR(trace.back(), expected, 1e-10 * std::abs(expected));
}

TEST(Gmm, MStepMatchesTextbookUpdates) {
  // Bishop 2006, eqs 10.51-10.53 and 10.58-10.63 written out directly, against the
  // natural-parameter update.
  const int n = 400, d = 3, k = 3;
  const RowMatrix x = random_data(n, d, 3, 50.0);  // far from the origin: tests the shift
  const RowMatrix r = random_resp(n, k, 4);
  Prior p = default_prior(Covariance::kFull, d, k);
  p.m0 << 1, 2, 3;
  Model model(Covariance::kFull, k, p, x.colwise().mean().transpose());
  Stats s = model.make_stats();
  model.accumulate(x, r, s);
  model.update(s);
  const Posterior& q = model.posterior();
  for (int j = 0; j < k; ++j) {
    const double nk = r.col(j).sum();
    const VectorXd xbar = (r.col(j).transpose() * x).transpose() / nk;
    MatrixXd sk = MatrixXd::Zero(d, d);
    for (int i = 0; i < n; ++i)
      sk += r(i, j) * (x.row(i).transpose() - xbar) * (x.row(i).transpose() - xbar).transpose();
    sk /= nk;
    const double beta = p.beta0 + nk;
    const VectorXd m = (p.beta0 * p.m0 + nk * xbar) / beta;
    const MatrixXd w_inv =
        p.W0_inv + nk * sk +
        (p.beta0 * nk / (p.beta0 + nk)) * (xbar - p.m0) * (xbar - p.m0).transpose();
    EXPECT_NEAR(q.alpha[j], p.alpha0 + nk, 1e-12 * nk);
    EXPECT_NEAR(q.beta[j], beta, 1e-12 * nk);
    EXPECT_NEAR(q.nu[j], p.nu0 + nk, 1e-12 * nk);
    EXPECT_LT((q.m.row(j).transpose() - m).norm(), 1e-11 * m.norm());
    EXPECT_LT((q.W_inv[j] - w_inv).norm(), 1e-10 * w_inv.norm());
  }
}

// Every full-covariance E-step kernel against the direct formula (Bishop 2006, eq. 10.46 with
// 10.64-10.66, term by term), and the statistics the block then adds against sums over the
// returned responsibilities: the lines P_k^T (x - m_k) (D = 2 and 3, and D = 40 in groups), the
// expanded Theta F^T with its sparse statistics (D = 8, 16, 24), and the lines again when a
// component sits too far from the shift for the expanded form (D = 8 with the shift at the origin
// and the data at 1e3). Full and tied (tied: one W for every component).
TEST(Gmm, EStepKernelsMatchDirectFormulaAndSums) {
  struct Case {
    int d;
    double offset;
    bool shift_at_mean;
  };
  for (const Covariance cov : {Covariance::kFull, Covariance::kTied}) {
    for (const Case c :
         {Case{2, 0.0, false}, Case{3, 2.0, true}, Case{8, 2.0, true}, Case{16, 1e3, true},
          Case{24, -50.0, true}, Case{40, 2.0, true}, Case{8, 1e3, false}}) {
      const int n = 300, k = 4, d = c.d;
      const RowMatrix x = random_data(n, d, 40 + d, c.offset);
      const VectorXd mean = x.colwise().mean().transpose();
      const VectorXd shift = c.shift_at_mean ? mean : VectorXd(VectorXd::Zero(d));
      Prior prior = default_prior(cov, d, k);
      prior.m0 = mean;  // else the posterior scale stretches towards the origin
      Model model(cov, k, prior, shift);
      Stats s = model.make_stats();
      model.accumulate(x, random_resp(n, k, 41), s);
      model.update(s);
      RowMatrix r;
      Stats s2 = model.make_stats();
      model.local_step(x, s2, &r);
      const Posterior& q = model.posterior();
      const auto digamma = [](double a) {  // by differentiating lgamma: independent of math::
        const double h = 1e-5 * a;
        return (std::lgamma(a + h) - std::lgamma(a - h)) / (2 * h);
      };
      double max_err = 0, log_norm = 0;
      for (int i = 0; i < n; ++i) {
        VectorXd ln_rho(k);
        for (int j = 0; j < k; ++j) {
          const Eigen::LLT<MatrixXd> llt(q.W_inv[j]);
          const VectorXd dx = x.row(i).transpose() - q.m.row(j).transpose();
          double e_logdet =
              d * std::log(2.0) - 2.0 * MatrixXd(llt.matrixL()).diagonal().array().log().sum();
          for (int l = 1; l <= d; ++l) e_logdet += digamma(0.5 * (q.nu[j] + 1 - l));
          ln_rho[j] = digamma(q.alpha[j]) - digamma(q.alpha.sum()) + 0.5 * e_logdet -
                      0.5 * d * std::log(2 * std::numbers::pi) - d / (2 * q.beta[j]) -
                      0.5 * q.nu[j] * dx.dot(llt.solve(dx));
        }
        const double mx = ln_rho.maxCoeff();
        const double lse = mx + std::log((ln_rho.array() - mx).exp().sum());
        log_norm += lse;
        for (int j = 0; j < k; ++j)
          max_err = std::max(max_err, std::abs(r(i, j) - std::exp(ln_rho[j] - lse)));
      }
      const std::string what = "d " + std::to_string(d) + " offset " + std::to_string(c.offset) +
                               (cov == Covariance::kTied ? " tied" : " full");
      // The numerical digammas carry ~1e-9 absolute error.
      EXPECT_LT(max_err, 1e-7) << what;
      EXPECT_NEAR(s2.log_norm(), log_norm, 1e-7 * n) << what;
      // The block's statistics against sums over the returned responsibilities (which the
      // sparse statistics skip below 2^-140: far below these tolerances).
      const RowMatrix xc = x.rowwise() - shift.transpose();
      for (int j = 0; j < k; ++j) {
        const double nk = r.col(j).sum();
        const VectorXd sx = xc.transpose() * r.col(j);
        const MatrixXd sxx = xc.transpose() * r.col(j).asDiagonal() * xc;
        EXPECT_NEAR(s2.n(j), nk, 1e-12 * n) << what;
        EXPECT_LT((Eigen::Map<const VectorXd>(s2.sx(j), d) - sx).cwiseAbs().maxCoeff(),
                  1e-12 * n * (1 + xc.cwiseAbs().maxCoeff()))
            << what;
        EXPECT_LT((s2.sxx_matrix(j) - sxx).cwiseAbs().maxCoeff(),
                  1e-12 * n * (1 + xc.cwiseAbs2().maxCoeff()))
            << what;
      }
    }
  }
}

class GmmMonotone : public ::testing::TestWithParam<std::tuple<Covariance, int>> {};

TEST_P(GmmMonotone, CaviNeverLowersTheElbo) {
  const auto [cov, seed] = GetParam();
  const int n = 600, d = 3, k = 5;
  const RowMatrix x = random_data(n, d, 100 + seed, 1.0);
  Model model(cov, k, default_prior(cov, d, k), x.colwise().mean().transpose());
  const auto trace = run_cavi(model, x, random_resp(n, k, 200 + seed), 60);
  for (std::size_t t = 1; t < trace.size(); ++t)
    EXPECT_GE(trace[t], trace[t - 1] - 1e-10 * std::abs(trace[t - 1])) << "iteration " << t;
  EXPECT_GT(trace.back(), trace.front());  // it did move
}

INSTANTIATE_TEST_SUITE_P(Seeds, GmmMonotone,
                         ::testing::Combine(::testing::Values(Covariance::kFull, Covariance::kDiag),
                                            ::testing::Values(1, 2, 3)));

// --precision single: float32 products with double sums, checked against the double E-step in
// the small-D (D = 5), GEMM (D = 16) and triangular (D = 70) paths, variational and EM. The
// log-normaliser must agree to ~float rounding of the distances, and must not be identical (the
// float path ran).
TEST(Gmm, SinglePrecisionEStepMatchesDoubleToFloatRounding) {
  for (const int d : {5, 16, 70}) {
    for (const Estimator est : {Estimator::kVariational, Estimator::kMaximumLikelihood}) {
      const int n = 700, k = 4;
      const RowMatrix x = random_data(n, d, 31, 1e3);
      const VectorXd shift = x.colwise().mean().transpose();
      Model model(Covariance::kFull, k, default_prior(Covariance::kFull, d, k), shift, est, 1e-6);
      Stats s = model.make_stats();
      model.accumulate(x, random_resp(n, k, 32), s);
      model.update(s);
      RowMatrix r64, r32;
      Stats s64 = model.make_stats(), s32 = model.make_stats();
      model.local_step(x, s64, &r64);
      model.set_precision(Precision::kSingle);
      model.local_step(x, s32, &r32);
      model.set_precision(Precision::kDouble);
      const double ln64 = s64.log_norm(), ln32 = s32.log_norm();
      EXPECT_NE(ln64, ln32) << "d " << d;
      // Per row, |ln rho| is at most a few hundred nats here; float rounding of the distances
      // moves it by ~1e-5 relative.
      EXPECT_NEAR(ln32, ln64, 1e-5 * std::abs(ln64) + 1e-3 * n) << "d " << d;
      EXPECT_LT((r32 - r64).cwiseAbs().maxCoeff(), 1e-3) << "d " << d;
      // Switching back gives the double path's bits again.
      Stats again = model.make_stats();
      model.local_step(x, again);
      EXPECT_EQ(again.log_norm(), ln64);
    }
  }
  Model diag(Covariance::kDiag, 2, default_prior(Covariance::kDiag, 3, 2), VectorXd::Zero(3));
  EXPECT_THROW(diag.set_precision(Precision::kSingle), Error);
}

TEST(Gmm, PredictiveIsNormalisedIn1D) {
  // The Student-t mixture of Bishop 2006, eq. 10.81 integrates to 1 (trapezoid rule, wide grid).
  const RowMatrix x = random_data(200, 1, 21);
  for (auto cov : {Covariance::kFull, Covariance::kDiag}) {
    Model model(cov, 2, default_prior(cov, 1, 2), VectorXd::Zero(1));
    const auto trace = run_cavi(model, x, random_resp(200, 2, 22), 5);
    (void)trace;
    const int m = 200001;
    const double lo = -200, hi = 200, h = (hi - lo) / (m - 1);
    double integral = 0;
    for (int i = 0; i < m; ++i) {
      RowMatrix pt(1, 1);
      pt(0, 0) = lo + i * h;
      integral += (i == 0 || i == m - 1 ? 0.5 : 1.0) * std::exp(model.log_predictive_sum(pt)) * h;
    }
    EXPECT_NEAR(integral, 1.0, 1e-4);
  }
}

TEST(Gmm, StatsPackingRoundTrip) {
  const int d = 4, k = 2;
  Stats s(d, k, Covariance::kFull);
  EXPECT_EQ(s.buffer().size(), std::size_t(k + k * d + k * d * (d + 1) / 2 + 2));
  const RowMatrix x = random_data(10, d, 1);
  RowMatrix r = RowMatrix::Zero(10, k);
  r.col(1).setOnes();
  Model model(Covariance::kFull, k, default_prior(Covariance::kFull, d, k), VectorXd::Zero(d));
  model.accumulate(x, r, s);
  const MatrixXd expected = x.transpose() * x;
  EXPECT_LT((s.sxx_matrix(1) - expected).norm(), 1e-12 * expected.norm());
  EXPECT_EQ(s.sxx_matrix(0).norm(), 0.0);
  EXPECT_EQ(s.n(1), 10.0);
  EXPECT_EQ(s.rows(), 10.0);
}

// ---------------------------------------------------------------------------------------------
// Stick-breaking weights, EM, and the natural-parameter geometry of SVI.

// CAVI with the stick-breaking prior never lowers the ELBO (full and diag).
TEST(Gmm, StickBreakingCaviNeverLowersTheElbo) {
  for (const Covariance cov : {Covariance::kFull, Covariance::kDiag}) {
    const RowMatrix x = random_data(500, 3, 77, 4.0);
    Prior p = default_prior(cov, 3, 6);
    p.weights = WeightPrior::kStickBreaking;
    p.alpha0 = 0.8;
    Model model(cov, 6, p, x.colwise().mean().transpose());
    const auto trace = run_cavi(model, x, random_resp(500, 6, 5), 30);
    for (std::size_t t = 1; t < trace.size(); ++t)
      EXPECT_GE(trace[t], trace[t - 1] - 1e-10 * std::abs(trace[t - 1])) << t;
    // The expected weights: E[v_k] prod_{j<k} E[1 - v_j], renormalised; computed here directly.
    const Posterior& q = model.posterior();
    VectorXd w(6);
    for (int k = 0; k < 6; ++k) {
      w[k] = q.stick_a[k] / (q.stick_a[k] + q.stick_b[k]);
      for (int j = 0; j < k; ++j) w[k] *= q.stick_b[j] / (q.stick_a[j] + q.stick_b[j]);
    }
    w /= w.sum();
    EXPECT_LT((model.weights() - w).cwiseAbs().maxCoeff(), 1e-14);
  }
}

// The stick updates are a_k = 1 + N_k, b_k = alpha0 + sum_{j>k} N_j (Blei & Jordan 2006).
TEST(Gmm, StickBreakingUpdate) {
  const RowMatrix x = random_data(200, 2, 3);
  const RowMatrix r = random_resp(200, 4, 4);
  Prior p = default_prior(Covariance::kFull, 2, 4);
  p.weights = WeightPrior::kStickBreaking;
  p.alpha0 = 1.7;
  Model model(Covariance::kFull, 4, p, VectorXd::Zero(2));
  Stats s = model.make_stats();
  model.accumulate(x, r, s);
  model.update(s);
  const VectorXd nk = r.colwise().sum().transpose();
  for (int k = 0; k < 4; ++k) {
    EXPECT_NEAR(model.posterior().stick_a[k], 1 + nk[k], 1e-12);
    EXPECT_NEAR(model.posterior().stick_b[k], 1.7 + nk.tail(3 - k).sum(), 1e-12);
  }
}

// EM's M-step against the textbook weighted estimates (Bishop 9.24-9.26), and EM never lowers
// the log-likelihood.
TEST(Gmm, EmMatchesWeightedEstimatesAndIsMonotone) {
  const int n = 400, d = 3, k = 3;
  const RowMatrix x = random_data(n, d, 8, 10.0);
  const RowMatrix r = random_resp(n, k, 9);
  Model model(Covariance::kFull, k, default_prior(Covariance::kFull, d, k),
              x.colwise().mean().transpose(), Estimator::kMaximumLikelihood, 1e-3);
  Stats s = model.make_stats();
  model.accumulate(x, r, s);
  model.update(s);
  for (int j = 0; j < k; ++j) {
    const double nk = r.col(j).sum();
    VectorXd mu;
    const MatrixXd c =
        testing::weighted_scatter(x, r, j, mu) / nk + 1e-3 * MatrixXd::Identity(d, d);
    EXPECT_NEAR(model.weights()[j], nk / n, 1e-13);
    EXPECT_LT((model.means().row(j).transpose() - mu).cwiseAbs().maxCoeff(), 1e-11);
    EXPECT_LT((model.covariances()[j] - c).cwiseAbs().maxCoeff(), 1e-11);
  }
  double prev = -1e300;
  for (int it = 0; it < 30; ++it) {
    s.set_zero();
    model.local_step(x, s);
    const double ll = model.objective(s);
    EXPECT_GE(ll, prev - 1e-10 * std::abs(ll)) << it;
    prev = ll;
    model.update(s);
  }
}

// natural_inner(g, g) is the squared Euclidean norm of the change of the natural parameters
// (alpha or sticks, beta, beta m, W^-1 + beta m m^T, nu) between the posteriors of two sets of
// statistics, computed here from the posteriors themselves.
TEST(Gmm, NaturalInnerIsTheNaturalParameterNorm) {
  for (const auto wp : {WeightPrior::kDirichlet, WeightPrior::kStickBreaking}) {
    for (const Covariance cov : {Covariance::kFull, Covariance::kDiag}) {
      const int d = 3, k = 4;
      const RowMatrix x = random_data(300, d, 12, 1.0);
      Prior p = default_prior(cov, d, k);
      p.weights = wp;
      const VectorXd shift = x.colwise().mean().transpose();
      auto [m1, m2, g] = testing::two_fits(cov, p, x, k);
      auto natural = [&](const Posterior& q) {
        std::vector<double> v;
        if (wp == WeightPrior::kDirichlet)
          for (int j = 0; j < k; ++j) v.push_back(q.alpha[j]);
        else
          for (int j = 0; j < k; ++j) {
            v.push_back(q.stick_a[j]);
            v.push_back(q.stick_b[j]);
          }
        for (int j = 0; j < k; ++j) {
          v.push_back(q.beta[j]);
          v.push_back(q.nu[j]);
          const VectorXd mc = q.m.row(j).transpose() - shift;
          for (int i = 0; i < d; ++i) v.push_back(q.beta[j] * mc[i]);
          if (cov == Covariance::kFull) {
            const MatrixXd t = q.W_inv[j] + q.beta[j] * mc * mc.transpose();
            for (int a = 0; a < d; ++a)
              for (int b = 0; b < d; ++b) v.push_back(t(a, b));
          } else {
            for (int i = 0; i < d; ++i) v.push_back(q.W_inv[j](i, 0) + q.beta[j] * mc[i] * mc[i]);
          }
        }
        return v;
      };
      const auto v1 = natural(m1.posterior()), v2 = natural(m2.posterior());
      double sq = 0;
      for (std::size_t i = 0; i < v1.size(); ++i) sq += (v2[i] - v1[i]) * (v2[i] - v1[i]);
      EXPECT_NEAR(m1.natural_inner(g, g), sq, 1e-9 * sq);
    }
  }
}

// SVI minibatches: each epoch's order is a permutation of [0, N), and the rows a rank keeps are
// exactly the batch rows in its range, whatever the split.
TEST(Minibatch, EpochPermutationIsABijectionAndSplitsByRank) {
  for (std::uint64_t n : {1u, 2u, 5u, 256u, 1000u, 4097u}) {
    const EpochPermutation p0(n, 42, 0), p1(n, 42, 1);
    std::vector<int> seen(n, 0);
    int same = 0;
    for (std::uint64_t i = 0; i < n; ++i) {
      const auto v = p0(i);
      ASSERT_LT(v, n);
      ++seen[v];
      same += p0(i) == p1(i);
    }
    for (std::uint64_t v = 0; v < n; ++v) EXPECT_EQ(seen[v], 1) << "n=" << n << " v=" << v;
    if (n >= 256) {
      EXPECT_LT(same, static_cast<int>(n / 10)) << "epochs should differ";
    }
  }
  const std::int64_t n = 2600, b = 300;
  const EpochPermutation perm(n, 7, 3);
  for (int ranks : {1, 3, 4}) {
    std::vector<std::int64_t> all;
    for (int r = 0; r < ranks; ++r) {
      std::int64_t size = 0;
      const auto rows = minibatch_rows(perm, n, b, 8, partition_rows(n, ranks, r), &size);
      EXPECT_EQ(size, 200);  // the last step of the epoch is short
      EXPECT_TRUE(std::is_sorted(rows.begin(), rows.end()));
      all.insert(all.end(), rows.begin(), rows.end());
    }
    std::vector<std::int64_t> expect;
    for (std::int64_t q = 8 * b; q < n; ++q) expect.push_back(static_cast<std::int64_t>(perm(q)));
    std::sort(all.begin(), all.end());
    std::sort(expect.begin(), expect.end());
    EXPECT_EQ(all, expect) << ranks << " ranks";
  }
}

}  // namespace
}  // namespace caviar::gmm
