#pragma once
// Checkpoint and resume of `caviar gmm fit --algorithm svi`, and its stop-signal handling. The
// batch fits (CAVI, EM) use the engine's checkpoint (engine/checkpoint.hpp, through
// engine::fit_batch); both share the fingerprint below. The SVI loop calls svi_step at each step
// boundary; see inference/checkpoint.hpp for what every model must do to keep the guarantees.
//
// State saved at a boundary, enough for a bitwise-identical continuation at the same rank and
// thread count:
//  - s_eff = lambda - prior, the statistics the model was last updated from: update() is a
//    deterministic, history-free function of (prior, shift, S), and prior and shift are
//    recomputed from the same data and options;
//  - the position: the epoch, the next step inside it, the steps done t, the epoch's running ELBO
//    sum and last rho, and the count of decreasing epochs;
//  - the schedule state: tau, g_bar (a Stats) and h_bar of the adaptive rate (Robbins-Monro
//    needs only t); the minibatches are keyed by (seed, epoch, position), so nothing else;
//  - the traces (objective, seconds, epoch averages, rho, full-ELBO checks) and the elapsed
//    fitting seconds;
//  - the fingerprint (fingerprint() below).
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/signals.hpp"
#include "inference/checkpoint.hpp"
#include "inference/gmm_driver.hpp"
#include "io/h5.hpp"

namespace caviar::gmm {

// What a resumed fit must share with the run that wrote the checkpoint (collective): model gmm,
// algorithm, covariance, weight prior, K, D, the data's shape and sampled-rows identity
// (ckpt::data_identity), seed, init, and every option that changes the result (priors as
// resolved, reg_covar, SVI batch size and schedule, stream and chunk rows; for the batch fits,
// the engine's layout). Options that only decide when to stop (--max-iter, --tol) or what to
// write (--out, --labels, --heldout) may differ.
ckpt::Fingerprint fingerprint(const Comm& comm, const FitOptions& o, const io::DataRef& ref,
                              const io::MatrixShape& shape, const Model& model,
                              const std::string& init);

// The keys every mixture checkpoint shares, fit or chain (collective): K, D, the data's identity,
// seed, init, and the priors as resolved. fingerprint() and the Gibbs chain's add them after
// their own algorithm keys.
void add_mixture_keys(ckpt::Fingerprint& fp, const Comm& comm, const FitOptions& o,
                      const io::DataRef& ref, const io::MatrixShape& shape, const Model& model,
                      const std::string& init);

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
  SviPosition svi_position() const { return resuming() ? state_->svi : SviPosition{}; }
  // Resuming with the adaptive schedule: its g_bar (empty otherwise).
  const std::vector<double>& gbar() const;

  // The boundary hook (every rank, same place): polls the stop signal (one allreduce), writes the
  // checkpoint when due, and on a signal throws ckpt::Preempted on every rank.
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
  void write(int iteration, const SviPosition& svi, const Stats* gbar, const Stats& stats,
             const FitResult& res, double elapsed) const;

  const Comm& comm_;
  const FitOptions& o_;
  StopSignals signals_;
  ckpt::StopPoller poller_;
  std::optional<ckpt::Fingerprint> fp_;
  std::optional<State> state_;  // read from --resume
};

}  // namespace caviar::gmm
