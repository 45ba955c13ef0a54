#include "models/bbvi/fit.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <functional>
#include <vector>

#include "core/error.hpp"
#include "core/rng.hpp"
#include "core/tree_sum.hpp"
#include "core/vec4.hpp"

namespace caviar::bbvi {

namespace {
// One thread's last prepared run of rows (Posterior::prepare): the rows gathered, their responses
// and per-row terms, and the pass and span of group rows they belong to.
struct Prepared {
  std::uint64_t pass = 0;
  const std::int64_t* begin = nullptr;
  std::size_t n = 0;
  std::vector<double> x, y, lik, r;
};
Prepared& prepared() {
  thread_local Prepared p;
  return p;
}
std::atomic<std::uint64_t> passes{0};
}  // namespace

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
  q_.draw(lambda, {eps_.data(), std::size_t(eps_.size())},
          {theta_.data(), std::size_t(theta_.size())});
  with_grad_ = kind == DrawKind::kGradient && cfg_.estimator == Estimator::kReparam;
  width_ = with_grad_ ? 1 + p_ : 1;
  pass_ = ++passes;  // what a thread prepared before is stale
}

void Posterior::prepare(std::span<const std::int64_t> rows) const {
  Prepared& p = prepared();
  const std::size_t n = rows.size(), s = static_cast<std::size_t>(n_draws());
  const auto d = static_cast<std::size_t>(cfg_.glm.features);
  p.pass = pass_;
  p.begin = rows.data();
  p.n = n;
  p.x.resize(n * d);
  p.y.resize(n);
  p.lik.resize(n * s);
  p.r.resize(n * s * static_cast<std::size_t>(cfg_.glm.outputs()));
  // The rows gathered in order (with repeats), so that the kernels read one contiguous block, and
  // asked for kAhead rows ahead: a minibatch's rows are scattered over the whole shard, the
  // hardware prefetchers cannot guess them, and waiting for memory was most of a step (perf).
  constexpr std::size_t kAhead = 8;
  const auto ask = [&](std::size_t i) {
    const double* row = x_.data() + static_cast<std::size_t>(rows[i]) * d;
    for (std::size_t j = 0; j < d; j += 8) __builtin_prefetch(row + j);
    __builtin_prefetch(row + d - 1);
    __builtin_prefetch(y_.data() + rows[i]);
  };
  for (std::size_t i = 0; i < std::min(kAhead, n); ++i) ask(i);
  for (std::size_t i = 0; i < n; ++i) {
    if (i + kAhead < n) ask(i + kAhead);
    const auto r = static_cast<std::size_t>(rows[i]);
    std::copy_n(x_.data() + r * d, d, p.x.data() + i * d);
    p.y[i] = y_[r];
  }
  cfg_.glm.row_terms({theta_.data(), std::size_t(theta_.size())}, n_draws(), p.x, p.y, p.lik.data(),
                     p.r.data());
}

void Posterior::block(std::span<const std::int64_t> rows, std::span<double> out) const {
  const std::int64_t bounds[2] = {0, static_cast<std::int64_t>(rows.size())};
  block_node(rows, bounds, out);
}

void Posterior::block_node(std::span<const std::int64_t> rows, std::span<const std::int64_t> bounds,
                           std::span<double> out) const {
  Prepared& p = prepared();
  const std::less<const std::int64_t*> before;  // a total order, for pointers into any arrays
  // Another thread's run, or none (a direct call): prepare the rows here.
  if (p.pass != pass_ || before(rows.data(), p.begin) ||
      before(p.begin + p.n, rows.data() + rows.size()))
    prepare(rows);
  const int s = n_draws();
  const auto at = static_cast<std::size_t>(rows.data() - p.begin);
  const auto groups = static_cast<std::int64_t>(bounds.size()) - 1;
  // Per draw, each group's log-likelihoods summed in row order, then the groups pairwise: four
  // draws at a time in vector lanes (a row's draws are adjacent), the rest one by one.
  const auto lik_tree = [&]<class V>(int k) {
    return tree_sum<V>(
        groups,
        [&](std::int64_t t) {
          V sum{};
          for (auto i = static_cast<std::size_t>(bounds[std::size_t(t)] - bounds[0]);
               i < static_cast<std::size_t>(bounds[std::size_t(t) + 1] - bounds[0]); ++i)
            sum += vload<V>(&p.lik[(at + i) * std::size_t(s) + std::size_t(k)]);
          return sum;
        },
        [](V a, V b) { return a + b; });
  };
  int k = 0;
  for (; k + 4 <= s; k += 4) {
    const Vec4 v = lik_tree.template operator()<Vec4>(k);
    for (int c = 0; c < 4; ++c) out[std::size_t((k + c) * width_)] = v[c];
  }
  for (; k < s; ++k) out[std::size_t(k * width_)] = lik_tree.template operator()<double>(k);
  // The gradient in theta only where the estimator uses it (reparameterisation steps), written
  // in place: draw k's is out[k * width + 1, (k + 1) * width).
  if (!with_grad_) return;
  const auto cols = static_cast<std::size_t>(s * cfg_.glm.outputs());
  const auto d = static_cast<std::size_t>(cfg_.glm.features);
  cfg_.glm.rows_gradient(s, {p.x.data() + at * d, rows.size() * d}, p.r.data() + at * cols, cols,
                         bounds, out.subspan(1), static_cast<std::size_t>(width_));
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
