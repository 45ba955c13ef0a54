#include "math/special.hpp"

namespace caviar::math {

double digamma(double x) {
  if (!(x > 0.0)) return std::numeric_limits<double>::quiet_NaN();
  double result = 0.0;
  while (x < 10.0) {  // psi(x) = psi(x + 1) - 1/x
    result -= 1.0 / x;
    x += 1.0;
  }
  // psi(x) ~ ln x - 1/(2x) - sum B_2k / (2k x^2k), to B_12. The first omitted term,
  // B_14 / (14 x^14), is below 1e-15 for x >= 10 (at x = 6 it would be 1e-12).
  const double f = 1.0 / (x * x);
  const double series =
      f *
      (1.0 / 12 -
       f * (1.0 / 120 - f * (1.0 / 252 - f * (1.0 / 240 - f * (1.0 / 132 - f * (691.0 / 32760))))));
  return result + std::log(x) - 0.5 / x - series;
}

double log_multigamma(double a, int p) {
  double s = 0.25 * p * (p - 1) * kLogPi;
  for (int i = 1; i <= p; ++i) s += std::lgamma(a + 0.5 * (1 - i));
  return s;
}

double log_dirichlet_norm(const Eigen::VectorXd& alpha) {
  double s = std::lgamma(alpha.sum());
  for (Eigen::Index k = 0; k < alpha.size(); ++k) s -= std::lgamma(alpha[k]);
  return s;
}

double log_wishart_norm(double logdet_w, double nu, int p) {
  return -0.5 * nu * logdet_w - 0.5 * nu * p * kLog2 - log_multigamma(0.5 * nu, p);
}

double expected_logdet_wishart(double logdet_w, double nu, int p) {
  double s = p * kLog2 + logdet_w;
  for (int i = 1; i <= p; ++i) s += digamma(0.5 * (nu + 1 - i));
  return s;
}

double wishart_entropy(double logdet_w, double nu, int p, double e_logdet) {
  return -log_wishart_norm(logdet_w, nu, p) - 0.5 * (nu - p - 1) * e_logdet + 0.5 * nu * p;
}

}  // namespace caviar::math
