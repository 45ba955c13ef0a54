#include "models/bbvi/predict.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>

namespace caviar::bbvi {
namespace {

double softplus(double v) {
  return std::max(v, 0.0) + std::log1p(std::exp(-std::abs(v)));
}

// log p(y | eta) of one row (eta: its C linear predictors); the forms of glm.hpp.
double log_lik(const Glm& glm, const double* eta, double y) {
  switch (glm.likelihood) {
    case Likelihood::kLogistic:
      return y * eta[0] - softplus(eta[0]);
    case Likelihood::kLinear: {
      const double r = (y - eta[0]) / glm.noise_sd;
      return -0.5 * (std::log(2 * std::numbers::pi) + r * r) - std::log(glm.noise_sd);
    }
    case Likelihood::kPoisson:
      return y * eta[0] - std::exp(eta[0]) - std::lgamma(y + 1);
    case Likelihood::kSoftmax: {
      const double m = *std::max_element(eta, eta + glm.classes);
      double s = 0;
      for (int c = 0; c < glm.classes; ++c) s += std::exp(eta[c] - m);
      return eta[static_cast<int>(y)] - m - std::log(s);
    }
  }
  return 0;
}

}  // namespace

Prediction predict(const Glm& glm, const RowMatrix& theta, std::span<const double> x,
                   std::span<const double> y) {
  const int d = glm.features, c = glm.outputs();
  const auto n = static_cast<Eigen::Index>(x.size() / static_cast<std::size_t>(d));
  const auto s = theta.rows();
  const Eigen::Map<const RowMatrix> xm(x.data(), n, d);
  const bool gaussian_sd =
      glm.likelihood == Likelihood::kLinear || glm.likelihood == Likelihood::kPoisson;
  Prediction p;
  p.mean = RowMatrix::Zero(n, c);
  Eigen::VectorXd second = Eigen::VectorXd::Zero(n);  // sum_s of the squared per-draw mean
  Eigen::MatrixXd logp;                               // n x S
  if (!y.empty()) logp.resize(n, s);
  RowMatrix eta(n, c);
  for (Eigen::Index k = 0; k < s; ++k) {
    // Draw k's parameters, output by output [w_1..w_D, b] (glm.hpp): an C x (D + 1) matrix.
    const Eigen::Map<const RowMatrix> wb(theta.row(k).data(), c, d + 1);
    eta.noalias() = xm * wb.leftCols(d).transpose();
    eta.rowwise() += wb.col(d).transpose();
    for (Eigen::Index i = 0; i < n; ++i) {
      double* e = eta.row(i).data();
      if (!y.empty()) logp(i, k) = log_lik(glm, e, y[static_cast<std::size_t>(i)]);
      switch (glm.likelihood) {
        case Likelihood::kLogistic:
          p.mean(i, 0) +=
              e[0] >= 0 ? 1 / (1 + std::exp(-e[0])) : std::exp(e[0]) / (1 + std::exp(e[0]));
          break;
        case Likelihood::kLinear:
          p.mean(i, 0) += e[0];
          second[i] += e[0] * e[0];
          break;
        case Likelihood::kPoisson: {
          const double rate = std::exp(e[0]);
          p.mean(i, 0) += rate;
          second[i] += rate * rate;
          break;
        }
        case Likelihood::kSoftmax: {
          const double m = *std::max_element(e, e + c);
          double z = 0;
          for (int j = 0; j < c; ++j) z += std::exp(e[j] - m);
          for (int j = 0; j < c; ++j) p.mean(i, j) += std::exp(e[j] - m) / z;
          break;
        }
      }
    }
  }
  p.mean /= static_cast<double>(s);
  if (gaussian_sd) {
    p.sd.resize(n);
    for (Eigen::Index i = 0; i < n; ++i) {
      const double m = p.mean(i, 0);
      const double var_draws = std::max(0.0, second[i] / static_cast<double>(s) - m * m);
      const double noise = glm.likelihood == Likelihood::kLinear ? glm.noise_sd * glm.noise_sd : m;
      p.sd[i] = std::sqrt(var_draws + noise);
    }
  }
  if (!y.empty()) {
    p.log_density.resize(n);
    for (Eigen::Index i = 0; i < n; ++i) {
      const double m = logp.row(i).maxCoeff();
      p.log_density[i] =
          m + std::log((logp.row(i).array() - m).exp().sum()) - std::log(static_cast<double>(s));
    }
  }
  return p;
}

}  // namespace caviar::bbvi
