#include "models/gmm_gibbs/draws.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/error.hpp"
#include "core/rng.hpp"
#include "core/vec4.hpp"

namespace caviar::gmm_gibbs {
namespace {

constexpr auto kGamma = static_cast<std::uint32_t>(Stream::kGibbsGamma);

// Index of the i-th Gamma draw of draw `key` (i < 2^16: D and K are far below).
std::uint64_t gamma_index(std::uint64_t key, int i) {
  return (key << 16) | static_cast<std::uint64_t>(i);
}

// The key of component k's draw at `sweep` (k = K: the weights).
std::uint64_t component_key(std::uint64_t sweep, int k, int n_components) {
  return sweep * static_cast<std::uint64_t>(n_components + 1) + static_cast<std::uint64_t>(k);
}

}  // namespace

Eigen::VectorXd draw_dirichlet(const Eigen::VectorXd& alpha, std::uint64_t seed,
                               std::uint64_t sweep) {
  const int k = static_cast<int>(alpha.size());
  const std::uint64_t key = component_key(sweep, k, k);
  Eigen::VectorXd g(k);
  for (int j = 0; j < k; ++j) g[j] = sample_gamma(seed, kGamma, gamma_index(key, j), alpha[j]);
  double s = 0;
  for (int j = 0; j < k; ++j) s += g[j];
  return g / s;
}

Eigen::MatrixXd draw_bartlett(double nu, int d, std::uint64_t seed, std::uint64_t key) {
  if (!(nu > d - 1)) throw Error("Wishart degrees of freedom must exceed D - 1");
  const CounterRng normal(seed, Stream::kGibbsNormal);
  Eigen::MatrixXd a = Eigen::MatrixXd::Zero(d, d);
  for (int i = 0; i < d; ++i) {
    // chi^2(nu - i) = 2 Gamma((nu - i) / 2).
    a(i, i) = std::sqrt(2 * sample_gamma(seed, kGamma, gamma_index(key, i), 0.5 * (nu - i)));
    for (int j = 0; j < i; ++j)
      a(i, j) = normal.normal2(key, static_cast<std::uint32_t>(i * d + j))[0];
  }
  return a;
}

Params draw_params(const gmm::Posterior& post, gmm::Covariance cov, std::uint64_t seed,
                   std::uint64_t sweep) {
  const int k_n = static_cast<int>(post.m.rows()), d = static_cast<int>(post.m.cols());
  if (post.alpha.size() != k_n) throw Error("the blocked sampler needs Dirichlet weights");
  Params p;
  p.weights = draw_dirichlet(post.alpha, seed, sweep);
  p.means.resize(k_n, d);
  const CounterRng normal(seed, Stream::kGibbsNormal);
  for (int k = 0; k < k_n; ++k) {
    const std::uint64_t key = component_key(sweep, k, k_n);
    // The mean's noise: steps after the d x d used by the Wishart's off-diagonal normals.
    Eigen::VectorXd z(d);
    for (int j = 0; j < d; ++j)
      z[j] = normal.normal2(key, static_cast<std::uint32_t>(d * d + j))[0];
    const double scale = 1 / std::sqrt(post.beta[k]);
    if (cov == gmm::Covariance::kDiag) {
      // Each dimension: lambda ~ Gamma(nu / 2, rate W^-1 / 2), mu | lambda ~ N(m, 1 / (beta
      // lambda)).
      Eigen::MatrixXd lam(d, 1);
      for (int j = 0; j < d; ++j) {
        lam(j, 0) = 2 * sample_gamma(seed, kGamma, gamma_index(key, j), 0.5 * post.nu[k]) /
                    post.W_inv[k](j, 0);
        p.means(k, j) = post.m(k, j) + scale * z[j] / std::sqrt(lam(j, 0));
      }
      p.precision.push_back(std::move(lam));
      continue;
    }
    const Eigen::LLT<Eigen::MatrixXd> llt(post.W_inv[k]);
    const Eigen::MatrixXd r = llt.matrixL();
    const Eigen::MatrixXd a = draw_bartlett(post.nu[k], d, seed, key);
    // C = R^-T A (solve R^T C = A); mu = m + R (A^-T z) / sqrt(beta).
    const Eigen::MatrixXd c = r.triangularView<Eigen::Lower>().transpose().solve(a);
    const Eigen::VectorXd y = a.triangularView<Eigen::Lower>().transpose().solve(z);
    p.means.row(k) = post.m.row(k) + scale * (r * y).transpose();
    p.precision.push_back(c * c.transpose());
  }
  return p;
}

LabelKernel::LabelKernel(const Params& p, gmm::Covariance cov)
    : p_(p), diag_(cov == gmm::Covariance::kDiag) {
  const int k_n = static_cast<int>(p.weights.size()), d = static_cast<int>(p.means.cols());
  // Per component: the Cholesky factor L of Lambda (full) and log pi + log det(Lambda) / 2 -
  // D log(2 pi) / 2.
  chol_.resize(static_cast<std::size_t>(k_n));
  offset_.resize(k_n);
  for (int k = 0; k < k_n; ++k) {
    double half_logdet = 0;
    if (diag_) {
      for (int j = 0; j < d; ++j) half_logdet += 0.5 * std::log(p.precision[k](j, 0));
    } else {
      const Eigen::LLT<Eigen::MatrixXd> llt(p.precision[k]);
      if (llt.info() != Eigen::Success)
        throw Error("a drawn precision matrix is not positive definite");
      chol_[k] = llt.matrixL();
      for (int j = 0; j < d; ++j) half_logdet += std::log(chol_[k](j, j));
    }
    offset_[k] = std::log(p.weights[k]) + half_logdet - 0.5 * d * std::log(2 * std::numbers::pi);
  }
}

void LabelKernel::log_joint(const Eigen::Ref<const gmm::RowMatrix>& x, Eigen::Index i0,
                            Eigen::Index m, std::vector<double>& scratch, double* logp) const {
  const int k_n = static_cast<int>(offset_.size()), d = static_cast<int>(x.cols());
  if (diag_) {
    for (Eigen::Index i = 0; i < m; ++i)
      for (int k = 0; k < k_n; ++k) {
        double q = 0;
        for (int j = 0; j < d; ++j) {
          const double diff = x(i0 + i, j) - p_.means(k, j);
          q += p_.precision[k](j, 0) * diff * diff;
        }
        logp[i * k_n + k] = offset_[k] - 0.5 * q;
      }
    return;
  }
  // (x - mu)^T L L^T (x - mu) = |L^T (x - mu)|^2, each line (L^T (x - mu))_j summed over r >= j
  // in index order and the squares summed over j in order, for kGroup rows at once: vectors run
  // across rows, so each row's sums are the same operations in the same order as one row alone
  // (the bits do not depend on the grouping), while the D^2 / 2 multiply-adds of a row and
  // component, a chain of dependent adds for one row, become kGroup / 4 independent chains.
  constexpr int kVecs = kGroup / 4;
  static_assert(kGroup % 4 == 0);
  constexpr std::size_t per_dim = kGroup;  // the scratch rows' length
  scratch.assign(2 * std::size_t(d) * per_dim, 0.0);
  double* xt = scratch.data();  // xt[r][row]: the group's rows transposed (unused rows zero)
  double* dt = xt + std::size_t(d) * per_dim;  // dt[r][row] = x_row,r - mu_k,r
  for (Eigen::Index i = 0; i < m; ++i)
    for (int r = 0; r < d; ++r) xt[std::size_t(r) * per_dim + std::size_t(i)] = x(i0 + i, r);
  for (int k = 0; k < k_n; ++k) {
    for (int r = 0; r < d; ++r)
      for (std::size_t c = 0; c < per_dim; ++c)
        dt[std::size_t(r) * per_dim + c] = xt[std::size_t(r) * per_dim + c] - p_.means(k, r);
    const double* l = chol_[std::size_t(k)].data();  // column-major: L(r, j) = l[j d + r]
    Vec4 q[kVecs] = {};
    for (int j = 0; j < d; ++j) {
      Vec4 v[kVecs] = {};
      for (int r = j; r < d; ++r) {
        const Vec4 lr = splat<Vec4>(l[std::size_t(j) * std::size_t(d) + std::size_t(r)]);
        const double* row = dt + std::size_t(r) * per_dim;
#pragma GCC unroll 4
        for (int c = 0; c < kVecs; ++c) v[c] += lr * vload<Vec4>(row + 4 * c);
      }
#pragma GCC unroll 4
      for (int c = 0; c < kVecs; ++c) q[c] += v[c] * v[c];
    }
    for (Eigen::Index i = 0; i < m; ++i) logp[i * k_n + k] = offset_[k] - 0.5 * q[i / 4][i % 4];
  }
}

template <class Row>
void LabelKernel::for_rows(const Eigen::Ref<const gmm::RowMatrix>& x, Row&& row) const {
  const int k_n = static_cast<int>(offset_.size());
  std::vector<double> scratch, group(std::size_t(kGroup) * std::size_t(k_n));
  for (Eigen::Index i0 = 0; i0 < x.rows(); i0 += kGroup) {
    const Eigen::Index m = std::min(kGroup, x.rows() - i0);
    log_joint(x, i0, m, scratch, group.data());
    for (Eigen::Index g = 0; g < m; ++g) {
      const double* logp = group.data() + g * k_n;
      double mx = logp[0];
      for (int k = 1; k < k_n; ++k) mx = std::max(mx, logp[k]);
      double total = 0;
      for (int k = 0; k < k_n; ++k) total += std::exp(logp[k] - mx);
      row(i0 + g, logp, mx, total);
    }
  }
}

void LabelKernel::draw(const Eigen::Ref<const gmm::RowMatrix>& x, std::int64_t first_row,
                       std::uint64_t seed, std::uint64_t sweep, std::span<std::int64_t> labels,
                       std::span<double> terms) const {
  const int k_n = static_cast<int>(offset_.size());
  const CounterRng rng(seed, Stream::kGibbsLabels);
  for_rows(x, [&](Eigen::Index i, const double* logp, double mx, double total) {
    const std::uint64_t row = static_cast<std::uint64_t>(first_row + i);
    const double u = rng.uniform2(row, static_cast<std::uint32_t>(sweep))[0] * total;
    int z = k_n - 1;
    double cdf = 0;
    for (int k = 0; k < k_n; ++k) {
      cdf += std::exp(logp[k] - mx);
      if (u < cdf) {
        z = k;
        break;
      }
    }
    labels[static_cast<std::size_t>(i)] = z;
    terms[static_cast<std::size_t>(i)] = logp[z];
  });
}

void LabelKernel::log_density(const Eigen::Ref<const gmm::RowMatrix>& x,
                              std::span<double> out) const {
  for_rows(x, [&](Eigen::Index i, const double*, double mx, double total) {
    out[static_cast<std::size_t>(i)] = mx + std::log(total);
  });
}

void draw_labels(const Params& p, gmm::Covariance cov, const gmm::RowMatrix& x,
                 std::int64_t first_row, std::uint64_t seed, std::uint64_t sweep,
                 std::span<std::int64_t> labels, std::span<double> terms) {
  LabelKernel(p, cov).draw(x, first_row, seed, sweep, labels, terms);
}

}  // namespace caviar::gmm_gibbs
