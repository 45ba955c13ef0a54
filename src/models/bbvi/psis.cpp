#include "models/bbvi/psis.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace caviar::bbvi {
namespace {

// Zhang & Stephens (2009): the posterior mean of b = -k / sigma over a grid, by the profile
// likelihood, then k = mean log(1 - b x). x: exceedances over the threshold, ascending, > 0.
double gpd_shape(const std::vector<double>& x) {
  const auto n = static_cast<double>(x.size());
  const int m = 30 + static_cast<int>(std::floor(std::sqrt(n)));
  const double quartile = x[static_cast<std::size_t>(std::floor(n / 4 + 0.5)) - 1];
  std::vector<double> b(m), loglik(m);
  double lmax = -std::numeric_limits<double>::infinity();
  for (int j = 0; j < m; ++j) {
    b[j] = 1 / x.back() + (1 - std::sqrt(m / (j + 0.5))) / (3 * quartile);
    double k = 0;
    for (double xi : x) k += std::log1p(-b[j] * xi);
    k /= n;
    loglik[j] = n * (std::log(-b[j] / k) - k - 1);
    lmax = std::max(lmax, loglik[j]);
  }
  double wsum = 0, bhat = 0;
  for (int j = 0; j < m; ++j) {
    const double w = std::exp(loglik[j] - lmax);
    wsum += w;
    bhat += w * b[j];
  }
  bhat /= wsum;
  double k = 0;
  for (double xi : x) k += std::log1p(-bhat * xi);
  return k / n;
}

}  // namespace

double pareto_k_hat(std::span<const double> log_ratios) {
  std::vector<double> lw;
  for (double v : log_ratios)
    if (std::isfinite(v)) lw.push_back(v);
  const auto s = static_cast<double>(lw.size());
  const auto m = static_cast<std::size_t>(std::min(std::ceil(s / 5), std::ceil(3 * std::sqrt(s))));
  if (m < 5 || lw.size() <= m) return std::numeric_limits<double>::quiet_NaN();
  std::sort(lw.begin(), lw.end());
  // Ratios scaled by the largest, so nothing overflows; k is scale invariant.
  const double top = lw.back(), threshold = std::exp(lw[lw.size() - m - 1] - top);
  std::vector<double> x;
  for (std::size_t i = lw.size() - m; i < lw.size(); ++i) {
    const double e = std::exp(lw[i] - top) - threshold;
    if (e > 0) x.push_back(e);
  }
  if (x.size() < 5) {
    // Fewer than 5 tail ratios above the threshold: either ties, or ratios so spread that
    // exp(lw - top) underflows. In the second case a few draws outweigh the fifth largest by
    // more than e^700: the weights have no usable tail (their variance is effectively infinite),
    // which is k = +inf, a failed fit that must not read as "no estimate".
    const bool spread = top - lw[lw.size() - 5] > 700;
    return spread ? std::numeric_limits<double>::infinity()
                  : std::numeric_limits<double>::quiet_NaN();
  }
  const double k = gpd_shape(x);
  const double n = static_cast<double>(x.size());
  return (n * k + 10 * 0.5) / (n + 10);
}

}  // namespace caviar::bbvi
