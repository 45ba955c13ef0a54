#pragma once
// Special functions and the closed-form expectations of the exponential-family distributions used
// by the conjugate models (Bishop 2006, appendix B).
#include <Eigen/Core>
#include <cmath>
#include <limits>

namespace caviar::math {

inline constexpr double kLog2Pi = 1.8378770664093454835606594728112;
inline constexpr double kLogPi = 1.1447298858494001741434273513531;
inline constexpr double kLog2 = 0.69314718055994530941723212145818;

// psi(x) = d/dx ln Gamma(x) for x > 0: upward recurrence to x >= 10, then the asymptotic series.
double digamma(double x);

// ln Gamma_p(a) = p(p-1)/4 ln pi + sum_{i=1..p} ln Gamma(a + (1-i)/2), the multivariate gamma.
double log_multigamma(double a, int p);

// ln C(alpha) = ln Gamma(sum alpha) - sum ln Gamma(alpha_k), the Dirichlet normaliser (Bishop
// B.23).
double log_dirichlet_norm(const Eigen::VectorXd& alpha);

// ln B(W, nu) for a p-dimensional Wishart, given ln|W| (Bishop B.79).
double log_wishart_norm(double logdet_w, double nu, int p);

// E[ln |Lambda|] under Wishart(W, nu) in p dimensions (Bishop 2006, eqs B.81 and 10.66).
double expected_logdet_wishart(double logdet_w, double nu, int p);

// H[Lambda] for Wishart(W, nu), given E[ln|Lambda|] (Bishop B.82).
double wishart_entropy(double logdet_w, double nu, int p, double e_logdet);

// log sum_k exp(v_k), stable for any finite or -inf entries.
template <class Vec>
double log_sum_exp(const Vec& v) {
  const double m = v.maxCoeff();
  if (!std::isfinite(m)) return m;
  return m + std::log((v.array() - m).exp().sum());
}

}  // namespace caviar::math
