#include "models/gmm_gibbs/summarize.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "core/error.hpp"

namespace caviar::gmm_gibbs {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Mean and standard deviation (divisor n - 1) over the n rows of `x` (n x width, row-major), each
// column by two passes, summed in row order: the same bits on every rank.
Moments column_moments(const std::vector<double>& x, std::int64_t n, std::size_t width) {
  Moments m{std::vector<double>(width, 0.0), std::vector<double>(width, 0.0)};
  for (std::int64_t t = 0; t < n; ++t)
    for (std::size_t j = 0; j < width; ++j) m.mean[j] += x[static_cast<std::size_t>(t) * width + j];
  for (double& v : m.mean) v /= static_cast<double>(n);
  for (std::int64_t t = 0; t < n; ++t)
    for (std::size_t j = 0; j < width; ++j) {
      const double e = x[static_cast<std::size_t>(t) * width + j] - m.mean[j];
      m.sd[j] += e * e;
    }
  for (double& v : m.sd) v = n > 1 ? std::sqrt(v / static_cast<double>(n - 1)) : kNaN;
  return m;
}

double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

// Copies per-component blocks of `per` values of draw t from `src` into `dst` in the reference's
// order: reference component k takes the chain's component match[k].
void permute_draw(const std::vector<double>& src, std::vector<double>& dst, std::int64_t t, int k_n,
                  std::size_t per, const std::int64_t* match) {
  const std::size_t row = static_cast<std::size_t>(t) * static_cast<std::size_t>(k_n) * per;
  for (int k = 0; k < k_n; ++k)
    std::copy_n(
        src.begin() + static_cast<std::ptrdiff_t>(row + static_cast<std::size_t>(match[k]) * per),
        per, dst.begin() + static_cast<std::ptrdiff_t>(row + static_cast<std::size_t>(k) * per));
}

}  // namespace

std::vector<int> min_cost_assignment(const Eigen::MatrixXd& cost) {
  const int n = static_cast<int>(cost.rows());
  if (cost.cols() != n) throw Error("the assignment needs a square cost matrix");
  if (!cost.allFinite()) throw Error("the assignment's costs must be finite");
  // Potentials u (rows), v (columns) keep every reduced cost cost(i, j) - u_i - v_j >= 0, zero on
  // the matched pairs (Kuhn 1955); p[j]: the row matched to column j (0: none; rows and
  // columns count from 1, column 0 is the new row's virtual start); way[j]: the previous column on
  // the shortest alternating path to j. Each row is added by a Dijkstra-like search over the
  // reduced costs, O(K^2) per row, O(K^3) in all: Kuhn's and Munkres' (1957) method in its
  // shortest-augmenting-path form.
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<double> u(static_cast<std::size_t>(n) + 1, 0.0), v(u);
  std::vector<int> p(static_cast<std::size_t>(n) + 1, 0), way(p);
  for (int i = 1; i <= n; ++i) {
    p[0] = i;
    int j0 = 0;
    std::vector<double> minv(static_cast<std::size_t>(n) + 1, inf);
    std::vector<char> used(static_cast<std::size_t>(n) + 1, 0);
    do {
      used[j0] = 1;
      const int i0 = p[j0];
      double delta = inf;
      int j1 = 0;
      for (int j = 1; j <= n; ++j) {
        if (used[j]) continue;
        const double cur = cost(i0 - 1, j - 1) - u[i0] - v[j];
        if (cur < minv[j]) {
          minv[j] = cur;
          way[j] = j0;
        }
        if (minv[j] < delta) {
          delta = minv[j];
          j1 = j;
        }
      }
      for (int j = 0; j <= n; ++j) {
        if (used[j]) {
          u[p[j]] += delta;
          v[j] -= delta;
        } else {
          minv[j] -= delta;
        }
      }
      j0 = j1;
    } while (p[j0] != 0);
    do {  // flip the path: every column on it takes the row of its predecessor
      const int j1 = way[j0];
      p[j0] = p[j1];
      j0 = j1;
    } while (j0 != 0);
  }
  std::vector<int> out(static_cast<std::size_t>(n), 0);
  for (int j = 1; j <= n; ++j) out[p[j] - 1] = j - 1;
  return out;
}

