#include "prep/generate_glm.hpp"

#include <cmath>
#include <vector>

#include "core/error.hpp"
#include "core/partition.hpp"
#include "core/rng.hpp"
#include "io/h5.hpp"

namespace caviar {
namespace {

std::vector<double> true_theta(const bbvi::Glm& m, std::uint64_t seed) {
  const CounterRng rng(seed, Stream::kGenerateParams);
  std::vector<double> theta(static_cast<std::size_t>(m.n_params()));
  const int d = m.features;
  for (std::size_t j = 0; j < theta.size(); ++j) {
    const bool intercept = static_cast<int>(j % std::size_t(d + 1)) == d;
    theta[j] = rng.normal2(j, 0)[0] * (intercept ? 0.5 : 1.0 / std::sqrt(double(d)));
  }
  return theta;
}

// Poisson(mu) by inversion of its CDF at u, summed in logarithms so that e^-mu cannot underflow.
double poisson_inverse(double mu, double u) {
  const double log_u = std::log(u);
  double log_p = -mu, log_cdf = -mu;
  double k = 0;
  while (log_cdf < log_u && k < 1e9) {
    k += 1;
    log_p += std::log(mu / k);
    log_cdf += std::log1p(std::exp(log_p - log_cdf));
  }
  return k;
}

double draw_response(const bbvi::Glm& m, const std::vector<double>& theta, const double* x,
                     const CounterRng& rng, std::int64_t row) {
  const int d = m.features;
  std::vector<double> eta(static_cast<std::size_t>(m.outputs()));
  for (int k = 0; k < m.outputs(); ++k) {
    const double* w = theta.data() + std::size_t(k) * (d + 1);
    double s = w[d];
    for (int j = 0; j < d; ++j) s += w[j] * x[j];
    eta[k] = s;
  }
  const auto u = rng.uniform2(static_cast<std::uint64_t>(row), 1);
  switch (m.likelihood) {
    case bbvi::Likelihood::kLogistic:
      return u[0] < 1 / (1 + std::exp(-eta[0])) ? 1.0 : 0.0;
    case bbvi::Likelihood::kLinear:
      return eta[0] + m.noise_sd * rng.normal2(static_cast<std::uint64_t>(row), 2)[0];
    case bbvi::Likelihood::kPoisson:
      return poisson_inverse(std::exp(eta[0]), u[0]);
    case bbvi::Likelihood::kSoftmax: {
      double mx = eta[0], z = 0;
      for (double e : eta) mx = std::max(mx, e);
      for (double e : eta) z += std::exp(e - mx);
      double cdf = 0;
      for (int k = 0; k < m.outputs(); ++k) {
        cdf += std::exp(eta[k] - mx) / z;
        if (u[0] < cdf) return k;
      }
      return m.outputs() - 1;
    }
  }
  return 0;
}

}  // namespace

void write_glm(const Comm& comm, const std::string& file, const GlmSpec& spec) {
  const bbvi::Glm& m = spec.model;
  if (spec.n < 1 || m.features < 1) throw Error("--n and --dim must be >= 1");
  if (m.likelihood == bbvi::Likelihood::kSoftmax && m.classes < 2)
    throw Error("--classes must be >= 2");
  if (!(m.noise_sd > 0)) throw Error("--noise-sd must be > 0");
  io::check_output_path(comm, file, {});
  const int d = m.features;
  const std::vector<double> theta = true_theta(m, spec.seed);
  const RowRange range = partition_rows(spec.n, comm.size(), comm.rank());
  // Features at step 0 of the rows stream, responses at steps 1 and 2.
  const CounterRng rng(spec.seed, Stream::kGenerateRows);
  const std::uint64_t pairs = (static_cast<std::uint64_t>(d) + 1) / 2;
  std::vector<double> x(static_cast<std::size_t>(range.size() * d)), y(range.size());
  for (std::int64_t i = 0; i < range.size(); ++i) {
    const std::int64_t row = range.begin + i;
    double* xi = x.data() + i * d;
    for (int j = 0; j < d; j += 2) {
      const auto z = rng.normal2(static_cast<std::uint64_t>(row) * pairs + std::uint64_t(j) / 2, 0);
      xi[j] = z[0];
      if (j + 1 < d) xi[j + 1] = z[1];
    }
    y[i] = draw_response(m, theta, xi, rng, row);
  }
  io::ParallelRowWriter w(comm, file);
  w.write_rows("/X", spec.n, range, x.data(), {static_cast<std::uint64_t>(d)});
  w.write_rows("/y", spec.n, range, y.data(), {});
  w.write_global("/true/theta", theta, {static_cast<std::uint64_t>(theta.size())});
  w.attr("model", bbvi::to_string(m.likelihood));
  w.attr("classes", std::int64_t{m.outputs() == 1 ? 0 : m.classes});
  w.attr("noise_sd", m.noise_sd);
  w.attr("seed", static_cast<std::int64_t>(spec.seed));
  w.commit();
}

}  // namespace caviar
