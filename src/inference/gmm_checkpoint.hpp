#pragma once
// Checkpoint and resume of `caviar gmm fit` (CAVI, SVI, EM), and its stop-signal handling. The
// fit loop calls the hooks below at each iteration boundary (CAVI/EM: before an iteration's
// E-step; SVI: before a step); see inference/checkpoint.hpp for what every model must do to keep
// the guarantees.
//
// State saved at a boundary, enough for a bitwise-identical continuation at the same rank and
// thread count:
//  - the summed statistics S the model was last updated from: update() is a deterministic,
//    history-free function of (prior, shift, S), and prior and shift are recomputed from the same
//    data and options (CAVI/EM: the last E-step's statistics; SVI: s_eff = lambda - prior);
//  - the position: the next CAVI/EM iteration, or the SVI epoch, the next step inside it, the
//    steps done t, the epoch's running ELBO sum and last rho, and the count of decreasing epochs;
//  - SVI's schedule state: tau, g_bar (a Stats) and h_bar of the adaptive rate (Robbins-Monro
//    needs only t); the minibatches are keyed by (seed, epoch, position), so nothing else;
//  - the traces (objective, seconds, epoch averages, rho, full-ELBO checks) and the elapsed
//    fitting seconds;
//  - a fingerprint: model gmm, algorithm, covariance, weight prior, K, D, the data's shape and
//    sampled-rows identity (ckpt::data_identity), seed, init, and every option that changes the
//    result (priors as resolved, reg_covar, SVI batch size and schedule, stream and chunk rows).
//    Options that only decide when to stop (--max-iter, --tol) or what to write (--out,
//    --labels, --heldout) may differ.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/signals.hpp"
#include "inference/checkpoint.hpp"
#include "inference/gmm_driver.hpp"
#include "io/h5.hpp"

namespace caviar::gmm {

// SVI's position and schedule scalars at a step boundary.
struct SviPosition {
  int epoch = 0;
  std::int64_t step = 0;  // the next step inside the epoch
  std::int64_t t = 0;     // steps done
  int decreases = 0;      // consecutive decreasing epoch averages
  double epoch_sum = 0;   // sum of this epoch's stochastic ELBOs so far, each times its |b|
  double rho = 0;         // the last step size
  double tau = 0, hbar = 0;
};

class Checkpointer {
 public:
  // Start of fit(): installs the SIGTERM/SIGUSR1 handlers for the fit and checks --checkpoint,
  // --checkpoint-every and --resume against the other files (collective).
  Checkpointer(const Comm& comm, const FitOptions& o, const std::vector<std::string>& inputs);

  // Once the data's shape and the model (with its resolved prior) exist: builds the fingerprint
  // and, with --resume, reads the checkpoint and checks it (collective; one error line on
  // mismatch). Does nothing without --checkpoint or --resume.
  void open(const io::DataRef& ref, const io::MatrixShape& shape, const Model& model,
            const std::string& init);

  bool resuming() const { return state_.has_value(); }
  // Resuming: the statistics to rebuild the model from, and the saved elapsed seconds.
  Stats stats(const Model& model) const;
  double elapsed() const { return resuming() ? state_->elapsed : 0.0; }
  // Resuming: the traces and counters of the result so far (no-op otherwise).
  void restore(FitResult& res) const;
  int first_iteration() const { return resuming() ? state_->iteration : 0; }  // CAVI/EM
  SviPosition svi_position() const { return resuming() ? state_->svi : SviPosition{}; }
  // Resuming with the adaptive schedule: its g_bar (empty otherwise).
  const std::vector<double>& gbar() const;

  // Boundary hooks (every rank, same place): poll the stop signal (one allreduce), write the
  // checkpoint when due, and on a signal throw ckpt::Preempted on every rank.
  void iteration(int it, const Stats& stats, const FitResult& res, double elapsed);
  void svi_step(const SviPosition& pos, const Stats* gbar, const Stats& s_eff, const FitResult& res,
                double elapsed);

 private:
  struct State {
    int iteration = 0;
    SviPosition svi;
    std::vector<double> stats, gbar;
    FitResult res;
    double elapsed = 0;
  };
  // Polls; writes (via write_at) when due; throws Preempted on a signal.
  template <class Where, class W>
  void boundary(std::int64_t done, Where&& where, W&& write_at);
  void write(int iteration, const SviPosition* svi, const Stats* gbar, const Stats& stats,
             const FitResult& res, double elapsed) const;

  const Comm& comm_;
  const FitOptions& o_;
  StopSignals signals_;
  ckpt::StopPoller poller_;
  std::optional<ckpt::Fingerprint> fp_;
  std::optional<State> state_;  // read from --resume
};

}  // namespace caviar::gmm
