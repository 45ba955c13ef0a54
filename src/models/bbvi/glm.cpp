#include "models/bbvi/glm.hpp"

#include <Eigen/Dense>
#include <algorithm>
#include <array>
#include <cmath>
#include <numbers>
#include <vector>

#include "core/error.hpp"
#include "core/scratch.hpp"
#include "core/tree_sum.hpp"
#include "core/vec4.hpp"

namespace caviar::bbvi {
namespace {

struct EtaTag;
struct WeightsTag;

// log p(y | eta) and d log p / d eta = y - sigmoid(eta) of the logistic likelihood for `total`
// entries, entry j's label y[j / s] (s draws per row). With t = exp(-|eta|), u = 1 + t:
//   log p(y | eta) = -softplus(a), a = eta (y = 0) or -eta (y = 1), softplus(a) = max(a, 0) +
//   log1p(t), without overflow for any eta; sigmoid(eta) = 1 / u (eta >= 0) or t / u.
// Vectorised (Eigen's exp and log are SIMD for doubles, its log1p is not) in chunks held on the
// stack: log1p(t) = log(u) t / (u - 1), accurate to a few ulps because u - 1 is exact (Goldberg
// 1991, Theorem 4), and t where u rounds to 1. As scalar library calls these functions were more
// than half of the CPU time of a logistic fit with its default 1,000-draw k-hat pass over every
// row (perf; N = 1e6, D = 50, 600 steps). The arithmetic runs on whole chunks and the choices
// between two values are separate loops that only pick, which the compiler turns into SIMD blends
// (Eigen 3.4 evaluates select() one coefficient at a time, with a branch on the sign of eta that
// is a coin flip). Each entry's values depend on its eta and label alone.
void logistic_terms(const double* eta, Eigen::Index total, int s, std::span<const double> y,
                    double* lik, double* r) {
  // Every chunk is computed in whole vectors (padded with zeros to kPad entries): Eigen computes
  // a remainder after its last whole vector with the scalar exp and log, whose bits differ from
  // the vector ones', and an entry's place in a run of rows depends on the thread split.
  constexpr Eigen::Index kChunk = 256, kPad = 8;
  using Chunk = Eigen::Array<double, Eigen::Dynamic, 1, 0, kChunk, 1>;
  Eigen::Index row = 0, draw = 0;  // of entry c0 (counted, not divided out)
  for (Eigen::Index c0 = 0; c0 < total; c0 += kChunk) {
    const Eigen::Index m = std::min(kChunk, total - c0), mp = (m + kPad - 1) / kPad * kPad;
    Chunk e(mp), yv(mp);
    for (Eigen::Index j = 0; j < m; ++j) {
      e[j] = eta[c0 + j];
      yv[j] = y[static_cast<std::size_t>(row)];
      if (++draw == s) draw = 0, ++row;
    }
    for (Eigen::Index j = m; j < mp; ++j) e[j] = yv[j] = 0.0;
    const Chunk t = (-e.abs()).exp();
    const Chunk u = 1.0 + t;
    const Chunk log_u = u.log();
    const Chunk u_1 = u - 1.0;
    Chunk den(mp);
    for (Eigen::Index j = 0; j < mp; ++j) {
      const double v = u_1[j];
      den[j] = u[j] == 1.0 ? 1.0 : v;
    }
    const Chunk q = log_u * t / den;  // log1p(t) where u > 1
    const Chunk inv_u = 1.0 / u, t_u = t / u;
    Chunk log1p_t(mp), sigmoid(mp);
    for (Eigen::Index j = 0; j < mp; ++j) {
      const double tj = t[j], qj = q[j], inv = inv_u[j], tu = t_u[j];
      log1p_t[j] = u[j] == 1.0 ? tj : qj;
      sigmoid[j] = e[j] >= 0.0 ? inv : tu;
    }
    const Chunk a = e * (1.0 - 2.0 * yv);  // exact: y is 0 or 1
    const Chunk l = -(a.max(0.0) + log1p_t), res = yv - sigmoid;
    std::copy_n(res.data(), m, r + c0);
    std::copy_n(l.data(), m, lik + c0);
  }
}

// eta(i, c) = w_c . x_i + b_c for R rows from x (row-major, D columns) and the 4 NV columns
// [c0, c0 + 4 NV) of wt, theta transposed ((D + 1) rows of ldw, the intercepts last): four columns'
// weights of one feature are one vector, so each column is one chain of fused multiply-adds over
// the features in order, then the intercept added. Every eta is computed so, whatever R, NV and
// c0 are: it depends on its row and column alone, not on the other rows prepared with it (which
// depend on the thread split) nor on where they sit in memory. Only the first `valid` columns of
// the block are stored.
template <int R, int NV>
inline void eta_block(const double* wt, std::size_t ldw, int d, const double* x, int c0, int valid,
                      double* eta, std::size_t lde) {
  Vec4 acc[R][NV] = {};
  for (int j = 0; j < d; ++j) {
    const double* w = wt + static_cast<std::size_t>(j) * ldw + c0;
    Vec4 wv[NV];
    for (int v = 0; v < NV; ++v) wv[v] = vload<Vec4>(w + 4 * v);
    for (int r = 0; r < R; ++r) {
      const Vec4 xr = splat<Vec4>(x[static_cast<std::size_t>(r) * std::size_t(d) + std::size_t(j)]);
      for (int v = 0; v < NV; ++v) acc[r][v] = vfma(xr, wv[v], acc[r][v]);
    }
  }
  const double* b = wt + static_cast<std::size_t>(d) * ldw + c0;
  for (int v = 0; v < NV; ++v) {
    const Vec4 bv = vload<Vec4>(b + 4 * v);
    for (int r = 0; r < R; ++r) acc[r][v] += bv;
  }
  for (int r = 0; r < R; ++r) {
    double* e = eta + static_cast<std::size_t>(r) * lde + c0;
    if (valid == 4 * NV)
      for (int v = 0; v < NV; ++v) vstore(e + 4 * v, acc[r][v]);
    else
      for (int c = 0; c < valid; ++c) e[c] = acc[r][c / 4][c % 4];
  }
}

// The R-row kernels over every column: blocks of eight, then of four (the last one padded).
template <int R>
inline void eta_rows(const double* wt, std::size_t ldw, int d, int cols, const double* x,
                     double* eta) {
  int c0 = 0;
  for (; c0 + 8 <= cols; c0 += 8) eta_block<R, 2>(wt, ldw, d, x, c0, 8, eta, std::size_t(cols));
  for (; c0 < cols; c0 += 4)
    eta_block<R, 1>(wt, ldw, d, x, c0, std::min(4, cols - c0), eta, std::size_t(cols));
}

// Columns [j0, j0 + 4) of row i of [x, 1] (n x (D + 1)): x's row with a column of ones, the
// intercept's, padded with zeros.
inline Vec4 x_columns(const double* x, int d, std::int64_t i, int j0) {
  const double* xi = x + static_cast<std::size_t>(i) * std::size_t(d);
  if (j0 + 4 <= d) return vload<Vec4>(xi + j0);
  Vec4 v{};
  for (int c = 0; c < 4; ++c) v[c] = j0 + c < d ? xi[j0 + c] : j0 + c == d ? 1.0 : 0.0;
  return v;
}

// rows_gradient for NQ of the S C output rows (q0, ...) and 4 columns (j0, ...): for each group,
// sum_i r_{i,q} [x_i, 1]_j over its rows in order (the first product rounded, then one fused
// multiply-add per row: with x = 1 that is the residuals' sum), then the groups pairwise
// (tree_sum), in registers and a small stack, so that no group's values go to memory. Each
// column's value is the same whichever block of four it is computed in.
template <int NQ>
inline void gradient_tree(const double* x, int d, const double* r, std::size_t ldr,
                          std::span<const std::int64_t> bounds, int q0, int j0,
                          std::array<Vec4, NQ>& out) {
  const std::int64_t base = bounds[0];
  out = tree_sum<std::array<Vec4, NQ>>(
      static_cast<std::int64_t>(bounds.size()) - 1,
      [&](std::int64_t t) {
        std::array<Vec4, NQ> acc;
        std::int64_t i = bounds[static_cast<std::size_t>(t)] - base;
        const std::int64_t end = bounds[static_cast<std::size_t>(t) + 1] - base;
        Vec4 xv = x_columns(x, d, i, j0);
        const double* ri = r + static_cast<std::size_t>(i) * ldr + q0;
        for (int q = 0; q < NQ; ++q) acc[q] = splat<Vec4>(ri[q]) * xv;
        for (++i; i < end; ++i) {
          xv = x_columns(x, d, i, j0);
          ri = r + static_cast<std::size_t>(i) * ldr + q0;
          for (int q = 0; q < NQ; ++q) acc[q] = vfma(splat<Vec4>(ri[q]), xv, acc[q]);
        }
        return acc;
      },
      [](const std::array<Vec4, NQ>& a, const std::array<Vec4, NQ>& b) {
        std::array<Vec4, NQ> c;
        for (int q = 0; q < NQ; ++q) c[q] = a[q] + b[q];
        return c;
      });
}

template <int NQ>
inline void gradient_rows(const double* x, int d, int c, const double* r, std::size_t ldr,
                          std::span<const std::int64_t> bounds, int q0, double* grad,
                          std::size_t ld) {
  for (int j0 = 0; j0 <= d; j0 += 4) {
    std::array<Vec4, NQ> v;
    gradient_tree<NQ>(x, d, r, ldr, bounds, q0, j0, v);
    for (int q = 0; q < NQ; ++q) {
      // Output row q0 + q = s C + k: [w_{s,k}, b_{s,k}] at grad[s ld + k (D + 1)].
      double* o = grad + static_cast<std::size_t>((q0 + q) / c) * ld +
                  static_cast<std::size_t>((q0 + q) % c) * std::size_t(d + 1);
      if (j0 + 4 <= d + 1)
        vstore(o + j0, v[q]);
      else
        for (int k = 0; j0 + k <= d; ++k) o[j0 + k] = v[q][k];
    }
  }
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

void Glm::row_terms(std::span<const double> theta, int samples, std::span<const double> x,
                    std::span<const double> y, double* lik, double* r) const {
  const int d = features, c = outputs(), cols = samples * c;
  const auto n = static_cast<std::int64_t>(y.size());
  const auto ld = static_cast<std::size_t>(cols);
  double* const eta = thread_scratch<EtaTag>(static_cast<std::size_t>(n) * ld);
  // theta transposed, its columns padded with zeros to a multiple of four.
  const auto ldw = static_cast<std::size_t>((cols + 3) / 4 * 4);
  double* const wt = thread_scratch<WeightsTag>(static_cast<std::size_t>(d + 1) * ldw);
  for (int j = 0; j <= d; ++j)
    for (std::size_t k = 0; k < ldw; ++k)
      wt[std::size_t(j) * ldw + k] =
          k < ld ? theta[k * static_cast<std::size_t>(d + 1) + std::size_t(j)] : 0.0;
  // Four rows at a time share each load of the weights; the rest one by one.
  std::int64_t i = 0;
  for (; i + 4 <= n; i += 4)
    eta_rows<4>(wt, ldw, d, cols, x.data() + static_cast<std::size_t>(i) * std::size_t(d),
                eta + static_cast<std::size_t>(i) * ld);
  for (; i < n; ++i)
    eta_rows<1>(wt, ldw, d, cols, x.data() + static_cast<std::size_t>(i) * std::size_t(d),
                eta + static_cast<std::size_t>(i) * ld);
  if (likelihood == Likelihood::kLogistic) {
    logistic_terms(eta, n * cols, samples, y, lik, r);
    return;
  }
  const double inv_var = 1.0 / (noise_sd * noise_sd);
  const double lin_const = -0.5 * std::log(2 * std::numbers::pi * noise_sd * noise_sd);
  for (i = 0; i < n; ++i) {
    const double yi = y[static_cast<std::size_t>(i)];
    for (int s = 0; s < samples; ++s) {
      const std::size_t at = static_cast<std::size_t>(i) * ld + static_cast<std::size_t>(s * c);
      const double* e = eta + at;
      double* ri = r + at;
      double& l = lik[static_cast<std::size_t>(i * samples + s)];
      switch (likelihood) {
        case Likelihood::kLogistic:
          break;
        case Likelihood::kLinear:
          l = lin_const - 0.5 * (yi - e[0]) * (yi - e[0]) * inv_var;
          ri[0] = (yi - e[0]) * inv_var;
          break;
        case Likelihood::kPoisson: {
          const double mu = std::exp(e[0]);
          l = yi * e[0] - mu - std::lgamma(yi + 1);
          ri[0] = yi - mu;
          break;
        }
        case Likelihood::kSoftmax: {
          double m = -INFINITY, z = 0;
          for (int k = 0; k < c; ++k) m = std::max(m, e[k]);
          for (int k = 0; k < c; ++k) z += std::exp(e[k] - m);
          const double lse = m + std::log(z);
          const int label = static_cast<int>(yi);
          l = e[label] - lse;
          for (int k = 0; k < c; ++k) ri[k] = (k == label ? 1.0 : 0.0) - std::exp(e[k] - lse);
          break;
        }
      }
    }
  }
}

void Glm::rows_gradient(int samples, std::span<const double> x, const double* r, std::size_t ldr,
                        std::span<const std::int64_t> bounds, std::span<double> grad,
                        std::size_t grad_stride) const {
  const int d = features, c = outputs(), cols = samples * c;
  const std::size_t ld = grad_stride != 0 ? grad_stride : static_cast<std::size_t>(n_params());
  // Output rows eight at a time (one row of residuals per block), then four, two, one.
  int q = 0;
  for (; q + 8 <= cols; q += 8)
    gradient_rows<8>(x.data(), d, c, r, ldr, bounds, q, grad.data(), ld);
  if (q + 4 <= cols) {
    gradient_rows<4>(x.data(), d, c, r, ldr, bounds, q, grad.data(), ld);
    q += 4;
  }
  if (q + 2 <= cols) {
    gradient_rows<2>(x.data(), d, c, r, ldr, bounds, q, grad.data(), ld);
    q += 2;
  }
  if (q < cols) gradient_rows<1>(x.data(), d, c, r, ldr, bounds, q, grad.data(), ld);
}

void Glm::loglik_draws(std::span<const double> theta, int samples, std::span<const double> x,
                       std::span<const double> y, std::span<double> f, std::span<double> grad,
                       std::size_t grad_stride) const {
  const auto n = static_cast<std::int64_t>(y.size());
  const auto cols = static_cast<std::size_t>(samples * outputs());
  std::vector<double> lik(static_cast<std::size_t>(n * samples)), r(std::size_t(n) * cols);
  row_terms(theta, samples, x, y, lik.data(), r.data());
  for (int s = 0; s < samples; ++s) {
    double sum = 0;
    for (std::int64_t i = 0; i < n; ++i) sum += lik[static_cast<std::size_t>(i * samples + s)];
    f[static_cast<std::size_t>(s)] = sum;
  }
  const std::int64_t bounds[2] = {0, n};
  if (!grad.empty() && n > 0) rows_gradient(samples, x, r.data(), cols, bounds, grad, grad_stride);
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
  // Why a response cannot be taken, null if it can. Strings are made once per call and for the
  // first bad row only: a message string per row cost 0.8 s of CPU time at 10^7 rows.
  const std::string not_a_class =
      "is not a class label in [0, " + std::to_string(classes) + ") (softmax regression)";
  const auto fault = [&](double v) -> const char* {
    if (!std::isfinite(v)) return "is not finite";
    switch (likelihood) {
      case Likelihood::kLogistic:
        if (v != 0 && v != 1) return "is not a 0/1 label (logistic regression)";
        break;
      case Likelihood::kPoisson:
        if (v < 0 || v != std::floor(v))
          return "is not a non-negative integer count (Poisson regression)";
        break;
      case Likelihood::kSoftmax:
        if (v < 0 || v >= classes || v != std::floor(v)) return not_a_class.c_str();
        break;
      case Likelihood::kLinear:
        break;
    }
    return nullptr;
  };
  for (std::size_t i = 0; i < y.size(); ++i)
    if (const char* what = fault(y[i]))
      throw Error("response row " + std::to_string(first_row + std::int64_t(i)) + " " + what);
}

}  // namespace caviar::bbvi
