// The blocked Gibbs sampler's conditional draws against the moments of the Dirichlet, Wishart and
// Normal-Wishart distributions (Bishop 2006, appendix B), and their independence of call order.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "models/gmm_gibbs/draws.hpp"

namespace caviar::gmm_gibbs {
namespace {

using Eigen::MatrixXd;
using Eigen::VectorXd;

gmm::Posterior test_posterior(gmm::Covariance cov) {
  gmm::Posterior p;
  p.alpha = VectorXd::Zero(2);
  p.alpha << 3.0, 0.7;
  p.beta = VectorXd::Zero(2);
  p.beta << 2.0, 0.5;
  p.nu = VectorXd::Zero(2);
  p.nu << 7.5, 9.0;
  p.m.resize(2, 3);
  p.m << 1.0, -2.0, 0.5, 0.0, 3.0, -1.0;
  MatrixXd w0(3, 3);
  w0 << 2.0, 0.6, -0.3, 0.6, 1.0, 0.2, -0.3, 0.2, 0.5;
  if (cov == gmm::Covariance::kFull) {
    p.W_inv = {w0, 0.5 * w0 + MatrixXd::Identity(3, 3)};
  } else {
    p.W_inv = {w0.diagonal(), VectorXd::Constant(3, 0.8)};
  }
  return p;
}

constexpr int kDraws = 40000;

TEST(GmmGibbsDraws, DirichletMoments) {
  const gmm::Posterior p = test_posterior(gmm::Covariance::kFull);
  const double a0 = p.alpha.sum();
  VectorXd s1 = VectorXd::Zero(2), s2 = VectorXd::Zero(2);
  for (int t = 0; t < kDraws; ++t) {
    const VectorXd w = draw_dirichlet(p.alpha, 1, t);
    EXPECT_NEAR(w.sum(), 1.0, 1e-14);
    s1 += w;
    s2 += w.cwiseProduct(w);
  }
  for (int k = 0; k < 2; ++k) {
    const double mean = p.alpha[k] / a0;
    const double var = p.alpha[k] * (a0 - p.alpha[k]) / (a0 * a0 * (a0 + 1));
    EXPECT_NEAR(s1[k] / kDraws, mean, 5 * std::sqrt(var / kDraws));
    EXPECT_NEAR(s2[k] / kDraws - mean * mean, var, 0.05 * var);
  }
}

TEST(GmmGibbsDraws, NormalWishartMomentsFull) {
  const gmm::Posterior p = test_posterior(gmm::Covariance::kFull);
  for (int k = 0; k < 2; ++k) {
    const MatrixXd w = p.W_inv[k].inverse();  // test only: the closed-form moments need W
    MatrixXd lam_sum = MatrixXd::Zero(3, 3), lam_sq = MatrixXd::Zero(3, 3);
    VectorXd mu_sum = VectorXd::Zero(3);
    MatrixXd mu_sq = MatrixXd::Zero(3, 3);
    for (int t = 0; t < kDraws; ++t) {
      const Params d = draw_params(p, gmm::Covariance::kFull, 2, t);
      lam_sum += d.precision[k];
      lam_sq += d.precision[k].cwiseProduct(d.precision[k]);
      const VectorXd e = d.means.row(k).transpose() - p.m.row(k).transpose();
      mu_sum += e;
      mu_sq += e * e.transpose();
    }
    const double nu = p.nu[k], beta = p.beta[k];
    const MatrixXd mu_cov = p.W_inv[k] / (beta * (nu - 3 - 1));  // Student-t marginal of mu
    for (int i = 0; i < 3; ++i) {
      EXPECT_NEAR(mu_sum[i] / kDraws, 0.0, 5 * std::sqrt(mu_cov(i, i) / kDraws));
      for (int j = 0; j < 3; ++j) {
        // E Lambda = nu W; Var Lambda_ij = nu (W_ij^2 + W_ii W_jj).
        const double var = nu * (w(i, j) * w(i, j) + w(i, i) * w(j, j));
        EXPECT_NEAR(lam_sum(i, j) / kDraws, nu * w(i, j), 5 * std::sqrt(var / kDraws));
        const double mean = nu * w(i, j);
        EXPECT_NEAR(lam_sq(i, j) / kDraws - mean * mean, var, 0.1 * var);
        EXPECT_NEAR(mu_sq(i, j) / kDraws, mu_cov(i, j),
                    0.1 * std::sqrt(mu_cov(i, i) * mu_cov(j, j)));
      }
    }
  }
}

TEST(GmmGibbsDraws, NormalGammaMomentsDiag) {
  const gmm::Posterior p = test_posterior(gmm::Covariance::kDiag);
  for (int k = 0; k < 2; ++k) {
    VectorXd lam = VectorXd::Zero(3), mu = VectorXd::Zero(3), mu2 = VectorXd::Zero(3);
    for (int t = 0; t < kDraws; ++t) {
      const Params d = draw_params(p, gmm::Covariance::kDiag, 3, t);
      ASSERT_EQ(d.precision[k].cols(), 1);
      lam += d.precision[k].col(0);
      const VectorXd e = d.means.row(k).transpose() - p.m.row(k).transpose();
      mu += e;
      mu2 += e.cwiseProduct(e);
    }
    for (int j = 0; j < 3; ++j) {
      const double nu = p.nu[k], winv = p.W_inv[k](j, 0), beta = p.beta[k];
      // lambda ~ Gamma(nu / 2, rate winv / 2): mean nu / winv, variance 2 nu / winv^2.
      EXPECT_NEAR(lam[j] / kDraws, nu / winv, 5 * std::sqrt(2 * nu / (winv * winv) / kDraws));
      const double mu_var = winv / (beta * (nu - 2));
      EXPECT_NEAR(mu[j] / kDraws, 0.0, 5 * std::sqrt(mu_var / kDraws));
      EXPECT_NEAR(mu2[j] / kDraws, mu_var, 0.1 * mu_var);
    }
  }
}

TEST(GmmGibbsDraws, ADrawIsAFunctionOfSeedAndSweepOnly) {
  const gmm::Posterior p = test_posterior(gmm::Covariance::kFull);
  const Params a = draw_params(p, gmm::Covariance::kFull, 4, 17);
  draw_params(p, gmm::Covariance::kFull, 4, 16);
  const Params b = draw_params(p, gmm::Covariance::kFull, 4, 17);
  EXPECT_EQ(a.weights, b.weights);
  EXPECT_EQ(a.means, b.means);
  EXPECT_EQ(a.precision[1], b.precision[1]);
  const Params c = draw_params(p, gmm::Covariance::kFull, 4, 18);
  EXPECT_NE(a.means, c.means);
}

Params label_params(gmm::Covariance cov) {
  Params p;
  p.weights = VectorXd::Zero(3);
  p.weights << 0.5, 0.3, 0.2;
  p.means.resize(3, 2);
  p.means << 0.0, 0.0, 1.0, 0.5, -0.5, 1.0;
  MatrixXd a(2, 2), b(2, 2), c(2, 2);
  a << 2.0, 0.5, 0.5, 1.0;
  b << 1.0, -0.3, -0.3, 3.0;
  c << 0.5, 0.0, 0.0, 0.5;
  p.precision = {a, b, c};
  if (cov == gmm::Covariance::kDiag)
    for (auto& m : p.precision) m = VectorXd(m.diagonal());
  return p;
}

// log pi_k N(x | mu_k, Lambda_k^-1) from the precision matrix directly (determinant and
// quadratic form), not through a Cholesky factor.
double direct_log_term(const Params& p, gmm::Covariance cov, const VectorXd& x, int k) {
  const MatrixXd lam =
      cov == gmm::Covariance::kDiag ? MatrixXd(p.precision[k].col(0).asDiagonal()) : p.precision[k];
  const VectorXd e = x - p.means.row(k).transpose();
  return std::log(p.weights[k]) + 0.5 * std::log(lam.determinant()) -
         0.5 * double(e.size()) * std::log(2 * M_PI) - 0.5 * e.dot(lam * e);
}

TEST(GmmGibbsLabels, FrequenciesFollowTheFullConditional) {
  for (gmm::Covariance cov : {gmm::Covariance::kFull, gmm::Covariance::kDiag}) {
    const Params p = label_params(cov);
    gmm::RowMatrix x(2, 2);
    x << 0.4, 0.4, -0.2, 0.9;
    const int sweeps = 30000;
    MatrixXd counts = MatrixXd::Zero(2, 3);
    std::vector<std::int64_t> z(2);
    std::vector<double> t(2);
    for (int s = 0; s < sweeps; ++s) {
      draw_labels(p, cov, x, 100, 5, s, z, t);
      for (int i = 0; i < 2; ++i) {
        counts(i, z[i]) += 1;
        EXPECT_NEAR(t[i], direct_log_term(p, cov, x.row(i).transpose(), int(z[i])), 1e-12);
      }
    }
    for (int i = 0; i < 2; ++i) {
      VectorXd prob(3);
      for (int k = 0; k < 3; ++k)
        prob[k] = std::exp(direct_log_term(p, cov, x.row(i).transpose(), k));
      prob /= prob.sum();
      double chi2 = 0;
      for (int k = 0; k < 3; ++k)
        chi2 += std::pow(counts(i, k) - sweeps * prob[k], 2) / (sweeps * prob[k]);
      EXPECT_LT(chi2, 13.8) << "row " << i << " (chi-square, 2 dof, p = 0.001)";
    }
  }
}

TEST(GmmGibbsLabels, LabelsDoNotDependOnHowRowsAreSplit) {
  const Params p = label_params(gmm::Covariance::kFull);
  gmm::RowMatrix x(10, 2);
  for (int i = 0; i < 10; ++i) x.row(i) << 0.1 * i - 0.5, 0.05 * i;
  std::vector<std::int64_t> whole(10), parts(10);
  std::vector<double> tw(10), tp(10);
  draw_labels(p, gmm::Covariance::kFull, x, 40, 9, 3, whole, tw);
  const gmm::RowMatrix a = x.topRows(4), b = x.bottomRows(6);
  draw_labels(p, gmm::Covariance::kFull, a, 40, 9, 3, {parts.data(), 4}, {tp.data(), 4});
  draw_labels(p, gmm::Covariance::kFull, b, 44, 9, 3, {parts.data() + 4, 6}, {tp.data() + 4, 6});
  EXPECT_EQ(whole, parts);
  EXPECT_EQ(tw, tp);
}

// The label kernel works on groups of rows at once: every row of several groups and of a group's
// remainder (37 rows), at a D that is not a multiple of the vector width, gets the direct
// formula's terms and densities, and splitting the rows elsewhere than at a group boundary changes
// no bit.
TEST(GmmGibbsLabels, GroupedKernelMatchesTheDirectFormulaForEveryRow) {
  const int d = 7, kk = 4, n = 37;
  std::mt19937_64 gen(11);
  std::normal_distribution<double> z01;
  for (gmm::Covariance cov : {gmm::Covariance::kFull, gmm::Covariance::kDiag}) {
    Params p;
    p.weights = VectorXd::Constant(kk, 1.0 / kk);
    p.means.resize(kk, d);
    for (int k = 0; k < kk; ++k) {
      for (int j = 0; j < d; ++j) p.means(k, j) = 2.0 * z01(gen);
      MatrixXd a(d, d);
      for (int i = 0; i < d; ++i)
        for (int j = 0; j < d; ++j) a(i, j) = z01(gen);
      MatrixXd lam = a * a.transpose() + d * MatrixXd::Identity(d, d);
      p.precision.push_back(cov == gmm::Covariance::kDiag ? MatrixXd(lam.diagonal()) : lam);
    }
    gmm::RowMatrix x(n, d);
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < d; ++j) x(i, j) = 1.5 * z01(gen);
    std::vector<std::int64_t> labels(n), parts(n);
    std::vector<double> terms(n), tp(n), dens(n);
    draw_labels(p, cov, x, 1000, 3, 2, labels, terms);
    LabelKernel(p, cov).log_density(x, dens);
    for (int i = 0; i < n; ++i) {
      const VectorXd xi = x.row(i).transpose();
      EXPECT_NEAR(terms[i], direct_log_term(p, cov, xi, int(labels[i])), 1e-10) << "row " << i;
      double mx = -INFINITY, total = 0;
      for (int k = 0; k < kk; ++k) mx = std::max(mx, direct_log_term(p, cov, xi, k));
      for (int k = 0; k < kk; ++k) total += std::exp(direct_log_term(p, cov, xi, k) - mx);
      EXPECT_NEAR(dens[i], mx + std::log(total), 1e-10) << "row " << i;
    }
    const gmm::RowMatrix a = x.topRows(13), b = x.bottomRows(n - 13);
    draw_labels(p, cov, a, 1000, 3, 2, {parts.data(), 13}, {tp.data(), 13});
    draw_labels(p, cov, b, 1013, 3, 2, {parts.data() + 13, std::size_t(n - 13)},
                {tp.data() + 13, std::size_t(n - 13)});
    EXPECT_EQ(labels, parts);
    EXPECT_EQ(terms, tp);
  }
}

}  // namespace
}  // namespace caviar::gmm_gibbs
