#pragma once
// Latent Dirichlet allocation by mean-field variational Bayes (Blei, Ng & Jordan 2003, sections
// 5.2 and 5.4, in the word-count form of Hoffman, Blei & Bach 2010, Algorithm 1) and its stochastic
// version (Hoffman, Blei & Bach 2010, Algorithm 2).
//
//   beta_k ~ Dir(eta) (k = 1..K, over V words),  theta_d ~ Dir(alpha),
//   z_di ~ Cat(theta_d),  w_di | z_di = k ~ Cat(beta_k).
//   q(beta_k) = Dir(lambda_k),  q(theta_d) = Dir(gamma_d),  q(z_di) = Cat(phi_dw).
//
// The model knows nothing of MPI or files. A step is:
//   local_step(docs)  -> Stats (expected topic-word counts, fixed point) + per-document ELBO terms
//   [driver: Stats summed over ranks in one allreduce of int64, exact and order independent]
//   update(stats)     -> lambda (CAVI: eta + S; SVI: the rho_t-weighted average, D/|B| scaling)
//
// The expected counts are accumulated in int64 fixed point: integer sums are exact, so the result
// does not depend on how documents are split over ranks or threads.
#include <Eigen/Core>
#include <cstdint>
#include <span>
#include <vector>

#include "core/fixed_point.hpp"
#include "data/corpus.hpp"
#include "engine/state.hpp"

namespace caviar::lda {

using RowMatrix = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// The document-level fixed point (gamma/phi) stops when the mean absolute change of gamma falls
// below tol, or after max_iter sweeps.
struct LocalOptions {
  double tol = 1e-3;
  int max_iter = 100;
};

using caviar::fixed_point_scale;  // core/fixed_point.hpp

// Expected topic-word counts sum_d sum_w n_dw phi_dwk (the lambda update of Hoffman, Blei & Bach
// 2010, Algorithm 1, without eta), in int64 fixed point with a scale shared by every rank. Stored
// word-major (V x K: a word's K topics are contiguous), so a document adds into one short
// contiguous row per word, and a subset of words is a set of rows (rows(): the packed reduction of
// SVI).
class Stats {
 public:
  Stats(int n_topics, std::int64_t n_words, double scale);
  std::span<std::int64_t> words() { return buf_; }
  std::span<const std::int64_t> words() const { return buf_; }
  void set_zero();
  double scale() const { return scale_; }
  void set_scale(double scale) { scale_ = scale; }  // only between set_zero() and accumulation
  int n_topics() const { return k_; }
  std::int64_t n_words() const { return v_; }
  double value(int k, std::int64_t w) const {
    return static_cast<double>(buf_[static_cast<std::size_t>(w * k_ + k)]) / scale_;
  }
  // The K counts of word w.
  std::int64_t* row(std::int64_t w) { return buf_.data() + w * k_; }
  const std::int64_t* row(std::int64_t w) const { return buf_.data() + w * k_; }
  Stats& operator+=(const Stats& o);

 private:
  friend class Model;
  int k_;
  std::int64_t v_;
  double scale_;
  std::vector<std::int64_t> buf_;
};

class Model {
 public:
  Model(int n_topics, std::int64_t n_words, double alpha, double eta);

  int n_topics() const { return k_; }
  std::int64_t n_words() const { return v_; }
  double alpha() const { return alpha_; }
  double eta() const { return eta_; }
  RowMatrix lambda() const { return lambda_t_.transpose(); }  // K x V

  // lambda_kw ~ Gamma(100, 1/100), keyed by (seed, k V + w): the initialisation of Hoffman et al.
  // Also sets the seed of the documents' starting gammas.
  void init_random(std::uint64_t seed);
  // Starting gammas are gamma_dk ~ Gamma(100, 1/100) keyed by (seed, global document d, k), as in
  // Hoffman et al.: a symmetric start would send every document to the same topic.
  void set_doc_seed(std::uint64_t seed) { doc_seed_ = seed; }
  // Throws caviar::Error unless lambda is K x V with positive finite entries.
  void set_lambda(RowMatrix lambda);

  // Local step over the documents `docs` (local indices into c); gamma has one row per entry of
  // docs. Each document's fixed point starts from random gammas (set_doc_seed). If warm, gamma
  // holds the previous fixed point: it is kept (and refined) whenever the fresh start ends with a
  // lower ELBO term, so CAVI with warm = true can never decrease the ELBO. The expected counts
  // under the final phi are added into stats (if given) and each document's ELBO term goes into
  // doc_terms. Returns the total number of fixed-point sweeps. Threads over documents (OpenMP).
  std::int64_t local_step(const Corpus& c, std::span<const std::int64_t> docs, RowMatrix& gamma,
                          bool warm, Stats* stats, std::span<double> doc_terms,
                          const LocalOptions& opt) const;

