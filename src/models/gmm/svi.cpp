#include "models/gmm/svi.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "core/error.hpp"

namespace caviar::gmm {

namespace {

void save_vec(engine::StateWriter& w, const std::string& name, const std::vector<double>& v) {
  if (!v.empty()) w.array(name, v, {v.size()});
}

std::vector<double> load_vec(const engine::StateReader& r, const std::string& name,
                             std::int64_t n) {
  if (n == 0) return {};
  return r.array(name, {static_cast<std::uint64_t>(n)});
}

}  // namespace

void AdaptiveStep::add(const Stats& g) {
  gbar_ += g;
  hbar_ += model_.natural_inner(g, g);
}

// g_bar and h_bar start as the Monte Carlo means of the noisy natural gradient at lambda_0
// (Ranganath et al. 2013, section 3; Bruno 2022, section 2.2.2).
void AdaptiveStep::finish(std::int64_t count) {
  gbar_ *= 1.0 / static_cast<double>(count);
  hbar_ /= static_cast<double>(count);
}

double AdaptiveStep::next(const Stats& g) {
  // Bruno 2022, eq. 2.56: moving averages with window tau_t; eq. 2.57:
  // rho = g_bar^T g_bar / h_bar; eq. 2.58: tau_{t+1} = tau_t (1 - rho) + 1. The two updates are
  // spelled as fused multiply-adds: with FMA instructions the compiler contracts a * b + c on its
  // own, choosing the product by context (inlining), and these are the roundings the rate had
  // when it was computed inside the fit's loop.
  const double w = 1.0 / tau_;
  gbar_.interpolate(g, w);
  hbar_ = std::fma(w, model_.natural_inner(g, g), (1 - w) * hbar_);
  double rho = hbar_ > 0 ? model_.natural_inner(gbar_, gbar_) / hbar_ : 1.0;
  rho = std::clamp(rho, 0.0, 1.0);  // <= 1 by Cauchy-Schwarz, up to round-off
  tau_ = std::fma(tau_, 1 - rho, 1.0);
  return rho;
}

void AdaptiveStep::save(engine::StateWriter& w) const {
  w.attr("tau", tau_);
  w.attr("hbar", hbar_);
  w.array("gbar", gbar_.buffer(), {gbar_.buffer().size()});
}

void AdaptiveStep::load(const engine::StateReader& r) {
  tau_ = r.attr_double("tau");
  hbar_ = r.attr_double("hbar");
  const std::vector<double> g = r.array("gbar", {gbar_.buffer().size()});
  std::copy(g.begin(), g.end(), gbar_.buffer().begin());
}

SviFit::SviFit(Model& model, std::int64_t n_rows, std::vector<int> exponents, WithRows with,
               FullElbo full_elbo, const SviOptions& o)
    : model_(model),
      n_rows_(n_rows),
      exponents_(std::move(exponents)),
      with_(std::move(with)),
      full_elbo_(std::move(full_elbo)),
      o_(o),
      s_eff_(model.make_stats()),
      batch_(model.make_stats()),
      grad_(model.make_stats()) {
  if (o.adaptive) adaptive_.emplace(model, o.adaptive_memory);
}

void SviFit::start(const gmm::Stats& initial) {
  s_eff_.set_zero();
  s_eff_ += initial;
}

void SviFit::add_first_gradient(const Stats& s, double scale) {
  scaled(s, scale, true);
  adaptive_->add(grad_);
}

void SviFit::finish_first_gradients(std::int64_t count) {
  adaptive_->finish(count);
}

void SviFit::local_step(Stats& s, std::span<double>, std::span<const std::int64_t> rows) {
  with_(rows, [&](const RowMatrix& x) { model_.local_step(x, s.s); });
}

void SviFit::scaled(const Stats& s, double scale, bool with_gradient) {
  std::copy(s.s.buffer().begin(), s.s.buffer().end(), batch_.buffer().begin());
  batch_ *= scale;
  if (!with_gradient) return;
  for (std::size_t i = 0; i < grad_.buffer().size(); ++i)
    grad_.buffer()[i] = batch_.buffer()[i] - s_eff_.buffer()[i];
}

// The stochastic ELBO of the minibatch at the current lambda (Bruno 2022, eq. 2.52): the ELBO of
// its statistics scaled by N / |b|, whose log-normaliser is then the data term's estimate.
double SviFit::step_objective(const Stats& s, double scale) {
  scaled(s, scale, false);
  const double elbo = model_.elbo(batch_);
  if (!std::isfinite(elbo))
    throw Error("the stochastic ELBO is not finite at step " + std::to_string(steps() + 1));
  traces_.elbo.push_back(elbo);
  return elbo;
}

double SviFit::step_size(const Stats& s, double scale, double rho) {
  if (!adaptive_) return rho;
  scaled(s, scale, true);
  return adaptive_->next(grad_);
}

void SviFit::update_stochastic(const Stats& s, double rho, double scale) {
  scaled(s, scale, false);
  s_eff_.interpolate(batch_, rho);  // Bruno 2022, eq. 2.50
  model_.update(s_eff_);
  traces_.rho.push_back(rho);
}

void SviFit::end_step(double seconds) {
  traces_.seconds.push_back(seconds);
  const std::int64_t t = steps();
  if (o_.full_elbo_every > 0 && t % o_.full_elbo_every == 0) {
    traces_.full_elbo.push_back(full_elbo_());
    traces_.full_elbo_seconds.push_back(seconds);
    traces_.full_elbo_step.push_back(static_cast<double>(t));
  }
}

void SviFit::save(engine::StateWriter& w) const {
  w.array("stats", s_eff_.buffer(), {s_eff_.buffer().size()});
  w.attr("steps", steps());
  save_vec(w, "trace_elbo", traces_.elbo);
  save_vec(w, "trace_rho", traces_.rho);
  save_vec(w, "trace_seconds", traces_.seconds);
  w.attr("full_elbos", static_cast<std::int64_t>(traces_.full_elbo.size()));
  save_vec(w, "full_elbo", traces_.full_elbo);
  save_vec(w, "full_elbo_seconds", traces_.full_elbo_seconds);
  save_vec(w, "full_elbo_step", traces_.full_elbo_step);
  if (adaptive_) adaptive_->save(w);
}

// S_eff, from which update() rebuilds the same posterior bits (a deterministic function of the
// prior, the shift and the statistics), the traces and the adaptive rate's state.
void SviFit::load(const engine::StateReader& r) {
  const std::vector<double> v = r.array("stats", {s_eff_.buffer().size()});
  gmm::Stats s = model_.make_stats();
  std::copy(v.begin(), v.end(), s.buffer().begin());
  model_.update(s);
  start(s);
  const std::int64_t t = r.attr_int("steps", 0, kMaxCount, "the checkpoint's SVI steps");
  const std::int64_t f = r.attr_int("full_elbos", 0, kMaxCount, "the checkpoint's SVI full ELBOs");
  traces_ = {load_vec(r, "trace_elbo", t),        load_vec(r, "trace_rho", t),
             load_vec(r, "trace_seconds", t),     load_vec(r, "full_elbo", f),
             load_vec(r, "full_elbo_seconds", f), load_vec(r, "full_elbo_step", f)};
  if (adaptive_) adaptive_->load(r);
}

}  // namespace caviar::gmm
