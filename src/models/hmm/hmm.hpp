#pragma once
// Hidden Markov models with categorical or Gaussian emissions over ragged sequences, fitted by
// Baum-Welch EM (Baum et al. 1970; Rabiner 1989) or by variational Bayes (CAVI: MacKay 1997;
// Beal 2003, ch. 3; SVI over minibatches of whole sequences: Hoffman et al. 2013; Foti et al.
// 2014):
//
//   z_1 ~ Cat(pi),  z_t | z_{t-1} = j ~ Cat(A_j),  x_t | z_t = k ~ p(x | theta_k)
//
// with p(x | theta_k) = Cat(B_k) over V symbols, or N(mu_k, Sigma_k) with full or diagonal
// Sigma_k. One "row" of the engine is one whole sequence: each rank owns a contiguous range of
// sequences, runs forward-backward on them, and adds the expected counts (start, transition,
// occupancy and emission statistics) into integer fixed point, so the totals do not depend on how
// sequences are split over ranks and threads.
//
// Forward-backward runs in scaled form (Rabiner 1989, section V.A; Bishop 2006, section 13.2.4):
// the forward variables are normalised at every step by c_t, the backward ones by the same c_t, and
// log p(x_1..T) = sum_t log c_t (+ the row maxima subtracted from the log emissions, which are
// computed for a whole sequence at once). Nothing underflows however long the sequence.
//
// EM: the M-step re-estimates pi, A and theta from the expected counts (Bishop 13.18-13.23); the
// objective is the log-likelihood, which never decreases.
//
// VB: Dirichlet priors on pi and each row of A; Dirichlet on each B_k (categorical) or
// Normal-Wishart on (mu_k, Lambda_k) (Gaussian; Bishop 2006, section 10.2). Given q(theta), the
// optimal q(z) is an HMM on the sub-normalised parameters exp E[ln pi], exp E[ln A],
// exp E[ln p(x | theta)], whose forward sum Z gives the exact ELBO
//   L = sum_seq ln Z_seq - KL(q(pi) || p(pi)) - sum_j KL(q(A_j) || p(A_j)) - sum_k KL(q(theta_k) ||
//   p(theta_k))
// (MacKay 1997; Beal 2003, ch. 3). Diagonal Gaussian VB uses a Normal-Wishart per dimension (a
// Normal-Gamma), sharing beta and nu over the dimensions of a state.
//
// The model knows nothing of MPI or files (engine/batch.hpp runs it).
#include <Eigen/Core>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/state.hpp"

namespace caviar::hmm {

using RowMatrix = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

enum class Emission { kCategorical, kGaussian };
enum class Covariance { kFull, kDiag };
enum class Algorithm { kEm, kCavi, kSvi };

const char* name(Emission e);
const char* name(Covariance c);
const char* name(Algorithm a);

// This rank's sequences: offsets (local, from 0) into its time steps, and the steps themselves
// (symbols for categorical emissions, T x D rows for Gaussian ones).
struct Sequences {
  std::vector<std::int64_t> offsets{0};
  std::vector<std::int32_t> symbols;
  RowMatrix x;
  std::int64_t n() const { return static_cast<std::int64_t>(offsets.size()) - 1; }
  std::int64_t steps() const { return offsets.back(); }
  std::int64_t length(std::int64_t s) const { return offsets[s + 1] - offsets[s]; }
};

// Where the local steps find this rank's sequences: all in memory (one piece), or read from the
// file piece by piece at every pass (--stream). Reading is the caller's: the model knows nothing of
// files or MPI. A streamed read is collective, so every rank calls for_each's f as many times as
// the rank with the most pieces (with an empty piece once it has run out), and select on every
// minibatch step (with no sequences where it owns none of the minibatch).
struct SequenceSource {
  using PieceFn = std::function<void(const Sequences& piece, std::int64_t first)>;
  std::int64_t n = 0;  // this rank's sequences
  // Calls f(piece, first) over consecutive pieces of whole sequences covering [0, n) in order;
  // first is the local index of the piece's first sequence.
  std::function<void(const PieceFn& f)> for_each;
  // The listed local sequences (strictly increasing), in that order.
  std::function<Sequences(std::span<const std::int64_t> rows)> select;
};

// The global facts about the data the model needs on every rank (the fixed-point bounds and a
// scale for the Gaussian initialisation and prior).
struct DataSummary {
  std::int64_t sequences = 0, steps = 0;
  double max_abs = 0;             // max |x| over every step (Gaussian)
  std::vector<double> mean, var;  // per dimension (Gaussian)
};

struct Config {
  int states = 0;
  Emission emission = Emission::kCategorical;
  Covariance covariance = Covariance::kFull;
  Algorithm algorithm = Algorithm::kEm;
  std::int64_t symbols = 0;  // V (categorical)
  int dim = 0;               // D (Gaussian)
  // VB priors: Dirichlet concentrations of pi, of each row of A, of each B_k; the Normal-Wishart
  // of (mu_k, Lambda_k) has mean m0 = the data mean, beta0, nu0 = D + 2 and W0^-1 = nu0 diag(var).
  double prior_start = 1, prior_trans = 1, prior_emission = 1, prior_beta = 1;
  // EM, Gaussian: added to the diagonal of every covariance in the M-step, so that a state that
  // collapses onto one point keeps a finite likelihood.
  double min_covar = 1e-6;
};

// Expected counts in int64 fixed point, one contiguous buffer with one section per kind of
// statistic, each with its own power-of-two scale (core/fixed_point.hpp's rule, from a bound on
// the section's totals). Signed entries (Gaussian first moments) round as floor(x s + 1/2), a
// function of the addend alone, so the sums stay exact and order-independent.
class Stats {
 public:
  struct Section {
    std::int64_t offset = 0, size = 0;
    double scale = 1;
  };
  Stats() = default;
  Stats(const std::vector<std::int64_t>& sizes, const std::vector<double>& bounds);
  std::span<std::int64_t> words() { return buf_; }
  void set_zero();
  void add(int section, std::int64_t at, const double* x, std::int64_t n);
  double value(int section, std::int64_t i) const {
    const Section& s = sec_[static_cast<std::size_t>(section)];
    return static_cast<double>(buf_[static_cast<std::size_t>(s.offset + i)]) / s.scale;
  }
  Stats& operator+=(const Stats& o);

