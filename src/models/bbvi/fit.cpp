#include "models/bbvi/fit.hpp"

#include <algorithm>
#include <cmath>

#include "core/error.hpp"
#include "core/rng.hpp"
#include "core/scratch.hpp"

namespace caviar::bbvi {

Posterior::Posterior(const FitConfig& cfg, std::span<const double> x, std::span<const double> y)
    : cfg_(cfg),
      q_(cfg.family, static_cast<int>(cfg.glm.n_params()), cfg.rank),
      x_(x),
      y_(y),
      p_(cfg.glm.n_params()),
      lambda_(static_cast<std::size_t>(q_.n_params())) {
  q_.init({lambda_.data(), lambda_.size()}, cfg.init_sd, cfg.seed);
}

void Posterior::set_draws(engine::DrawKind kind, std::int64_t t) {
  using engine::DrawKind;
  const int s = kind == DrawKind::kGradient ? cfg_.samples
                : kind == DrawKind::kElbo   ? cfg_.elbo_samples
                                            : cfg_.diagnostic_samples;
  // The diagnostic's draws are step 0 of the ELBO stream, which the ELBO estimates (steps >= 1)
  // never use.
  const Stream stream = kind == DrawKind::kGradient ? Stream::kBbviNoise : Stream::kBbviElbo;
  eps_ = draw_noise(cfg_.seed, static_cast<std::uint64_t>(kind == DrawKind::kDiagnostic ? 0 : t), s,
                    q_.n_noise(), stream);
  theta_.resize(s, p_);
  const std::span<const double> lambda{lambda_.data(), lambda_.size()};
  for (int k = 0; k < s; ++k)
    q_.draw(lambda, {eps_.row(k).data(), std::size_t(eps_.cols())},
            {theta_.row(k).data(), std::size_t(p_)});
  with_grad_ = kind == DrawKind::kGradient && cfg_.estimator == Estimator::kReparam;
  width_ = with_grad_ ? 1 + p_ : 1;
}

namespace {
struct RowsTag;
struct ResponsesTag;
struct LoglikTag;
}  // namespace

void Posterior::prefetch(std::span<const std::int64_t> rows) const {
  const auto d = static_cast<std::size_t>(cfg_.glm.features);
  for (const std::int64_t r : rows) {
    const double* row = x_.data() + static_cast<std::size_t>(r) * d;
    for (std::size_t j = 0; j < d; j += 8) __builtin_prefetch(row + j);
    __builtin_prefetch(row + d - 1);
    __builtin_prefetch(y_.data() + r);
  }
}

void Posterior::block(std::span<const std::int64_t> rows, std::span<double> out) const {
  const int s = n_draws();
  const int d = cfg_.glm.features;
  const auto n = static_cast<Eigen::Index>(rows.size());
  // The block's rows gathered in order (with repeats), into this thread's aligned scratch.
  Eigen::Map<RowMatrix, Eigen::AlignedMax> xb(
      thread_scratch<RowsTag>(static_cast<std::size_t>(n * d)), n, d);
  double* const yb = thread_scratch<ResponsesTag>(static_cast<std::size_t>(n));
  for (Eigen::Index i = 0; i < n; ++i) {
    const auto r = static_cast<std::size_t>(rows[static_cast<std::size_t>(i)]);
    for (int j = 0; j < d; ++j) xb(i, j) = x_[r * std::size_t(d) + std::size_t(j)];
    yb[i] = y_[r];
  }
  double* const f = thread_scratch<LoglikTag>(static_cast<std::size_t>(s));
  // The gradient in theta only where the estimator uses it (reparameterisation steps), written
  // in place: draw k's is out[k * width + 1, (k + 1) * width).
  const std::span<double> g = with_grad_ ? out.subspan(1) : std::span<double>{};
  cfg_.glm.loglik_draws({theta_.data(), std::size_t(theta_.size())}, s,
                        {xb.data(), std::size_t(xb.size())}, {yb, std::size_t(n)},
                        {f, std::size_t(s)}, g, static_cast<std::size_t>(width_));
  for (int k = 0; k < s; ++k) out[std::size_t(k * width_)] = f[k];
}

double Posterior::gradient(std::span<const double> sums, std::span<const std::uint8_t> kept,
                           double scale, std::span<double> grad) const {
  // The kept draws only: each is a draw of q, so the estimate over them stays unbiased.
  int n = 0;
  for (auto k : kept) n += k;
  Draws d;
  d.eps.resize(n, eps_.cols());
  d.theta.resize(n, p_);
  d.f.resize(n);
  if (with_grad_) d.grad_theta.resize(n, p_);
  std::vector<double> gp(static_cast<std::size_t>(p_));
  for (int s = 0, i = 0; s < n_draws(); ++s) {
    if (!kept[std::size_t(s)]) continue;
    d.eps.row(i) = eps_.row(s);
    d.theta.row(i) = theta_.row(s);
    std::fill(gp.begin(), gp.end(), 0.0);
    const double lp = cfg_.glm.log_prior({theta_.row(s).data(), std::size_t(p_)}, gp);
    d.f[i] = scale * sums[std::size_t(s * width_)] + lp;
    if (with_grad_)
      for (std::int64_t j = 0; j < p_; ++j)
        d.grad_theta(i, j) = scale * sums[std::size_t(s * width_ + 1 + j)] + gp[std::size_t(j)];
    ++i;
  }
  const double elbo = elbo_gradient(cfg_.estimator, q_, {lambda_.data(), lambda_.size()}, d, grad);
  for (auto& v : grad) v = -v;  // the optimiser minimises -ELBO
  return elbo;
}

double Posterior::log_joint(std::span<const double> sums, int s, double scale) const {
  std::vector<double> gp(static_cast<std::size_t>(p_));
  return scale * sums[std::size_t(s * width_)] +
         cfg_.glm.log_prior({theta_.row(s).data(), std::size_t(p_)}, gp);
}

double Posterior::elbo(std::span<const double> sums, std::span<const std::uint8_t> kept,
                       double scale) const {
  double sum = 0;
  int n = 0;
  for (int s = 0; s < n_draws(); ++s)
    if (kept[std::size_t(s)]) {
      sum += log_joint(sums, s, scale);
      ++n;
    }
  return sum / n + q_.entropy({lambda_.data(), lambda_.size()});
}

std::vector<double> Posterior::log_ratios(std::span<const double> sums,
                                          std::span<const std::uint8_t> kept) const {
  std::vector<double> out;
  const std::span<const double> lambda{lambda_.data(), lambda_.size()};
  for (int s = 0; s < n_draws(); ++s)
    if (kept[std::size_t(s)])
      out.push_back(log_joint(sums, s) - q_.log_q(lambda, {theta_.row(s).data(), std::size_t(p_)}));
  return out;
}

void Posterior::save(engine::StateWriter& w) const {
  w.array("lambda", {lambda_.data(), lambda_.size()}, {lambda_.size()});
}

void Posterior::load(const engine::StateReader& r) {
  const std::vector<double> l = r.array("lambda", {lambda_.size()});
  for (double v : l)
    if (!std::isfinite(v)) throw Error("the checkpoint's variational parameters are not finite");
  std::copy(l.begin(), l.end(), lambda_.begin());
}

}  // namespace caviar::bbvi
