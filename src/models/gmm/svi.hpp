#pragma once
// Stochastic variational inference for the Bayesian mixture (Hoffman, Blei, Wang & Paisley 2013;
// Bruno 2022, section 2.2) as a model of the engine's stochastic driver (engine/stochastic.hpp).
//
// The global parameter lambda is held in statistic coordinates: S_eff, the statistics update()
// turns into the posterior (lambda = prior + S_eff, an affine map), so the natural-gradient step
// lambda <- (1 - rho) lambda + rho lambda_hat is S_eff <- (1 - rho) S_eff + rho (N / |b|) S_b
// (Bruno 2022, eqs 2.50 and 2.53), followed by update(S_eff).
//
//   local step      the E-step over the minibatch's rows, read by the caller's WithRows
//   reduction       the statistics' own exact sum (or plain doubles with --fast-reduce). In the
//                   exact mode every rank computes the whole minibatch (Schedule::every_rank):
//                   the GMM's exact sums are taken per 256-row block, and a few hundred rows have
//                   no split into blocks that is the same at every rank count
//   step objective  the stochastic ELBO of the minibatch, Bruno 2022, eq. 2.52: the ELBO of the
//                   statistics scaled by N / |b| at the current lambda; a pass's objective is the
//                   steps' values weighted by |b| / N (each row counted once)
//   step size       Robbins-Monro rho_t = (tau0 + t)^-kappa (the driver's; Bruno 2022, eq.
//                   2.51), or the adaptive rate of Ranganath, Wang, Blei & Xing 2013 (Bruno
//                   2022, eqs 2.54-2.58), whose state (tau, g_bar, h_bar) is saved with lambda
//
// The per-step traces (stochastic ELBO, rho, seconds, and the full ELBOs of --full-elbo-every)
// are model state too, saved in the checkpoint, so a resumed fit writes the same model file. The
// model knows nothing of files or MPI: rows and full passes come through the caller's callbacks.
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <vector>

#include "engine/reduce.hpp"
#include "engine/state.hpp"
#include "models/gmm/batch.hpp"
#include "models/gmm/gmm.hpp"

namespace caviar::gmm {

// The adaptive learning rate (Ranganath et al. 2013; Bruno 2022, eqs 2.54-2.58): moving averages
// g_bar of the noisy natural gradient and h_bar of its squared norm, with a memory tau that
// shrinks where the gradient is consistent.
class AdaptiveStep {
 public:
  AdaptiveStep(const Model& model, double memory)
      : model_(model), tau_(memory), gbar_(model.make_stats()) {}
  // The first averages: the mean of Monte Carlo gradients at lambda_0 (add each, then finish).
  void add(const Stats& g);
  void finish(std::int64_t count);
  // rho_t given the noisy natural gradient g_t = lambda_hat - lambda.
  double next(const Stats& g);
  void save(engine::StateWriter& w) const;
  void load(const engine::StateReader& r);

 private:
  const Model& model_;
  double tau_;
  Stats gbar_;
  double hbar_ = 0;
};

struct SviOptions {
  bool adaptive = false;       // the adaptive rate; otherwise the driver's Robbins-Monro rho_t
  double adaptive_memory = 0;  // its initial memory tau_1
  int full_elbo_every = 0;     // > 0: the full ELBO after every such step (a diagnostic)
};

// The per-step traces of a fit: one entry per step (the stochastic ELBO, rho, the fit's seconds
// after it), and the full ELBOs of --full-elbo-every with their seconds and step.
struct SviTraces {
  std::vector<double> elbo, rho, seconds, full_elbo, full_elbo_seconds, full_elbo_step;
};

class SviFit {
 public:
  using Stats = SummedStats;
  // with(rows, f) calls f(x) with the listed rows (global indices with every_rank, local ones
  // otherwise), on every rank at every step: it may be collective.
  using WithRows = std::function<void(std::span<const std::int64_t> rows,
                                      const std::function<void(const RowMatrix&)>& f)>;
  // The ELBO of the current posterior over every row (collective).
  using FullElbo = std::function<double()>;

  // model: its prior and shift set; exponents: the grid of exact sums (Model::exact_exponents),
  // empty for plain double sums.
  SviFit(Model& model, std::int64_t n_rows, std::vector<int> exponents, WithRows with,
         FullElbo full_elbo, const SviOptions& o);

  // lambda_0: the statistics the model was first updated from.
  void start(const gmm::Stats& initial);
  // The adaptive rate's first averages from minibatch statistics s (scale N / |b|) at lambda_0.
  void add_first_gradient(const Stats& s, double scale);
  void finish_first_gradients(std::int64_t count);

  Stats make_stats() const { return summed_stats(model_, n_rows_, exponents_); }
  void local_step(Stats& s, std::span<double> terms, std::span<const std::int64_t> rows);
  double step_objective(const Stats& s, double scale);
  double step_size(const Stats& s, double scale, double rho);
  void update_stochastic(const Stats& s, double rho, double scale);
  void end_step(double seconds);
  // The stochastic ELBO already holds the global terms (Bishop 2006, eqs 10.73, 10.74, 10.76 and
  // 10.77).
  double global_objective() const { return 0.0; }
  void save(engine::StateWriter& w) const;
  void load(const engine::StateReader& r);

  const SviTraces& traces() const { return traces_; }
  std::int64_t steps() const { return static_cast<std::int64_t>(traces_.elbo.size()); }

 private:
  // batch_ = scale * s, and with_gradient grad_ = batch_ - S_eff (Bruno 2022, eq. 2.49).
  void scaled(const Stats& s, double scale, bool with_gradient);

  Model& model_;
  std::int64_t n_rows_;
  std::vector<int> exponents_;
  WithRows with_;
  FullElbo full_elbo_;
  SviOptions o_;
  gmm::Stats s_eff_, batch_, grad_;
  std::optional<AdaptiveStep> adaptive_;
  SviTraces traces_;
};

}  // namespace caviar::gmm