 private:
  std::vector<Section> sec_;
  std::vector<std::int64_t> buf_;
};

class Model {
 public:
  using Stats = hmm::Stats;
  enum SectionId { kStart = 0, kTrans = 1, kOcc = 2, kEmit = 3, kSx = 3, kSxx = 4 };

  // seqs: this rank's sequences (null for a model used only to score or decode).
  Model(const Config& cfg, const SequenceSource* seqs, const DataSummary& data);

  const Config& config() const { return cfg_; }
  // CAVI and SVI fit the same variational posterior; EM fits point estimates.
  bool variational() const { return cfg_.algorithm != Algorithm::kEm; }
  // Random initial parameters keyed by (seed, kHmmInit, index): identical on every rank.
  void init_random(std::uint64_t seed);

  // --- the engine's batch conjugate concept (engine/batch.hpp)
  Stats make_stats() const;
  std::int64_t n_local_rows() const { return seqs_ ? seqs_->n : 0; }
  void local_step(Stats& stats, std::span<double> terms);
  double global_objective() const;  // VB: minus the KL divergences of the globals; EM: 0
  void update(const Stats& stats);
  void save(engine::StateWriter& w) const;
  void load(const engine::StateReader& r);
  std::vector<engine::LocalState> local_states() { return {}; }

  // --- the engine's stochastic concept (engine/stochastic.hpp), VB only
  // The local step over the listed local sequences only (terms: one per listed sequence).
  void local_step(Stats& stats, std::span<double> terms, std::span<const std::int64_t> rows);
  // The natural-gradient step with step size rho, the statistics scaled by N / |B|.
  void update_stochastic(const Stats& stats, double rho, double scale);

  // Loads the point parameters (startprob, transmat, emissionprob or means/covariances) of any
  // hmm model file, to score or decode with.
  void load_point(const engine::StateReader& r);

  // log p(x_seq) of every sequence of s under the current parameters (point estimates, or the
  // sub-normalised VB parameters: then the ELBO's data term).
  void log_likelihood(const Sequences& s, std::span<double> out) const;
  // Per-step state marginals gamma (s.steps() x K, row-major).
  void posteriors(const Sequences& s, std::span<double> out) const;
  // Most probable state path per step (Viterbi, in log space).
  void viterbi(const Sequences& s, std::span<std::int64_t> out) const;
  // Draws n sequences of `length` steps from the point parameters: their states (n length) and
  // symbols (categorical, n length) or rows (Gaussian, n length x D). Each draw is keyed by
  // (seed, kHmmSample, global step), so the result depends on nothing else.
  void sample(std::uint64_t seed, std::int64_t n, std::int64_t length,
              std::vector<std::int64_t>& states, std::vector<std::int64_t>& symbols,
              RowMatrix& x) const;

  // Effective parameters the forward-backward uses (point estimates for EM; exp E[ln .] for VB).
  const Eigen::VectorXd& start() const { return pi_; }
  const RowMatrix& trans() const { return a_; }

