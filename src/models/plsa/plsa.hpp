#pragma once
// Probabilistic latent semantic analysis (Hofmann 1999), fitted by EM (Dempster, Laird & Rubin
// 1977) over a bag-of-words corpus:
//
//   p(w | d) = sum_k p(k | d) p(w | k)
//
// with document-topic proportions theta_dk = p(k|d) (per-row state: one row per document, held by
// the rank that owns the document) and topic-word distributions phi_kw = p(w|k) (global).
//
//   E-step   r_dwk = theta_dk phi_kw / sum_j theta_dj phi_jw
//   M-step   phi_kw  ∝ sum_d n_dw r_dwk               (global: counts summed over every rank)
//            theta_dk = sum_w n_dw r_dwk / n_d        (local: each document's own counts)
//   objective  log-likelihood  sum_d sum_w n_dw log sum_k theta_dk phi_kw, never decreasing.
//
// With smoothing s > 0 the M-step for phi is the MAP estimate under a symmetric Dirichlet(1 + s)
// prior on each topic (phi_kw ∝ sum_d n_dw r_dwk + s), and the objective gains the prior's
// s sum_kw log phi_kw: EM for a MAP estimate, still never decreasing. It keeps every word's
// probability positive, so held-out documents with words unseen in training have a finite
// perplexity. s = 0 (the default) is Hofmann's maximum likelihood.
//
// The model knows nothing of MPI or files; the engine (engine/batch.hpp) runs its local step on
// each rank, sums the statistics exactly and calls update(). The topic-word counts are summed in
// int64 fixed point (core/fixed_point.hpp), so results do not depend on the number of ranks or
// threads.
#include <Eigen/Core>
#include <cstdint>
#include <span>
#include <vector>

#include "core/fixed_point.hpp"
#include "data/corpus.hpp"
#include "engine/state.hpp"

namespace caviar::plsa {

using RowMatrix = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// Folding in a document (held-out scoring): EM on theta_d with phi fixed, from uniform, until the
// mean absolute change of theta_d is below tol or after max_iter sweeps.
struct FoldIn {
  double tol = 1e-3;
  int max_iter = 100;
};

class Model {
 public:
  // The expected topic-word counts, word-major (V x K), in fixed point.
  using Stats = FixedPointCounts;

  // corpus: this rank's documents (may be null for a model used only to score); tokens: the
  // corpus's total token count over every rank (the fixed-point scale's bound).
  Model(int n_topics, std::int64_t n_words, const Corpus* corpus, double tokens,
        double smooth = 0.0);

  int n_topics() const { return k_; }
  std::int64_t n_words() const { return v_; }
  // phi_kw drawn uniformly on (0, 1) keyed by (seed, k V + w), each topic normalised; theta_d
  // uniform.
  void init_random(std::uint64_t seed);
  RowMatrix topic_word() const { return phi_t_.transpose(); }  // K x V
  const RowMatrix& doc_topic() const { return theta_; }        // local documents x K

  // --- the engine's batch conjugate concept (engine/batch.hpp)
  Stats make_stats() const { return Stats(v_, k_, fixed_point_scale(std::max(tokens_, 1.0))); }
  std::int64_t n_local_rows() const { return corpus_ ? corpus_->n_docs() : 0; }
  // E-step over this rank's documents: the expected counts into stats, each document's
  // log-likelihood into terms, and its next theta (applied by update()).
  void local_step(Stats& stats, std::span<double> terms);
  double global_objective() const;  // the prior's s sum_kw log phi_kw (0 without smoothing)
  void update(const Stats& stats);  // M-step: phi from the summed counts; theta <- next theta
  void save(engine::StateWriter& w) const;
  void load(const engine::StateReader& r);
  std::vector<engine::LocalState> local_states() { return {{"doc_topics", theta_.data(), k_}}; }

  // Document completion (held-out scoring): theta_d folded in on the observed half of each
  // document's tokens, then log p of the other half. log_prob and n_heldout get one entry per
  // document of c. A held-out token of a word the model gives probability 0 (unseen in training,
  // without smoothing) makes its document's log_prob -inf.
  void completion(const Corpus& c, std::span<double> log_prob, std::span<double> n_heldout,
                  const FoldIn& opt) const;

 private:
  int k_;
  std::int64_t v_;
  const Corpus* corpus_;
  double tokens_;
  double smooth_;
  RowMatrix phi_t_;          // V x K: p(w|k), a word's K topics contiguous
  RowMatrix theta_, next_;   // local documents x K: p(k|d), and the E-step's update of it
  std::vector<Stats> work_;  // per-thread counts of threads other than the first
};

}  // namespace caviar::plsa
