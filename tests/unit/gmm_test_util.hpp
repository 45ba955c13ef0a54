#pragma once
// Helpers shared by the Gaussian-mixture unit tests: random responsibilities, a one-process fit
// through the model API, and ln Gamma_p written out independently of the library.
#include <cmath>
#include <numbers>
#include <random>
#include <vector>

#include "models/gmm/gmm.hpp"

namespace caviar::gmm::testing {

inline RowMatrix random_resp(int n, int k, unsigned seed) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> u(0.01, 1.0);
  RowMatrix r(n, k);
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < k; ++j) r(i, j) = u(gen);
    r.row(i) /= r.row(i).sum();
  }
  return r;
}

// M-step from r0, then iterations of E + M on one process. Returns the objective (the ELBO, or
// EM's log-likelihood) after each E-step.
inline std::vector<double> run_fit(Model& model, const RowMatrix& x, const RowMatrix& r0,
                                   int iters) {
  Stats s = model.make_stats();
  model.accumulate(x, r0, s);
  model.update(s);
  std::vector<double> trace;
  for (int it = 0; it <= iters; ++it) {
    s.set_zero();
    model.local_step(x, s);
    trace.push_back(model.objective(s));
    if (it < iters) model.update(s);
  }
  return trace;
}

// Component j's weighted mean mu and scatter sum_n r_nj (x_n - mu)(x_n - mu)^T, written out.
inline Eigen::MatrixXd weighted_scatter(const RowMatrix& x, const RowMatrix& r, int j,
                                        Eigen::VectorXd& mu) {
  mu = (x.transpose() * r.col(j)) / r.col(j).sum();
  Eigen::MatrixXd c = Eigen::MatrixXd::Zero(x.cols(), x.cols());
  for (Eigen::Index i = 0; i < x.rows(); ++i)
    c += r(i, j) * (x.row(i).transpose() - mu) * (x.row(i).transpose() - mu).transpose();
  return c;
}

// Two posteriors, each updated from the statistics of other random responsibilities, and the
// difference of those statistics (a direction for Model::natural_inner).
struct TwoFits {
  Model m1, m2;
  Stats g;
};
inline TwoFits two_fits(Covariance cov, const Prior& p, const RowMatrix& x, int k) {
  const Eigen::VectorXd shift = x.colwise().mean().transpose();
  Model m1(cov, k, p, shift), m2(cov, k, p, shift);
  Stats s1 = m1.make_stats(), s2 = m1.make_stats();
  m1.accumulate(x, random_resp(static_cast<int>(x.rows()), k, 1), s1);
  m2.accumulate(x, random_resp(static_cast<int>(x.rows()), k, 2), s2);
  m1.update(s1);
  m2.update(s2);
  Stats g = m1.make_stats();
  for (std::size_t i = 0; i < g.buffer().size(); ++i)
    g.buffer()[i] = s2.buffer()[i] - s1.buffer()[i];
  return {std::move(m1), std::move(m2), std::move(g)};
}

// ln Gamma_p(a), written out independently of math::log_multigamma.
inline double lmvgamma(double a, int p) {
  double s = p * (p - 1) / 4.0 * std::log(std::numbers::pi);
  for (int i = 0; i < p; ++i) s += std::lgamma(a - i / 2.0);
  return s;
}

}  // namespace caviar::gmm::testing
