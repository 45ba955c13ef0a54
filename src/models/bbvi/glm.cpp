#include "models/bbvi/glm.hpp"

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <numbers>
#include <vector>

#include "core/error.hpp"

namespace caviar::bbvi {
namespace {

// log(1 + e^t) without overflow or loss of precision for large |t|.
double softplus(double t) {
  return t > 0 ? t + std::log1p(std::exp(-t)) : std::log1p(std::exp(t));
}

double dot_row(const double* w, const double* x, int d) {
  double s = 0;
  for (int j = 0; j < d; ++j) s += w[j] * x[j];
  return s;
}

void add_scaled_row(double a, const double* x, int d, double* g) {
  for (int j = 0; j < d; ++j) g[j] += a * x[j];
}

}  // namespace

Likelihood parse_likelihood(const std::string& s, const std::string& option) {
  if (s == "logistic") return Likelihood::kLogistic;
  if (s == "linear") return Likelihood::kLinear;
  if (s == "poisson") return Likelihood::kPoisson;
  if (s == "softmax") return Likelihood::kSoftmax;
  throw Error(option + " must be logistic, linear, poisson or softmax, not '" + s + "'");
}

std::string to_string(Likelihood l) {
  switch (l) {
    case Likelihood::kLogistic:
      return "logistic";
    case Likelihood::kLinear:
      return "linear";
    case Likelihood::kPoisson:
      return "poisson";
    case Likelihood::kSoftmax:
      return "softmax";
  }
  return "?";
}

double Glm::loglik(std::span<const double> theta, std::span<const double> x,
                   std::span<const double> y, std::span<double> grad) const {
  const int d = features, c = outputs();
  const std::size_t n = y.size();
  const double* th = theta.data();
  double* g = grad.data();
  double sum = 0;
  if (likelihood == Likelihood::kSoftmax) {
    std::vector<double> eta(static_cast<std::size_t>(c));
    for (std::size_t i = 0; i < n; ++i) {
      const double* xi = x.data() + i * static_cast<std::size_t>(d);
      double m = -INFINITY;
      for (int k = 0; k < c; ++k) {
        const double* wk = th + std::size_t{static_cast<std::size_t>(k)} * (d + 1);
        eta[k] = dot_row(wk, xi, d) + wk[d];
        m = std::max(m, eta[k]);
      }
      double z = 0;
      for (int k = 0; k < c; ++k) z += std::exp(eta[k] - m);
      const double lse = m + std::log(z);
      const int yi = static_cast<int>(y[i]);
      sum += eta[yi] - lse;
      for (int k = 0; k < c; ++k) {
        // d/d eta_k = 1[y = k] - softmax_k.
        const double r = (k == yi ? 1.0 : 0.0) - std::exp(eta[k] - lse);
        double* gk = g + static_cast<std::size_t>(k) * (d + 1);
        add_scaled_row(r, xi, d, gk);
        gk[d] += r;
      }
    }
    return sum;
  }
  const double inv_var = 1.0 / (noise_sd * noise_sd);
  const double lin_const = -0.5 * std::log(2 * std::numbers::pi * noise_sd * noise_sd);
  for (std::size_t i = 0; i < n; ++i) {
    const double* xi = x.data() + i * static_cast<std::size_t>(d);
    const double eta = dot_row(th, xi, d) + th[d];
    double r = 0;  // d log p / d eta
    switch (likelihood) {
      case Likelihood::kLogistic:
        // y eta - softplus(eta) = -softplus(-eta) for y = 1, -softplus(eta) for y = 0.
        sum += y[i] > 0.5 ? -softplus(-eta) : -softplus(eta);
        r = y[i] - 1.0 / (1.0 + std::exp(-eta));
        break;
      case Likelihood::kLinear:
        sum += lin_const - 0.5 * (y[i] - eta) * (y[i] - eta) * inv_var;
        r = (y[i] - eta) * inv_var;
        break;
      case Likelihood::kPoisson: {
        const double mu = std::exp(eta);
        sum += y[i] * eta - mu - std::lgamma(y[i] + 1);
        r = y[i] - mu;
        break;
      }
      case Likelihood::kSoftmax:
        break;  // handled above
    }
    add_scaled_row(r, xi, d, g);
    g[d] += r;
  }
  return sum;
}

void Glm::loglik_draws(std::span<const double> theta, int samples, std::span<const double> x,
                       std::span<const double> y, std::span<double> f,
                       std::span<double> grad) const {
  using RowMajor = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  using Stride = Eigen::OuterStride<>;
  const int d = features, c = outputs();
  const auto n = static_cast<Eigen::Index>(y.size());
  const auto p = n_params();
  const Eigen::Map<const RowMajor> xm(x.data(), n, d);
  // eta(i, s * C + k) = w_{s,k} . x_i + b_{s,k}: one product for every draw and output.
  const Eigen::Map<const RowMajor, 0, Stride> w(theta.data(), samples * c, d, Stride(d + 1));
  RowMajor eta = xm * w.transpose();
  RowMajor r(n, samples * c);  // d log p / d eta
  const double inv_var = 1.0 / (noise_sd * noise_sd);
  const double lin_const = -0.5 * std::log(2 * std::numbers::pi * noise_sd * noise_sd);
  for (int s = 0; s < samples; ++s) {
    double sum = 0;
    for (int k = 0; k < c; ++k) {
      const double b = theta[static_cast<std::size_t>(s * p + k * (d + 1) + d)];
      for (Eigen::Index i = 0; i < n; ++i) eta(i, s * c + k) += b;
    }
    for (Eigen::Index i = 0; i < n; ++i) {
      double* e = &eta(i, s * c);
      double* ri = &r(i, s * c);
      switch (likelihood) {
        case Likelihood::kLogistic:
          sum += y[i] > 0.5 ? -softplus(-e[0]) : -softplus(e[0]);
          ri[0] = y[i] - 1.0 / (1.0 + std::exp(-e[0]));
          break;
        case Likelihood::kLinear:
          sum += lin_const - 0.5 * (y[i] - e[0]) * (y[i] - e[0]) * inv_var;
          ri[0] = (y[i] - e[0]) * inv_var;
          break;
        case Likelihood::kPoisson: {
          const double mu = std::exp(e[0]);
          sum += y[i] * e[0] - mu - std::lgamma(y[i] + 1);
          ri[0] = y[i] - mu;
          break;
        }
        case Likelihood::kSoftmax: {
          double m = -INFINITY, z = 0;
          for (int k = 0; k < c; ++k) m = std::max(m, e[k]);
          for (int k = 0; k < c; ++k) z += std::exp(e[k] - m);
          const double lse = m + std::log(z);
          const int yi = static_cast<int>(y[i]);
          sum += e[yi] - lse;
          for (int k = 0; k < c; ++k) ri[k] = (k == yi ? 1.0 : 0.0) - std::exp(e[k] - lse);
          break;
        }
      }
    }
    f[static_cast<std::size_t>(s)] += sum;
  }
  // Weights: grad_w(s * C + k, :) += r(:, s * C + k)^T X; intercepts: column sums in row order.
  Eigen::Map<RowMajor, 0, Stride> gw(grad.data(), samples * c, d, Stride(d + 1));
  gw.noalias() += r.transpose() * xm;
  for (int j = 0; j < samples * c; ++j) {
    double sb = 0;
    for (Eigen::Index i = 0; i < n; ++i) sb += r(i, j);
    grad[static_cast<std::size_t>(j) * (d + 1) + d] += sb;
  }
}

double Glm::log_prior(std::span<const double> theta, std::span<double> grad) const {
  const double inv_var = 1.0 / (prior_scale * prior_scale);
  double ss = 0;
  for (std::size_t j = 0; j < theta.size(); ++j) {
    ss += theta[j] * theta[j];
    grad[j] -= theta[j] * inv_var;
  }
  const double p = static_cast<double>(theta.size());
  return -0.5 * p * std::log(2 * std::numbers::pi * prior_scale * prior_scale) - 0.5 * ss * inv_var;
}

void Glm::check_responses(std::span<const double> y, std::int64_t first_row) const {
  for (std::size_t i = 0; i < y.size(); ++i) {
    const double v = y[i];
    const std::string row = "response row " + std::to_string(first_row + std::int64_t(i));
    if (!std::isfinite(v)) throw Error(row + " is not finite");
    switch (likelihood) {
      case Likelihood::kLogistic:
        if (v != 0 && v != 1) throw Error(row + " is not a 0/1 label (logistic regression)");
        break;
      case Likelihood::kPoisson:
        if (v < 0 || v != std::floor(v))
          throw Error(row + " is not a non-negative integer count (Poisson regression)");
        break;
      case Likelihood::kSoftmax:
        if (v < 0 || v >= classes || v != std::floor(v))
          throw Error(row + " is not a class label in [0, " + std::to_string(classes) +
                      ") (softmax regression)");
        break;
      case Likelihood::kLinear:
        break;
    }
  }
}

}  // namespace caviar::bbvi
