// The tied and spherical Gaussian mixtures against independent computations written out here:
// their exact conjugate evidence, the maximum-likelihood estimates, the natural-parameter
// geometry, and the monotonicity of CAVI and EM.
#include <gtest/gtest.h>

#include <Eigen/LU>
#include <cmath>
#include <numbers>
#include <random>
#include <vector>

#include "core/error.hpp"
#include "gmm_test_util.hpp"
#include "models/gmm/gmm.hpp"

namespace caviar::gmm {
namespace {

using Eigen::MatrixXd;
using Eigen::VectorXd;

// Clusters whose centres sit `sep` apart along every axis (cluster = row % k), noise sd 1 + j/2.
RowMatrix clustered(int n, int d, int k, double sep, unsigned seed) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<double> z;
  RowMatrix x(n, d);
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < d; ++j) x(i, j) = 3.0 + sep * (i % k) + (1 + 0.5 * j) * z(gen);
  return x;
}

RowMatrix one_hot(int n, int k) {
  RowMatrix r = RowMatrix::Zero(n, k);
  for (int i = 0; i < n; ++i) r(i, i % k) = 1.0;
  return r;
}

using testing::lmvgamma;
using testing::random_resp;
std::vector<double> run(Model& model, const RowMatrix& x, const RowMatrix& r0, int iters) {
  return testing::run_fit(model, x, r0, iters);
}

// The rows of component j when row i belongs to component i % k, and their mean.
std::vector<int> rows_of(const RowMatrix& x, int j, int k, VectorXd& xbar) {
  std::vector<int> rows;
  xbar = VectorXd::Zero(x.cols());
  for (int i = j; i < x.rows(); i += k) {
    rows.push_back(i);
    xbar += x.row(i).transpose();
  }
  xbar /= static_cast<double>(rows.size());
  return rows;
}

// ln p(Z) under a symmetric Dirichlet(alpha0) on the weights, for hard labels with counts nk.
double log_p_labels(const VectorXd& nk, double alpha0) {
  const int k = static_cast<int>(nk.size());
  double l = std::lgamma(k * alpha0) - std::lgamma(k * alpha0 + nk.sum());
  for (int j = 0; j < k; ++j) l += std::lgamma(alpha0 + nk[j]) - std::lgamma(alpha0);
  return l;
}

// ln p(X | Z) of the tied model, Lambda ~ W(W0, nu0), mu_k | Lambda ~ N(m0, (beta0 Lambda)^-1):
// integrating each mu_k leaves (beta0/beta_k)^(D/2) and a Wishart with nu0 + N and the pooled
// scatter (the K = 1 Normal-Wishart evidence, Murphy 2007 eq. 266, with the scatter summed).
double tied_log_evidence(const RowMatrix& x, int k, const Prior& p) {
  const int n = static_cast<int>(x.rows()), d = static_cast<int>(x.cols());
  MatrixXd wn_inv = p.W0_inv;
  double l = 0;
  for (int j = 0; j < k; ++j) {
    VectorXd xbar;
    const std::vector<int> rows = rows_of(x, j, k, xbar);
    const double nj = static_cast<double>(rows.size());
    for (int i : rows)
      wn_inv += (x.row(i).transpose() - xbar) * (x.row(i).transpose() - xbar).transpose();
    const double bj = p.beta0 + nj;
    wn_inv += (p.beta0 * nj / bj) * (xbar - p.m0) * (xbar - p.m0).transpose();
    l += 0.5 * d * std::log(p.beta0 / bj);
  }
  const double nu_n = p.nu0 + n;
  return l - 0.5 * n * d * std::log(std::numbers::pi) + lmvgamma(nu_n / 2, d) -
         lmvgamma(p.nu0 / 2, d) + 0.5 * p.nu0 * std::log(p.W0_inv.determinant()) -
         0.5 * nu_n * std::log(wn_inv.determinant());
}

