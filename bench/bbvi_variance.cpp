// The variance of the three ELBO-gradient estimators of black-box VI at a fixed q, on Bayesian
// logistic regression: score > score with control variates > reparameterisation is what
// Ranganath, Gerrish & Blei (2014) and Kingma & Welling (2014) lead one to expect. Prints a
// markdown table (docs/experiments/bbvi.md).
//
// usage: bbvi_variance [N D S REPS]   (default 5000 10 8 2000)
//
// Full-batch gradients (no subsampling), so the only noise is q's draws. Two fixed q per family:
// "start" (mu = 0, every marginal sd 1: where a fit begins) and "near" (mu = the true parameters,
// marginal sd 0.05: close to the posterior of this N).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "core/rng.hpp"
#include "models/bbvi/estimator.hpp"
#include "models/bbvi/family.hpp"
#include "models/bbvi/glm.hpp"

using namespace caviar;
using namespace caviar::bbvi;

namespace {

struct Data {
  Glm model;
  std::vector<double> x, y, theta;
};

Data logistic_data(int n, int d) {
  Data g;
  g.model.likelihood = Likelihood::kLogistic;
  g.model.features = d;
  const CounterRng rng(1, Stream::kGenerateRows);
  g.theta.resize(static_cast<std::size_t>(d + 1));
  for (int j = 0; j <= d; ++j) g.theta[j] = rng.normal2(j, 9)[0] * (j < d ? 1 / std::sqrt(d) : 0.5);
  g.x.resize(static_cast<std::size_t>(n) * d);
  g.y.resize(n);
  for (int i = 0; i < n; ++i) {
    double eta = g.theta[d];
    for (int j = 0; j < d; ++j) {
      g.x[i * d + j] = rng.normal2(std::uint64_t(i) * d + j, 0)[0];
      eta += g.theta[j] * g.x[i * d + j];
    }
    g.y[i] = rng.uniform2(i, 1)[0] < 1 / (1 + std::exp(-eta)) ? 1 : 0;
  }
  return g;
}

// Summed variance over the components of the gradient (all, and the mean block alone).
std::pair<double, double> variance(Estimator e, const Family& q, const std::vector<double>& l,
                                   const Data& g, int samples, int reps) {
  const auto n = static_cast<std::size_t>(q.n_params());
  const auto p = static_cast<std::size_t>(q.dim());
  std::vector<double> s1(n, 0.0), s2(n, 0.0), grad(n);
  for (int r = 0; r < reps; ++r) {
    Draws d;
    d.eps = draw_noise(7, r, samples, q.n_noise());
    d.theta.resize(samples, q.dim());
    d.grad_theta = RowMatrix::Zero(samples, q.dim());
    d.f = Eigen::VectorXd::Zero(samples);
    for (int s = 0; s < samples; ++s)
      q.draw(l, {d.eps.row(s).data(), size_t(d.eps.cols())}, {d.theta.row(s).data(), p});
    g.model.loglik_draws({d.theta.data(), samples * p}, samples, g.x, g.y,
                         {d.f.data(), size_t(samples)}, {d.grad_theta.data(), samples * p});
    for (int s = 0; s < samples; ++s)
      d.f[s] += g.model.log_prior({d.theta.row(s).data(), p}, {d.grad_theta.row(s).data(), p});
    elbo_gradient(e, q, l, d, grad);
    for (std::size_t m = 0; m < n; ++m) {
      s1[m] += grad[m];
      s2[m] += grad[m] * grad[m];
    }
  }
  double all = 0, mean_block = 0;
  for (std::size_t m = 0; m < n; ++m) {
    const double v = s2[m] / reps - (s1[m] / reps) * (s1[m] / reps);
    all += v;
    if (m < p) mean_block += v;
  }
  return {all, mean_block};
}

}  // namespace

int main(int argc, char** argv) {
  const int n = argc > 1 ? std::atoi(argv[1]) : 5000;
  const int d = argc > 2 ? std::atoi(argv[2]) : 10;
  const int samples = argc > 3 ? std::atoi(argv[3]) : 8;
  const int reps = argc > 4 ? std::atoi(argv[4]) : 2000;
  const Data g = logistic_data(n, d);
  const int p = d + 1;
  std::printf(
      "Logistic regression, N = %d, D = %d (P = %d parameters), S = %d draws per "
      "step, %d steps per cell; prior N(0, 1).\n\n",
      n, d, p, samples, reps);
  std::printf(
      "| family | q | estimator | summed variance (all) | summed variance (mean block) |\n");
  std::printf("|---|---|---|---|---|\n");
  for (FamilyKind fk : {FamilyKind::kMeanField, FamilyKind::kFullRank, FamilyKind::kLowRank}) {
    const Family q(fk, p, 3);
    for (const char* where : {"start", "near"}) {
      const bool near = where[0] == 'n';
      std::vector<double> l(static_cast<std::size_t>(q.n_params()));
      q.init(l, near ? 0.05 : 1.0, 1);
      if (near)
        for (int j = 0; j < p; ++j) l[j] = g.theta[j];
      for (Estimator e : {Estimator::kScore, Estimator::kScoreCv, Estimator::kReparam}) {
        const auto [all, mb] = variance(e, q, l, g, samples, reps);
        std::printf("| %s | %s | %s | %.4g | %.4g |\n", to_string(fk).c_str(), where,
                    to_string(e).c_str(), all, mb);
      }
    }
  }
  return 0;
}