  // CAVI (Hoffman, Blei & Bach 2010, Algorithm 1): lambda = eta + S.
  void update(const Stats& s);
  // SVI (Hoffman et al. 2010, eq. 9): lambda = (1 - rho) lambda + rho (eta + scale S), with
  // scale = D / |batch|. With refresh = false, exp(E[ln beta]) is left stale: the caller must
  // call refresh_words(...) for the words of the next local step (every other word's value
  // would be recomputed and never read), and refresh() before anything else.
  void update_stochastic(const Stats& s, double rho, double scale, bool refresh = true);
  // exp(E[ln beta_kw]) of the words of documents `docs` of c, from the current lambda.
  void refresh_words(const Corpus& c, std::span<const std::int64_t> docs);
  // exp(E[ln beta]) of every word.
  void refresh();

  // The global part of the ELBO: sum_k E[ln p(beta_k | eta)] - E[ln q(beta_k | lambda_k)].
  double global_elbo() const;

  // Held-out document completion (the same estimator for every model, whatever its seed: the
  // starting gammas use seed 0): each document's tokens are split into two fixed halves (in
  // storage order, even-numbered tokens observed, odd-numbered held out); gamma is fitted on the
  // observed half and ln p(held-out tokens) = sum n_w ln sum_k E[theta_k] E[beta_kw] is summed.
  // Writes per-document log probabilities and held-out token counts.
  void completion(const Corpus& c, std::span<double> log_prob, std::span<double> n_heldout,
                  const LocalOptions& opt) const;

  // E[beta_kw] = lambda_kw / sum_w lambda_kw.
  RowMatrix topic_word() const;

  // The global state: components (lambda, K x V), topic_word (E[beta], for readers of the file),
  // and the attributes alpha, eta, n_topics, n_words. load() reads lambda back (set_lambda, which
  // recomputes every derived quantity by the code the fit used); alpha and eta are the
  // constructor's.
  void save(engine::StateWriter& w) const;
  void load(const engine::StateReader& r);

 private:
  std::int64_t local_step_seeded(const Corpus& c, std::span<const std::int64_t> docs,
                                 RowMatrix& gamma, bool warm, Stats* stats,
                                 std::span<double> doc_terms, const LocalOptions& opt,
                                 std::uint64_t seed) const;
  void refresh_row_sums();
  void refresh_span(const double* lam, double* out, std::int64_t n_words) const;

  // Per-thread scratch of local_step, kept between calls so that no document or minibatch
  // allocates. Threads beyond the first also keep their own statistics and the words they touched
  // (only those rows are added and cleared, so a minibatch costs its own words, not V).
  // Cache-line aligned: each thread writes its own (a shared line would bounce between cores).
  struct alignas(64) Workspace {
    std::vector<double> vec, doc;       // aligned per-document buffers (carved in local_step)
    std::vector<std::int64_t> offsets;  // row offsets of the document's words
    std::vector<std::int64_t> stats;    // V x K, all zero between calls
    std::vector<char> mark;             // V
    std::vector<std::int64_t> touched;
    std::int64_t sweeps = 0;
  };

  int k_;
  std::int64_t v_;
  double alpha_, eta_;
  std::uint64_t doc_seed_ = 0;
  // Topics contiguous per word (V x K) everywhere: a document gathers K contiguous values per
  // word, and the refresh of one word's exp(E[ln beta]) is a vector loop over K.
  RowMatrix lambda_t_;                   // V x K
  RowMatrix exp_elog_beta_t_;            // V x K: exp(psi(lambda_kw) - psi(sum_w lambda_kw))
  Eigen::VectorXd psi_row_sum_;          // K: psi(sum_w lambda_kw)
  std::vector<double> ps_tile_;          // 8 K: psi_row_sum_ repeated eight times (refresh_span)
  std::vector<char> mark_;               // V: scratch of refresh_words
  std::vector<std::int64_t> words_;      // scratch of refresh_words
  std::vector<double> gather_;           // scratch of refresh_words
  mutable std::vector<Workspace> work_;  // local_step's scratch: one local_step at a time
};

}  // namespace caviar::lda
