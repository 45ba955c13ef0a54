#include "models/bbvi/estimator.hpp"

#include <algorithm>

#include "core/error.hpp"
#include "core/rng.hpp"

namespace caviar::bbvi {

Estimator parse_estimator(const std::string& s) {
  if (s == "score") return Estimator::kScore;
  if (s == "score-cv") return Estimator::kScoreCv;
  if (s == "reparam") return Estimator::kReparam;
  throw Error("--estimator must be score, score-cv or reparam, not '" + s + "'");
}

std::string to_string(Estimator e) {
  switch (e) {
    case Estimator::kScore:
      return "score";
    case Estimator::kScoreCv:
      return "score-cv";
    case Estimator::kReparam:
      return "reparam";
  }
  return "?";
}

RowMatrix draw_noise(std::uint64_t seed, std::uint64_t step, int samples, int n_noise,
                     Stream stream) {
  // Counter (draw, pair of components), step: independent of ranks and threads.
  const CounterRng rng(seed, stream);
  RowMatrix eps(samples, n_noise);
  const std::uint64_t pairs = (static_cast<std::uint64_t>(n_noise) + 1) / 2;
  for (int s = 0; s < samples; ++s)
    rng.normals(static_cast<std::uint64_t>(s) * pairs, static_cast<std::uint32_t>(step),
                {eps.row(s).data(), static_cast<std::size_t>(n_noise)});
  return eps;
}

double elbo_gradient(Estimator e, const Family& q, std::span<const double> lambda, const Draws& d,
                     std::span<double> grad) {
  const int samples = static_cast<int>(d.f.size());
  const auto n = static_cast<Eigen::Index>(q.n_params());
  std::fill(grad.begin(), grad.end(), 0.0);
  const double elbo = d.f.mean() + q.entropy(lambda);
  if (e == Estimator::kReparam) {
    q.add_reparam_grad(lambda, {d.eps.data(), size_t(d.eps.size())},
                       {d.grad_theta.data(), size_t(d.grad_theta.size())}, grad);
    for (auto& g : grad) g /= samples;
    q.add_entropy_grad(lambda, grad);
    return elbo;
  }
  // h: the score of each draw (S x n); w_s = f_s - log q(theta_s).
  RowMatrix h = RowMatrix::Zero(samples, n);
  Eigen::VectorXd w(samples);
  for (int s = 0; s < samples; ++s) {
    const std::span<const double> th{d.theta.row(s).data(), size_t(d.theta.cols())};
    q.add_score(lambda, th, {h.row(s).data(), size_t(n)});
    w[s] = d.f[s] - q.log_q(lambda, th);
  }
  // a_m for draw s is estimated from the other S - 1 draws, so it is independent of draw s and
  // the estimate stays unbiased (E h_ms = 0); a_m estimated from all S draws, draw s included,
  // biases it by O(1/S) (leave-one-out, as the baselines of Mnih & Rezende 2016).
  for (Eigen::Index m = 0; m < n; ++m) {
    double sf = 0, sh = 0, sfh = 0, shh = 0;  // sums of f_m = h_m w, h_m, f_m h_m, h_m^2
    for (int s = 0; s < samples; ++s) {
      const double hs = h(s, m), fs = hs * w[s];
      sf += fs;
      sh += hs;
      sfh += fs * hs;
      shh += hs * hs;
    }
    if (e == Estimator::kScore || samples < 3) {
      grad[m] = sf / samples;
      continue;
    }
    double g = 0;
    const double k = samples - 1;
    for (int s = 0; s < samples; ++s) {
      const double hs = h(s, m), fs = hs * w[s];
      const double f1 = sf - fs, h1 = sh - hs;
      const double var = (shh - hs * hs) - h1 * h1 / k;
      const double cov = (sfh - fs * hs) - f1 * h1 / k;
      g += fs - (var > 0 ? cov / var : 0.0) * hs;
    }
    grad[m] = g / samples;
  }
  return elbo;
}

}  // namespace caviar::bbvi