MixtureDraws collapsed_posterior_means(std::int64_t n, int k, int d,
                                       const std::vector<double>& counts,
                                       const std::vector<double>& sums, double alpha0, double beta0,
                                       const std::vector<double>& m0) {
  MixtureDraws out;
  out.n = n;
  out.k = k;
  out.d = d;
  out.weights.resize(counts.size());
  out.means.resize(sums.size());
  const auto ku = static_cast<std::size_t>(k), du = static_cast<std::size_t>(d);
  for (std::int64_t t = 0; t < n; ++t) {
    const double* c = counts.data() + static_cast<std::size_t>(t) * ku;
    double total = 0;
    for (std::size_t j = 0; j < ku; ++j) total += c[j];
    for (std::size_t j = 0; j < ku; ++j) {
      const std::size_t w = static_cast<std::size_t>(t) * ku + j;
      out.weights[w] = (alpha0 + c[j]) / (static_cast<double>(k) * alpha0 + total);  // (B.17)
      for (std::size_t e = 0; e < du; ++e)  // beta_k m_k = beta0 m0 + S_k (10.60-10.61)
        out.means[w * du + e] = (beta0 * m0[e] + sums[w * du + e]) / (beta0 + c[j]);
    }
  }
  return out;
}

ChainSummary summarize_chain(const MixtureDraws& draws, const Mixture& ref) {
  if (draws.k != ref.k || draws.d != ref.d)
    throw Error(
        "the chain has K = " + std::to_string(draws.k) + ", D = " + std::to_string(draws.d) +
        " but the reference has K = " + std::to_string(ref.k) + ", D = " + std::to_string(ref.d));
  const int k_n = draws.k;
  const auto ku = static_cast<std::size_t>(k_n), du = static_cast<std::size_t>(draws.d);
  ChainSummary s;
  s.matching.resize(static_cast<std::size_t>(draws.n) * ku);
  Eigen::MatrixXd cost(k_n, k_n);
  for (std::int64_t t = 0; t < draws.n; ++t) {
    const double* mu = draws.means.data() + static_cast<std::size_t>(t) * ku * du;
    // cost(k, j): squared distance between reference mean k and the draw's mean j.
    for (std::size_t k = 0; k < ku; ++k)
      for (std::size_t j = 0; j < ku; ++j) {
        double c = 0;
        for (std::size_t e = 0; e < du; ++e) {
          const double diff = ref.means[k * du + e] - mu[j * du + e];
          c += diff * diff;
        }
        cost(static_cast<Eigen::Index>(k), static_cast<Eigen::Index>(j)) = c;
      }
    const std::vector<int> a = min_cost_assignment(cost);
    std::copy(a.begin(), a.end(), s.matching.begin() + static_cast<std::ptrdiff_t>(t * k_n));
  }
  MixtureDraws& r = s.relabelled;
  r = draws;
  const bool with_cov = !draws.covariances.empty();
  for (std::int64_t t = 0; t < draws.n; ++t) {
    const std::int64_t* match = s.matching.data() + static_cast<std::size_t>(t) * ku;
    permute_draw(draws.weights, r.weights, t, k_n, 1, match);
    permute_draw(draws.means, r.means, t, k_n, du, match);
    if (with_cov) permute_draw(draws.covariances, r.covariances, t, k_n, du * du, match);
  }
  s.weights = column_moments(r.weights, draws.n, ku);
  s.means = column_moments(r.means, draws.n, ku * du);
  s.max_diff_weight = max_abs_diff(s.weights.mean, ref.weights);
  s.max_diff_mean = max_abs_diff(s.means.mean, ref.means);
  s.max_diff_covariance = kNaN;
  if (with_cov) {
    s.covariances = column_moments(r.covariances, draws.n, ku * du * du);
    s.max_diff_covariance = max_abs_diff(s.covariances.mean, ref.covariances);
  }
  return s;
}

}  // namespace caviar::gmm_gibbs
