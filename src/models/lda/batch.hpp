#pragma once
// Batch CAVI for LDA as a model of the engine's batch driver (engine/batch.hpp): the local step
// is every document's fixed point for (gamma_d, phi_d) and the expected topic-word counts, the
// global update is lambda = eta + S (Hoffman, Blei & Bach 2010, Algorithm 1), and the objective
// is the ELBO. The per-document gammas are local state: each iteration starts warm from them, so
// they are checkpointed (in parallel, by the engine).
//
// The documents come in pieces: one piece (the rank's corpus in memory), or several read again
// at every iteration (--stream: only the gammas stay in memory). Reading is the caller's: the
// model knows nothing of files or MPI.
#include <cstdint>
#include <functional>
#include <span>
#include <utility>
#include <vector>

#include "core/partition.hpp"
#include "engine/state.hpp"
#include "models/lda/lda.hpp"

namespace caviar::lda {

// The rank's documents, local indices [0, n), in consecutive ranges. read(i) returns the corpus
// of range i, valid until the next call; it is called for i = 0 .. calls - 1 at every local step,
// in order (a streamed read is collective, so every rank makes the same number of calls: an
// i >= ranges.size() reads nothing).
struct Pieces {
  std::vector<RowRange> ranges;
  std::int64_t calls = 0;
  std::function<const Corpus&(std::int64_t i)> read;
};

class BatchFit {
 public:
  using Stats = lda::Stats;

  // model: initialised; tokens: the corpus's total (every rank's), which bounds every expected
  // count and so sets the fixed-point scale; warm: the gammas will be restored from a checkpoint
  // taken after the first iteration (the first local step otherwise starts cold).
  BatchFit(Model& model, Pieces pieces, double tokens, const LocalOptions& local, bool warm);

  Stats make_stats() const;
  std::int64_t n_local_rows() const { return gamma_.rows(); }
  void local_step(Stats& s, std::span<double> terms);
  double global_objective() const { return model_.global_elbo(); }
  void update(const Stats& s) { model_.update(s); }
  void save(engine::StateWriter& w) const { model_.save(w); }
  void load(const engine::StateReader& r) { model_.load(r); }
  // Before the first iteration the gammas are ones: never read (that step starts cold), but
  // positive, so a checkpoint taken then passes the resume check.
  std::vector<engine::LocalState> local_states() {
    return {{"gammas", gamma_.data(), model_.n_topics(), true, "document"}};
  }

  // Document fixed-point sweeps of this rank so far (a counter the engine carries across a
  // resume).
  std::int64_t& sweeps() { return sweeps_; }

 private:
  Model& model_;
  Pieces pieces_;
  double tokens_;
  LocalOptions local_;
  bool warm_;
  RowMatrix gamma_, piece_gamma_;
  std::vector<std::int64_t> docs_;
  std::int64_t sweeps_ = 0;
};

}  // namespace caviar::lda
