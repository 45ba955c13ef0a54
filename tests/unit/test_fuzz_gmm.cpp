// Numerical fuzzing of the Gaussian mixture: 1000 small, deliberately hostile problems --
// duplicated points, constant columns, one point per cluster, scales from 1e-150 to 1e150, D > N,
// K far above the number of distinct points -- through CAVI (full and diagonal, Dirichlet and
// stick-breaking weights) and EM. On each, either the run completes with every output finite and
// its objective never decreasing (CAVI's ELBO and EM's log-likelihood, beyond 1e-9 relative), or it
// stops with a caviar::Error (a clear error is acceptable for a truly degenerate problem).
// Anything else -- a NaN, an Inf, a decrease, another exception -- fails.
#include <gtest/gtest.h>

#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <map>
#include <random>
#include <sstream>
#include <string>

#include "core/error.hpp"
#include "models/gmm/gmm.hpp"

namespace caviar::gmm {
namespace {

struct Problem {
  RowMatrix x;
  int k = 1;
  Covariance cov = Covariance::kFull;
  Estimator est = Estimator::kVariational;
  WeightPrior weights = WeightPrior::kDirichlet;
  double reg_covar = 0;
  bool exact = false;  // exact statistic sums (the drivers' default) instead of plain doubles
  std::string what;
};

Problem make_problem(std::uint64_t seed) {
  std::mt19937_64 g(seed);
  auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(g); };
  std::normal_distribution<double> normal;
  Problem p;
  const int n = uni(1, 40), d = uni(1, 6);
  p.k = uni(1, 10);
  const double scale = std::pow(10.0, std::uniform_real_distribution<double>(-150, 150)(g));
  const int kind = uni(0, 4);
  p.x.resize(n, d);
  const int distinct = kind == 0 ? 1 : kind == 1 ? std::max(1, n / 4) : n;
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < d; ++j) p.x(i, j) = normal(g);
  for (int i = distinct; i < n; ++i) p.x.row(i) = p.x.row(i % distinct);  // duplicated points
  if (kind == 2) p.x.col(uni(0, d - 1)).setConstant(normal(g));           // a constant column
  if (kind == 3)                                                          // well-separated points
    for (int i = 0; i < n; ++i) p.x.row(i).array() += 100.0 * i;
  p.x *= scale;
  if (kind == 4) p.x.array() += 3 * scale;  // far from the origin relative to the spread
  const Covariance covs[] = {Covariance::kFull, Covariance::kDiag, Covariance::kTied,
                             Covariance::kSpherical};
  p.cov = covs[uni(0, 3)];
  const int algo = uni(0, 3);
  if (algo == 3) {
    p.est = Estimator::kMaximumLikelihood;
    p.reg_covar = uni(0, 1) ? 1e-6 * scale * scale : 0.0;
  } else if (algo == 2) {
    p.weights = WeightPrior::kStickBreaking;
  }
  std::ostringstream s;
  p.exact = seed % 2 == 0;
  s << "seed " << seed << ": N=" << n << " D=" << d << " K=" << p.k << " kind=" << kind
    << " exact=" << p.exact << " scale=" << scale << " " << to_string(p.cov)
    << (p.est == Estimator::kMaximumLikelihood     ? " em reg=" + std::to_string(p.reg_covar)
        : p.weights == WeightPrior::kStickBreaking ? " cavi stick-breaking"
                                                   : " cavi");
  p.what = s.str();
  return p;
}

bool all_finite(const Model& m) {
  bool ok = m.weights().allFinite() && m.means().allFinite();
  for (const auto& c : m.covariances()) ok &= c.allFinite();
  return ok;
}

