#include "models/bbvi/glm.hpp"

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <numbers>
#include <vector>

#include "core/error.hpp"
#include "core/scratch.hpp"

namespace caviar::bbvi {
namespace {

using RowMajor = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using RowMap = Eigen::Map<RowMajor, Eigen::AlignedMax>;
struct EtaTag;
struct ResidualTag;
struct SumsTag;
struct GradTag;

// The logistic likelihood of every (row, draw) of a block: eta is n x S (C = 1), y the n labels.
// Adds each draw's sum of log p(y_i | eta_is) over the rows, in row order, to f, and writes
// d log p / d eta = y - sigmoid(eta) into r. With t = exp(-|eta|), u = 1 + t:
//   log p(y | eta) = -softplus(a), a = eta (y = 0) or -eta (y = 1), softplus(a) = max(a, 0) +
//   log1p(t), without overflow for any eta; sigmoid(eta) = 1 / u (eta >= 0) or t / u.
// Vectorised (Eigen's exp and log are SIMD for doubles, its log1p is not) in chunks held on the
// stack, since a block can be a single row: log1p(t) = log(u) t / (u - 1), accurate to a few
// ulps because u - 1 is exact (Goldberg 1991, Theorem 4), and t where u rounds to 1. As scalar
// library calls these functions were more than half of the CPU time of a logistic fit with its
// default 1,000-draw k-hat pass over every row (perf; N = 1e6, D = 50, 600 steps). The
// arithmetic runs on whole chunks and the choices between two values are separate loops that only
// pick, which the compiler turns into SIMD blends: Eigen 3.4 evaluates select() one coefficient at
// a time, with a branch on the sign of eta that is a coin flip. The entry's row and draw are
// counted, not divided out. Both were a quarter of this function's time (perf, one row per block,
// on a CPU with slow 64-bit division).
void logistic_terms(const RowMap& eta, std::span<const double> y, RowMap& r, std::span<double> f) {
  constexpr Eigen::Index kChunk = 256;
  using Chunk = Eigen::Array<double, Eigen::Dynamic, 1, 0, kChunk, 1>;
  const Eigen::Index s = eta.cols(), total = eta.rows() * s;
  double* const sums = thread_scratch<SumsTag>(static_cast<std::size_t>(s));
  std::fill(sums, sums + s, 0.0);
  // Entry c0 + j of eta (row-major) is row (c0 + j) / s, draw (c0 + j) % s.
  Eigen::Index row = 0, draw = 0;
  for (Eigen::Index c0 = 0; c0 < total; c0 += kChunk) {
    const Eigen::Index m = std::min(kChunk, total - c0);
    const Eigen::Map<const Eigen::ArrayXd> e(eta.data() + c0, m);
    Chunk yv(m);
    for (Eigen::Index j = 0, i = row, k = draw; j < m; ++j) {
      yv[j] = y[static_cast<std::size_t>(i)];
      if (++k == s) k = 0, ++i;
    }
    const Chunk t = (-e.abs()).exp();
    const Chunk u = 1.0 + t;
    const Chunk log_u = u.log();
    const Chunk u_1 = u - 1.0;
    Chunk den(m);
    for (Eigen::Index j = 0; j < m; ++j) {
      const double v = u_1[j];
      den[j] = u[j] == 1.0 ? 1.0 : v;
    }
    const Chunk q = log_u * t / den;  // log1p(t) where u > 1
    const Chunk inv_u = 1.0 / u, t_u = t / u;
    Chunk log1p_t(m), sigmoid(m);
    for (Eigen::Index j = 0; j < m; ++j) {
      const double tj = t[j], qj = q[j], inv = inv_u[j], tu = t_u[j];
      log1p_t[j] = u[j] == 1.0 ? tj : qj;
      sigmoid[j] = e[j] >= 0.0 ? inv : tu;
    }
    Eigen::Map<Eigen::ArrayXd>(r.data() + c0, m) = yv - sigmoid;
    const Chunk a = e * (1.0 - 2.0 * yv);  // exact: y is 0 or 1
    const Chunk lik = -(a.max(0.0) + log1p_t);
    for (Eigen::Index j = 0; j < m; ++j) {
      sums[static_cast<std::size_t>(draw)] += lik[j];
      if (++draw == s) draw = 0, ++row;
    }
  }
  for (Eigen::Index k = 0; k < s; ++k)
    f[static_cast<std::size_t>(k)] += sums[static_cast<std::size_t>(k)];
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
  double f = 0;
  std::vector<double> g(grad.size());
  loglik_draws(theta, 1, x, y, {&f, 1}, g);
  for (std::size_t j = 0; j < grad.size(); ++j) grad[j] += g[j];
  return f;
}

void Glm::loglik_draws(std::span<const double> theta, int samples, std::span<const double> x,
                       std::span<const double> y, std::span<double> f, std::span<double> grad,
                       std::size_t grad_stride) const {
  using Stride = Eigen::OuterStride<>;
  const int d = features, c = outputs();
  const auto n = static_cast<Eigen::Index>(y.size());
  const auto p = n_params();
  const Eigen::Map<const RowMajor> xm(x.data(), n, d);
  // eta(i, s * C + k) = w_{s,k} . x_i + b_{s,k}: one product for every draw and output.
  const Eigen::Map<const RowMajor, 0, Stride> w(theta.data(), samples * c, d, Stride(d + 1));
  const auto cols = static_cast<std::size_t>(samples * c);
  RowMap eta(thread_scratch<EtaTag>(static_cast<std::size_t>(n) * cols), n, samples * c);
  // One row and one output (most minibatch groups when N >> B): S dot products, and below S
  // scaled copies of the row, without a matrix product's dispatch and packing, which took most
  // of such a group's time. Gradient bits are those of the product (one rounding each); eta's
  // are a fixed function of the row and the draws, as the product's were.
  const bool one_row = n == 1 && c == 1;
  if (one_row)
    for (int s = 0; s < samples; ++s) eta(0, s) = w.row(s).dot(xm.row(0));
  else
    eta.noalias() = xm * w.transpose();
  RowMap r(thread_scratch<ResidualTag>(static_cast<std::size_t>(n) * cols), n,
           samples * c);  // d log p / d eta
  const double inv_var = 1.0 / (noise_sd * noise_sd);
  const double lin_const = -0.5 * std::log(2 * std::numbers::pi * noise_sd * noise_sd);
  for (int s = 0; s < samples; ++s)
    for (int k = 0; k < c; ++k) {
      const double b = theta[static_cast<std::size_t>(s * p + k * (d + 1) + d)];
      for (Eigen::Index i = 0; i < n; ++i) eta(i, s * c + k) += b;
    }
  std::fill(f.begin(), f.begin() + samples, 0.0);
  if (likelihood == Likelihood::kLogistic) logistic_terms(eta, y, r, f);
  // The other likelihoods, per draw in row order (logistic_terms did the logistic's).
  for (int s = 0; s < samples && likelihood != Likelihood::kLogistic; ++s) {
    double sum = 0;
    for (Eigen::Index i = 0; i < n; ++i) {
      double* e = &eta(i, s * c);
      double* ri = &r(i, s * c);
      switch (likelihood) {
        case Likelihood::kLogistic:
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
  if (grad.empty()) return;  // the log-likelihoods only (ELBO and diagnostic passes)
  // Weights: grad_w(s * C + k, :) = r(:, s * C + k)^T X; intercepts: column sums in row order.
  // Row s * C + k starts at grad[s * ld + k * (D + 1)]: one stride when C = 1 or the draws are
  // packed (ld = P), so a caller's buffer takes the values in place (a minibatch group's tree
  // node: no zeroing and no copy per row, which were a tenth of a logistic step, perf); else
  // (softmax, strided) through a packed scratch. Each value is that of adding it to zeros (0 + v,
  // -0 included), as when the gradient was accumulated into a zeroed buffer: the same bits.
  const std::size_t ld = grad_stride != 0 ? grad_stride : static_cast<std::size_t>(p);
  const bool packed = c == 1 || ld == static_cast<std::size_t>(p);
  const Eigen::Index row_stride = packed && c == 1 ? static_cast<Eigen::Index>(ld) : d + 1;
  double* const g = packed ? grad.data() : thread_scratch<GradTag>(cols * std::size_t(d + 1));
  Eigen::Map<RowMajor, 0, Stride> gw(g, samples * c, d, Stride(row_stride));
  if (one_row) {
    for (int s = 0; s < samples; ++s) gw.row(s).array() = r(0, s) * xm.row(0).array() + 0.0;
  } else {
    gw.setZero();
    gw.noalias() += r.transpose() * xm;
  }
  for (int j = 0; j < samples * c; ++j) {
    double sb = 0;
    for (Eigen::Index i = 0; i < n; ++i) sb += r(i, j);
    g[j * row_stride + d] = sb;
  }
  if (packed) return;
  for (int s = 0; s < samples; ++s)
    std::copy_n(g + std::size_t(s) * std::size_t(p), p, grad.data() + std::size_t(s) * ld);
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
