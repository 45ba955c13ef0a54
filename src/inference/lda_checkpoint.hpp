#pragma once
// Checkpoint and resume of `caviar lda fit --algorithm svi` (in memory or --stream), and its
// stop-signal handling; batch CAVI uses the engine's checkpoint (engine/checkpoint.hpp) with the
// same fingerprint(). The fit loop calls boundary() before each minibatch step; see
// inference/checkpoint.hpp for what every model must do to keep the guarantees.
//
// State saved at a boundary, enough for a bitwise-identical continuation at any rank and thread
// count (LDA's results do not depend on either):
//  - lambda (K x V), as doubles: every derived quantity (exp E[ln beta], the row digammas) is a
//    deterministic function of it, recomputed by Model::set_lambda;
//  - the pass, the minibatches done in it and the steps done t (rho_t depends only on t; the
//    minibatches are keyed by (seed, pass)), and the document ELBO terms of the pass so far
//    (gathered on rank 0: the pass's estimate is an exact, order-independent sum of them);
//  - the traces (ELBO, seconds, perplexity), the elapsed fitting seconds and the counters of the
//    summary (document sweeps over all ranks, the tokens counted by a streamed first pass, the
//    rows moved by the reductions);
//  - the fingerprint (fingerprint() below).
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/signals.hpp"
#include "inference/checkpoint.hpp"
#include "inference/lda_driver.hpp"
#include "io/csr.hpp"
#include "io/h5.hpp"

namespace caviar::lda {

// The fit loop's position and counters at a boundary.
struct Position {
  int iteration = 0;            // the current pass
  std::int64_t step = 0;        // minibatches done in the pass
  std::int64_t t = 0;           // steps done
  double pass_tokens = 0;       // --stream: tokens of pass 0's minibatches so far
  double reduced_rows = 0;      // summed share of rows moved by the reductions ...
  std::int64_t reductions = 0;  // ... and their number
};

// Model lda, algorithm, K, V, the corpus's shape and sampled-documents identity (and the held-out
// corpus's, which fills the perplexity trace), alpha and eta as resolved, seed, the document fixed
// point's tolerance and sweeps, --stream, and SVI's batch size, tau0 and kappa. Options that only
// decide when to stop (--max-iter, --tol) or what to write (--out) may differ. indptr is
// the corpus's whole /indptr if the caller holds it (--stream), else nullptr (it is read).
ckpt::Fingerprint fingerprint(const Comm& comm, const FitOptions& o, const io::DataRef& ref,
                              const io::CorpusInfo& info, const std::vector<std::int64_t>* indptr,
                              const io::DataRef* heldout, double alpha, double eta);

class Checkpointer {
 public:
  // Start of fit(): installs the SIGTERM/SIGUSR1 handlers for the fit and checks --checkpoint,
  // --checkpoint-every and --resume against the other files (collective).
  Checkpointer(const Comm& comm, const FitOptions& o, const std::vector<std::string>& inputs);

  // Once the corpus's header is known: builds the fingerprint and, with --resume, reads the
  // checkpoint and checks it (collective; one error line on mismatch). Does nothing without
  // --checkpoint or --resume.
  void open(const io::DataRef& ref, const io::CorpusInfo& info,
            const std::vector<std::int64_t>* indptr, const io::DataRef* heldout, double alpha,
            double eta);

  bool resuming() const { return state_.has_value(); }
  const Position& position() const;
  double elapsed() const { return resuming() ? state_->elapsed : 0.0; }
  // Resuming: lambda into the model, the traces, iterations and token count into res, and the
  // saved document sweeps into res.sweeps on rank 0 (they are summed over ranks at the end).
  void restore(Model& model, FitResult& res) const;
  // Resuming: the pass's document terms so far (all on rank 0, none elsewhere).
  std::vector<double> pass_terms() const;

  // Boundary hook (every rank, same place): polls the stop signal (one allreduce), writes the
  // checkpoint when due (collective), and on a signal throws ckpt::Preempted on every rank.
  // pass_terms: the document terms of the pass on this rank.
  void boundary(const Position& pos, const Model& model, const FitResult& res, double elapsed,
                std::span<const double> pass_terms);

 private:
  struct State {
    Position pos;
    std::vector<double> lambda, pass_terms;
    FitResult res;
    double elapsed = 0;
  };
  void write(const Position& pos, const Model& model, const FitResult& res, double elapsed,
             std::span<const double> pass_terms) const;

  const Comm& comm_;
  const FitOptions& o_;
  StopSignals signals_;
  ckpt::StopPoller poller_;
  std::optional<ckpt::Fingerprint> fp_;
  std::optional<State> state_;  // read from --resume
};

}  // namespace caviar::lda