 private:
  struct Work;
  // Log emission block of one sequence (T x K) into w.
  void log_emissions(const Sequences& s, std::int64_t seq, Work& w) const;
  // The same for steps [t1, t1 + n) of the sequence, into out (n x K).
  void log_emissions(const Sequences& s, std::int64_t seq, std::int64_t t1, std::int64_t n, Work& w,
                     double* out) const;
  // Steps per chunk of Gaussian emissions: a chunk's K log densities per step are exponentiated
  // while they are still in the L1 cache.
  static constexpr std::int64_t kEmissionChunk = 32;
  // Steps of expected transitions added to xi at once in the backward sweep.
  static constexpr int kPairs = 16;
  // Gaussian emission probabilities of steps [t1, t1 + n) of a sequence into out (n x K), each
  // step's divided by its largest; the logarithms of those maxima into maxima (n); false (a
  // maximum not finite) if no state can emit some step.
  bool scaled_emissions(const Sequences& s, std::int64_t seq, std::int64_t t1, std::int64_t n,
                        Work& w, double* out, double* maxima) const;
  // Scaled forward-backward of one sequence; returns its log-likelihood (log Z for VB). With
  // stats, adds its expected counts; with gamma, writes the marginals.
  double forward_backward(const Sequences& s, std::int64_t seq, Work& w, Stats* stats,
                          double* gamma) const;
  // The local step over every sequence of s (terms: one per sequence of s).
  void local_step(const Sequences& s, Stats& stats, std::span<double> terms);
  void refresh();  // recompute the forward-backward parameters from the state
  // The M-step / CAVI update from the statistics times `scale`, without refresh().
  void set_target(const Stats& stats, double scale);
  struct Natural;
  Natural natural() const;
  void set_natural(const Natural& n);
  void point_params(Eigen::VectorXd& pi, RowMatrix& a, RowMatrix& b, RowMatrix& means,
                    std::vector<RowMatrix>& cov) const;

  Config cfg_;
  const SequenceSource* seqs_;
  DataSummary data_;
  int k_, d_;
  std::int64_t v_;
  // EM state: pi, A, B (K x V) or means (K x D) and covariances (K of D x D; diagonal for diag).
  // VB state: Dirichlet parameters (alpha_start K, alpha_trans K x K, alpha_emit K x V) or
  // Normal-Wishart (m K x D, beta K, W^-1 K of D x D, nu K). VB keeps W^-1, not W: the update
  // produces W^-1, and the covariance estimate W^-1 / nu needs no inverse.
  Eigen::VectorXd p_start_;
  RowMatrix p_trans_, p_emit_, means_;
  std::vector<RowMatrix> cov_;  // EM: Sigma_k; VB: W_k^-1 (diagonal for diag)
  Eigen::VectorXd beta_, nu_;
  Eigen::VectorXd m0_;
  RowMatrix w0_inv_;
  RowMatrix w0_chol_;  // Gaussian: the lower Cholesky factor of W0^-1
  // Derived: the forward-backward's parameters.
  Eigen::VectorXd pi_;
  RowMatrix a_, log_b_t_;  // A (K x K); categorical: log B^T (V x K)
  RowMatrix a_tr_;         // A' (the backward recursion's product; empty from kFuseStates on)
  // Categorical: exp(log B^T - its row maxima) (V x K) and the row maxima (V).
  RowMatrix emit_scaled_;
  Eigen::VectorXd emit_max_;
  // Gaussian, full: the lower Cholesky factor L_k of cov_[k]; the expected precision is
  // quad_scale_[k] (L_k L_k')^-1 (EM: 1; VB: nu_k), applied by a triangular solve.
  std::vector<RowMatrix> chol_;
  Eigen::VectorXd quad_scale_;
  Eigen::VectorXd gauss_const_;  // Gaussian: per-state constant of the log density
  RowMatrix emit_soa_;  // Gaussian: the log densities' parameters in blocks of vector-width states
                        // (refresh)
  std::vector<Stats> work_;
  // Per-thread forward-backward buffers, kept across local steps and across calls of the const
  // passes (likelihoods, posteriors, Viterbi; `hmm score` and `--posteriors` call them once per
  // streamed piece) so that the T x K matrices are not allocated, and their pages first touched,
  // again each time: at 10^5 steps and K = 32 that cost several times the recursions. Like the
  // rest of the model, not for concurrent calls from several threads.
  struct WorkDeleter {
    void operator()(Work* w) const;
  };
  mutable std::vector<std::unique_ptr<Work, WorkDeleter>> fb_work_;
  // fb_work_ grown to `threads` buffers.
  void grow_work(int threads) const;
};

}  // namespace caviar::hmm