// Returns "" if the run behaved, else what went wrong. A caviar::Error counts as behaving.
std::string run(const Problem& p, int& errors, std::map<std::string, int>& kinds) {
  try {
    const int d = static_cast<int>(p.x.cols());
    // The prior a user would pick for data of unknown scale (`--prior-mean data --prior-scale
    // data`): m0 = the data mean, W0^-1 = the per-column variance (a constant column borrows the
    // mean variance of the others, or 1). With W0 = I and data at 1e150 the true posterior scale
    // has a condition number of 1e300, which no double computation can represent.
    Prior prior = default_prior(p.cov, d, p.k);
    prior.weights = p.weights;
    const Eigen::VectorXd mean = p.x.colwise().mean().transpose();
    Eigen::VectorXd var = (p.x.rowwise() - mean.transpose()).colwise().squaredNorm().transpose() /
                          static_cast<double>(p.x.rows());
    // "Constant" means a variance at rounding level relative to the others (a constant column's
    // computed variance is ~1e-32 of its square, not 0; as a prior precision that is absurd).
    // Rounding leaves ~(1e-16 |mean|)^2 in a constant column's variance: below (1e-12 |mean|)^2
    // the column is taken as constant.
    const double top = var.maxCoeff();
    const auto real = (var.array() > 1e-20 * top) && (var.array() > 1e-24 * mean.array().square());
    const int positive = static_cast<int>(real.count());
    const double fill = positive ? real.select(var, 0.0).sum() / positive : 1.0;
    for (int j = 0; j < d; ++j)
      if (!real[j] || !(var[j] > 0)) var[j] = fill;
    prior.m0 = mean;
    if (full_moments(p.cov))
      prior.W0_inv = var.asDiagonal();
    else if (p.cov == Covariance::kDiag)
      prior.W0_inv = var;
    else
      prior.W0_inv = Eigen::VectorXd::Constant(d, var.mean());
    if (p.weights == WeightPrior::kStickBreaking) prior.alpha0 = 1.0;
    const Eigen::VectorXd shift = p.x.colwise().mean().transpose();
    Model model(p.cov, p.k, prior, shift, p.est, p.reg_covar);
    // Random responsibilities (fixed by the problem), as `--init random`.
    std::mt19937_64 g(7);
    std::uniform_real_distribution<double> u(0.01, 1);
    RowMatrix resp(p.x.rows(), p.k);
    for (Eigen::Index i = 0; i < resp.size(); ++i) resp.data()[i] = u(g);
    resp.array().colwise() /= resp.rowwise().sum().array();
    if (std::getenv("CAVIAR_FUZZ_SEED")) {
      for (Eigen::Index i = 0; i < resp.rows(); ++i) {
        std::printf("resp ");
        for (Eigen::Index j = 0; j < resp.cols(); ++j) std::printf("%.17g ", resp(i, j));
        std::printf("\n");
      }
    }
    Stats stats = model.make_stats();
    if (p.exact) {
      const Eigen::VectorXd max_abs =
          (p.x.rowwise() - shift.transpose()).cwiseAbs().colwise().maxCoeff().transpose();
      stats.make_exact(model.exact_exponents(static_cast<double>(p.x.rows()), max_abs));
    }
    // One process: the driver's reduce() without ranks (the order of the blocks is irrelevant).
    auto finish = [&] {
      if (p.exact) stats.finish_exact(p.x.rows());
    };
    stats.set_zero();
    model.accumulate(p.x, resp, stats);
    finish();
    model.update(stats);
    double prev = -INFINITY;
    for (int it = 0; it < 25; ++it) {
      stats.set_zero();
      model.local_step(p.x, stats);
      finish();
      const double obj = model.objective(stats);
      if (std::getenv("CAVIAR_FUZZ_SEED")) std::printf("objective %d %.17g\n", it, obj);
      if (!std::isfinite(obj))
        return "objective " + std::to_string(obj) + " at iteration " + std::to_string(it);
      // EM's guarantee needs an exact M-step; with reg_covar > 0 the covariance is not the
      // maximiser, so the log-likelihood may legitimately dip (scikit-learn's too). Those runs
      // are still checked for finiteness; every other run must never decrease.
      const bool monotone = !(p.est == Estimator::kMaximumLikelihood && p.reg_covar > 0);
      if (monotone && obj < prev - 1e-9 * std::abs(prev))
        return "objective decreased at iteration " + std::to_string(it) + ": " +
               std::to_string(prev) + " -> " + std::to_string(obj);
      prev = obj;
      model.update(stats);
      if (!all_finite(model)) return "non-finite parameters after iteration " + std::to_string(it);
    }
    const double lp = model.log_predictive_sum(p.x);
    if (!std::isfinite(lp)) return "log predictive " + std::to_string(lp);
  } catch (const Error& e) {
    ++errors;
    // Group messages by their text without numbers, to report which errors occur.
    std::string key = p.est == Estimator::kMaximumLikelihood ? "em: " : "cavi: ";
    for (const char* c = e.what(); *c && key.size() < 90; ++c)
      if (!std::isdigit(static_cast<unsigned char>(*c))) key += *c;
    ++kinds[key];
  }
  return "";
}

// CAVIAR_FUZZ_SEED=n runs problem n alone and prints its data, initial responsibilities and
// objective trace (to reproduce a failure with tests/python/gmm_reference.py).
TEST(FuzzGmm, ThousandHostileProblems) {
  const auto t0 = std::chrono::steady_clock::now();
  int errors = 0, failures = 0;
  std::map<std::string, int> kinds;
  // CAVIAR_FUZZ_SEED=n runs problem n alone and prints it (to reproduce a failure elsewhere).
  const char* only = std::getenv("CAVIAR_FUZZ_SEED");
  for (std::uint64_t seed = 1; seed <= 1000; ++seed) {
    if (only && seed != std::stoull(only)) continue;
    if (only) {
      const Problem q = make_problem(seed);
      std::printf("%s\n", q.what.c_str());
      for (Eigen::Index i = 0; i < q.x.rows(); ++i) {
        for (Eigen::Index j = 0; j < q.x.cols(); ++j) std::printf("%.17g ", q.x(i, j));
        std::printf("\n");
      }
    }
    const Problem p = make_problem(seed);
    const std::string bad = run(p, errors, kinds);
    if (!bad.empty()) {
      ++failures;
      ADD_FAILURE() << p.what << ": " << bad;
    }
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("fuzz: 1000 problems, %d failures, %d clear errors, %.1f s\n", failures, errors,
              secs);
  for (const auto& [key, count] : kinds) std::printf("  %4d x %s\n", count, key.c_str());
  // Almost every problem must actually run: errors are for the truly degenerate ones.
  EXPECT_LT(errors, 200);
}

}  // namespace
}  // namespace caviar::gmm
