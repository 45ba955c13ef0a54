#pragma once
// Shared by the VAE's unit tests: random matrices and a central-difference gradient check, in
// double.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "models/vae/layers.hpp"

namespace caviar::vae::testing {

using MatD = Mat<double>;

inline MatD random_mat(Eigen::Index r, Eigen::Index c, unsigned seed, double lo = -1,
                       double hi = 1) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> u(lo, hi);
  MatD m(r, c);
  for (Eigen::Index j = 0; j < c; ++j)
    for (Eigen::Index i = 0; i < r; ++i) m(i, j) = u(gen);
  return m;
}

// Central differences of f with respect to every entry of v; compared with the analytic g.
inline void expect_gradient(std::vector<double>& v, const std::function<double()>& f,
                            const std::vector<double>& g, double tol, const std::string& what) {
  ASSERT_EQ(v.size(), g.size());
  const double h = 1e-6;
  double worst = 0;
  for (std::size_t i = 0; i < v.size(); ++i) {
    const double keep = v[i];
    v[i] = keep + h;
    const double fp = f();
    v[i] = keep - h;
    const double fm = f();
    v[i] = keep;
    const double fd = (fp - fm) / (2 * h);
    const double err = std::abs(fd - g[i]) / std::max(1.0, std::abs(fd));
    worst = std::max(worst, err);
    EXPECT_LT(err, tol) << what << " entry " << i << ": analytic " << g[i] << ", numeric " << fd;
  }
  // Guard against a vacuous pass: the gradient must not be identically zero.
  double norm = 0;
  for (double x : g) norm += x * x;
  EXPECT_GT(norm, 1e-8) << what;
}

// Two unbiased estimators of the same gradient: over m draws (each call draw(a, b) fills both for
// a new draw), the mean of their per-draw difference a - b is within 5 standard errors of zero in
// every parameter, and they do differ draw by draw (in more than 10 parameters).
inline void expect_same_mean(
    std::size_t n_params, int m,
    const std::function<void(std::vector<double>&, std::vector<double>&)>& draw,
    const std::string& what) {
  std::vector<double> a(n_params), b(n_params), sum(n_params), sum2(n_params);
  for (int k = 0; k < m; ++k) {
    draw(a, b);
    for (std::size_t i = 0; i < n_params; ++i) {
      const double diff = a[i] - b[i];
      sum[i] += diff;
      sum2[i] += diff * diff;
    }
  }
  int differing = 0;
  for (std::size_t i = 0; i < n_params; ++i) {
    const double mean = sum[i] / m, var = sum2[i] / m - mean * mean;
    if (var > 0) ++differing;
    EXPECT_LE(std::abs(mean), 5 * std::sqrt(var / m) + 1e-12) << what << " parameter " << i;
  }
  EXPECT_GT(differing, 10) << what;
}

inline std::vector<double> to_vec(const MatD& m) {
  return {m.data(), m.data() + m.size()};
}
inline MatD from_vec(const std::vector<double>& v, Eigen::Index r, Eigen::Index c) {
  return Eigen::Map<const MatD>(v.data(), r, c);
}

}  // namespace caviar::vae::testing