// ln p(X | Z) of the spherical model: per component, lambda ~ Gamma(a0 = nu0/2, rate b0 = W0^-1/2)
// and mu | lambda ~ N(m0, (beta0 lambda)^-1 I), so a_N = a0 + N_k D/2 and
// b_N = b0 + (sum ||x - xbar||^2 + beta0 N_k/beta_k ||xbar - m0||^2)/2.
double spherical_log_evidence(const RowMatrix& x, int k, const Prior& p) {
  const int d = static_cast<int>(x.cols());
  const double a0 = p.nu0 / 2, b0 = p.W0_inv(0, 0) / 2;
  double l = 0;
  for (int j = 0; j < k; ++j) {
    VectorXd xbar;
    const std::vector<int> rows = rows_of(x, j, k, xbar);
    const double nj = static_cast<double>(rows.size());
    double ss = 0;
    for (int i : rows) ss += (x.row(i).transpose() - xbar).squaredNorm();
    const double bj = p.beta0 + nj;
    const double an = a0 + nj * d / 2,
                 bn = b0 + 0.5 * (ss + p.beta0 * nj / bj * (xbar - p.m0).squaredNorm());
    l += -0.5 * nj * d * std::log(2 * std::numbers::pi) + 0.5 * d * std::log(p.beta0 / bj) +
         a0 * std::log(b0) - an * std::log(bn) + std::lgamma(an) - std::lgamma(a0);
  }
  return l;
}

// With clusters 400 sd apart the optimal responsibilities are one-hot to within exp(-10^4), so
// q(Z) is a point mass on the true labels and q(pi) q(mu, Lambda) the exact posterior given them:
// the ELBO must equal ln p(X | Z) + ln p(Z). This checks the pooled updates and that the shared
// Wishart's terms enter once (tied) and each lambda_k's once (spherical), not per component or
// per dimension.
TEST(GmmTiedSpherical, SeparatedClustersElboIsLogEvidence) {
  for (const Covariance cov : {Covariance::kTied, Covariance::kSpherical}) {
    for (const int d : {1, 3}) {
      const int n = 240, k = 3;
      const RowMatrix x = clustered(n, d, k, 400.0, 7 + d);
      Prior p = default_prior(cov, d, k);
      p.alpha0 = 0.6;
      p.beta0 = 0.3;
      p.nu0 = d + 0.7;
      p.m0 = VectorXd::Constant(d, 100.0);
      if (cov == Covariance::kTied) {
        MatrixXd a = MatrixXd::Random(d, d);
        p.W0_inv = a * a.transpose() + 2 * MatrixXd::Identity(d, d);
      } else {
        p.W0_inv = VectorXd::Constant(d, 1.7);
      }
      Model model(cov, k, p, x.colwise().mean().transpose());
      const auto trace = run(model, x, one_hot(n, k), 2);
      const VectorXd nk = VectorXd::Constant(k, n / k);
      const double expected = (cov == Covariance::kTied ? tied_log_evidence(x, k, p)
                                                        : spherical_log_evidence(x, k, p)) +
                              log_p_labels(nk, p.alpha0);
      EXPECT_NEAR(trace.back(), expected, 1e-10 * std::abs(expected))
          << to_string(cov) << " D=" << d;
    }
  }
}

// With one component the tied model is the full one, and with one dimension the spherical model
// is the diagonal one: the same posterior and ELBO (up to the order of the sums).
TEST(GmmTiedSpherical, DegenerateCasesMatchFullAndDiag) {
  const RowMatrix x3 = clustered(300, 3, 2, 4.0, 3);
  Model tied(Covariance::kTied, 1, default_prior(Covariance::kTied, 3, 1), VectorXd::Zero(3));
  Model full(Covariance::kFull, 1, default_prior(Covariance::kFull, 3, 1), VectorXd::Zero(3));
  const auto t1 = run(tied, x3, RowMatrix::Ones(300, 1), 3),
             t2 = run(full, x3, RowMatrix::Ones(300, 1), 3);
  EXPECT_NEAR(t1.back(), t2.back(), 1e-12 * std::abs(t2.back()));
  const RowMatrix x1 = clustered(300, 1, 3, 5.0, 4);
  const RowMatrix r = random_resp(300, 3, 5);
  Model sph(Covariance::kSpherical, 3, default_prior(Covariance::kSpherical, 1, 3),
            VectorXd::Zero(1));
  Model diag(Covariance::kDiag, 3, default_prior(Covariance::kDiag, 1, 3), VectorXd::Zero(1));
  const auto s1 = run(sph, x1, r, 5), s2 = run(diag, x1, r, 5);
  for (std::size_t t = 0; t < s1.size(); ++t) EXPECT_NEAR(s1[t], s2[t], 1e-12 * std::abs(s2[t]));
  for (int j = 0; j < 3; ++j) EXPECT_NEAR(sph.posterior().nu[j], diag.posterior().nu[j], 1e-12);
}

