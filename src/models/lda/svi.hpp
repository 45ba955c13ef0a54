#pragma once
// Stochastic variational inference for LDA (Hoffman, Blei & Bach 2010, Algorithm 2) as a model of
// the engine's stochastic driver (engine/stochastic.hpp): the local step is each minibatch
// document's fixed point for (gamma_d, phi_d), started fresh, and its expected topic-word counts;
// the global step is lambda <- (1 - rho_t) lambda + rho_t (eta + D / |B| S) (their eq. 9), with
// t counted from 0; the objective of a pass is the sum of its document ELBO terms, each taken
// with the lambda of the step that visited it, plus the global terms.
//
// Two things keep a step's cost proportional to the minibatch rather than to V: exp(E[ln beta])
// is refreshed only for the minibatch's words before its local step (Model::refresh_words; all
// of it at the end of a pass, before the objective), and the reduction moves only the rows of
// words some rank's minibatch documents contain (SviStats).
//
// The documents are in memory (the rank's corpus), or --stream: read for each minibatch by the
// caller's BatchReader, in the runs of 256-document blocks the visiting order is made of. The
// model knows nothing of files or MPI.
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "engine/reduce.hpp"
#include "engine/state.hpp"
#include "models/lda/lda.hpp"

namespace caviar::lda {

// The expected counts of a minibatch, summed over ranks by moving only the rows of words that
// occur in some rank's documents of it (every other row is zero on every rank): the union of the
// ranks' word sets (one bitwise-or reduction of a V-bit map), then one sum of those rows, packed.
// The sums are the same integers as a full reduction's; a minibatch of 256 Spam Assassin
// messages touches about half of the vocabulary.
// The rows the reductions moved and their number (counted once, not per rank), for the fit's
// summary: counters the engine carries across a resume.
struct ReducedRows {
  std::int64_t words = 0, calls = 0;
};

class SviStats {
 public:
  SviStats(int n_topics, std::int64_t n_words, double scale, ReducedRows* usage);
  Stats& counts() { return counts_; }
  const Stats& counts() const { return counts_; }
  // Zeroes the rows of the last reduction (every other row is zero already).
  void set_zero();
  void add_docs(const Corpus& c, std::span<const std::int64_t> docs);
  void reduce(const engine::Reducer& r);

 private:
  Stats counts_;
  std::vector<std::uint64_t> bits_;
  std::vector<std::int64_t> words_, packed_;
  ReducedRows* usage_;
};

// --stream: fills parts with the corpora of this rank's minibatch documents `rows` (global
// indices, increasing), one corpus per run of consecutive rows, in order (extra empty parts are
// allowed), and returns the minibatch's tokens over every rank. The caller's reads are
// collective.
using BatchReader =
    std::function<double(std::span<const std::int64_t> rows, std::vector<Corpus>& parts)>;

class SviFit {
 public:
  using Stats = SviStats;

  // model: initialised. In memory, corpus holds the rank's documents and tokens is the corpus's
  // total (which bounds every expected count: one fixed-point scale for every step); with
  // --stream, corpus is null and read gives each minibatch's documents and tokens (the scale of
  // that step). n_docs: the corpus's documents; seed: of the visiting order.
  SviFit(Model& model, const Corpus* corpus, BatchReader read, std::int64_t n_docs, double tokens,
         std::uint64_t seed, const LocalOptions& local);

  Stats make_stats() const;
  std::vector<std::int64_t> pass_order(int pass) const;
  void local_step(Stats& s, std::span<double> terms, std::span<const std::int64_t> rows);
  void update_stochastic(const Stats& s, double rho, double scale) {
    model_.update_stochastic(s.counts(), rho, scale, false);
  }
  void end_pass() { model_.refresh(); }
  double global_objective() const { return model_.global_elbo(); }
  void save(engine::StateWriter& w) const { model_.save(w); }
  void load(const engine::StateReader& r) { model_.load(r); }

  // Counters the engine carries across a resume: document fixed-point sweeps, and the tokens of
  // the documents visited (every pass visits each document once).
  std::int64_t& sweeps() { return sweeps_; }
  std::int64_t& tokens_visited() { return tokens_visited_; }
  std::int64_t& reduced_words() { return usage_.words; }
  std::int64_t& reductions() { return usage_.calls; }

 private:
  Model& model_;
  const Corpus* corpus_;
  BatchReader read_;
  std::int64_t n_docs_;
  double tokens_;
  std::uint64_t seed_;
  LocalOptions local_;
  RowMatrix gamma_;
  std::vector<Corpus> parts_;
  std::vector<std::int64_t> docs_;
  std::int64_t sweeps_ = 0, tokens_visited_ = 0;
  mutable ReducedRows usage_;  // filled by the statistics make_stats() hands out
};

}  // namespace caviar::lda