// CAVI never lowers the ELBO, for both weight priors; EM never lowers the log-likelihood.
TEST(GmmTiedSpherical, CaviAndEmAreMonotone) {
  for (const Covariance cov : {Covariance::kTied, Covariance::kSpherical}) {
    for (const WeightPrior wp : {WeightPrior::kDirichlet, WeightPrior::kStickBreaking}) {
      for (const unsigned seed : {1u, 2u}) {
        const RowMatrix x = clustered(600, 3, 4, 3.0, 40 + seed);
        Prior p = default_prior(cov, 3, 5);
        p.weights = wp;
        Model model(cov, 5, p, x.colwise().mean().transpose());
        const auto trace = run(model, x, random_resp(600, 5, 50 + seed), 60);
        for (std::size_t t = 1; t < trace.size(); ++t)
          EXPECT_GE(trace[t], trace[t - 1] - 1e-10 * std::abs(trace[t - 1]))
              << to_string(cov) << " " << to_string(wp) << " seed " << seed << " it " << t;
        EXPECT_GT(trace.back(), trace.front());  // it did move
      }
    }
    const RowMatrix x = clustered(500, 3, 3, 3.0, 60);
    Model em(cov, 3, default_prior(cov, 3, 3), x.colwise().mean().transpose(),
             Estimator::kMaximumLikelihood, 1e-6);
    const auto ll = run(em, x, random_resp(500, 3, 61), 40);
    for (std::size_t t = 1; t < ll.size(); ++t)
      EXPECT_GE(ll[t], ll[t - 1] - 1e-10 * std::abs(ll[t - 1])) << to_string(cov) << " it " << t;
  }
}

// EM's M-step against the weighted estimates written out: tied, the pooled within-component
// scatter over N; spherical, the mean over dimensions of each component's variances.
TEST(GmmTiedSpherical, EmMStepMatchesWeightedEstimates) {
  const int n = 400, d = 3, k = 3;
  const double reg = 1e-3;
  const RowMatrix x = clustered(n, d, k, 2.0, 70);
  const RowMatrix r = random_resp(n, k, 71);
  for (const Covariance cov : {Covariance::kTied, Covariance::kSpherical}) {
    Model model(cov, k, default_prior(cov, d, k), x.colwise().mean().transpose(),
                Estimator::kMaximumLikelihood, reg);
    Stats s = model.make_stats();
    model.accumulate(x, r, s);
    model.update(s);
    MatrixXd pooled = MatrixXd::Zero(d, d);
    for (int j = 0; j < k; ++j) {
      const double nk = r.col(j).sum();
      VectorXd mu;
      const MatrixXd c = testing::weighted_scatter(x, r, j, mu);
      pooled += c;
      EXPECT_LT((model.means().row(j).transpose() - mu).cwiseAbs().maxCoeff(), 1e-11);
      if (cov == Covariance::kSpherical) {
        const double var = c.diagonal().mean() / nk + reg;
        EXPECT_LT((model.covariances()[j] - VectorXd::Constant(d, var)).cwiseAbs().maxCoeff(),
                  1e-11);
      }
    }
    if (cov == Covariance::kTied) {
      const MatrixXd expected = pooled / n + reg * MatrixXd::Identity(d, d);
      for (int j = 0; j < k; ++j)
        EXPECT_LT((model.covariances()[j] - expected).cwiseAbs().maxCoeff(), 1e-11);
    }
  }
}

// natural_inner(g, g) is the squared norm of the change of the natural parameters between the
// posteriors of two sets of statistics. Tied: (alpha_k, beta_k, beta_k m_k) per component and one
// (nu, W^-1 + sum_k beta_k m_k m_k^T); spherical: per component also nu_k and the scalar
// W_k^-1 + beta_k ||m_k||^2 (W_inv holds it D times).
TEST(GmmTiedSpherical, NaturalInnerIsTheNaturalParameterNorm) {
  for (const Covariance cov : {Covariance::kTied, Covariance::kSpherical}) {
    const int d = 3, k = 4;
    const RowMatrix x = clustered(300, d, 3, 2.0, 12);
    const Prior p = default_prior(cov, d, k);
    const VectorXd shift = x.colwise().mean().transpose();
    auto [m1, m2, g] = testing::two_fits(cov, p, x, k);
    auto natural = [&](const Posterior& q) {
      std::vector<double> v;
      MatrixXd t = q.W_inv[0];
      for (int j = 0; j < k; ++j) {
        v.push_back(q.alpha[j]);
        v.push_back(q.beta[j]);
        const VectorXd mc = q.m.row(j).transpose() - shift;
        for (int i = 0; i < d; ++i) v.push_back(q.beta[j] * mc[i]);
        if (cov == Covariance::kTied) {
          t += q.beta[j] * mc * mc.transpose();
        } else {
          v.push_back(q.nu[j]);
          v.push_back(q.W_inv[j](0, 0) + q.beta[j] * mc.squaredNorm());
        }
      }
      if (cov == Covariance::kTied) {
        v.push_back(q.nu[0]);
        for (int a = 0; a < d; ++a)
          for (int b = 0; b < d; ++b) v.push_back(t(a, b));
      }
      return v;
    };
    const auto v1 = natural(m1.posterior()), v2 = natural(m2.posterior());
    double sq = 0;
    for (std::size_t i = 0; i < v1.size(); ++i) sq += (v2[i] - v1[i]) * (v2[i] - v1[i]);
    EXPECT_NEAR(m1.natural_inner(g, g), sq, 1e-9 * sq) << to_string(cov);
  }
}

// With one component the variational posterior is exact, so the predictive density of a new
// point is the ratio of evidences p(X, x*) / p(X) (tied with K = 1 is full; the spherical case
// checks its D-dimensional Student-t).
TEST(GmmTiedSpherical, SphericalPredictiveIsTheEvidenceRatio) {
  const int d = 3, n = 200;
  const RowMatrix x = clustered(n, d, 1, 0.0, 90);
  Prior p = default_prior(Covariance::kSpherical, d, 1);
  p.nu0 = 2.3;
  p.W0_inv = VectorXd::Constant(d, 0.8);
  Model model(Covariance::kSpherical, 1, p, x.colwise().mean().transpose());
  run(model, x, RowMatrix::Ones(n, 1), 1);
  const double base = spherical_log_evidence(x, 1, p);
  for (const double off : {0.0, 2.5, -7.0}) {
    RowMatrix pt(1, d);
    pt << 3.0 + off, 1.0, 4.0 - off;
    RowMatrix xa(n + 1, d);
    xa << x, pt;
    // spherical_log_evidence assigns row i to component i % k: with k = 1, every row.
    const double expected = spherical_log_evidence(xa, 1, p) - base;
    EXPECT_NEAR(model.log_predictive_sum(pt), expected, 1e-10 * std::abs(expected)) << off;
  }
}

TEST(GmmTiedSpherical, ParseAndPrecision) {
  EXPECT_EQ(parse_covariance("tied"), Covariance::kTied);
  EXPECT_EQ(parse_covariance("spherical"), Covariance::kSpherical);
  EXPECT_EQ(to_string(Covariance::kSpherical), "spherical");
  EXPECT_THROW(parse_covariance("sphere"), Error);
  Model sph(Covariance::kSpherical, 2, default_prior(Covariance::kSpherical, 3, 2),
            VectorXd::Zero(3));
  EXPECT_THROW(sph.set_precision(Precision::kSingle), Error);
  Model tied(Covariance::kTied, 2, default_prior(Covariance::kTied, 3, 2), VectorXd::Zero(3));
  EXPECT_NO_THROW(tied.set_precision(Precision::kSingle));
}

}  // namespace
}  // namespace caviar::gmm
