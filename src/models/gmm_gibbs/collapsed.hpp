#pragma once
// The collapsed Gibbs sampler of the Bayesian Gaussian mixture (Bruno 2022, section 2.1.1,
// eqs. 2.33-2.40, Algorithm 4): pi and (mu_k, Lambda_k) are integrated out, and each label is
// drawn from
//
//   p(z_n = k | z_-n, X) propto (N_k,-n + alpha0) St(x_n | m_k, L_k, nu_k + 1 - D)
//
// (Bruno 2022, eqs. 2.37-2.39), the Student-t posterior predictive of the Normal-Wishart given
// the other points of component k (Bishop 2006, eqs. 10.81-10.82 and B.68; Murphy 2007, eq. 232).
// Each component keeps N_k, beta_k, m_k and the Cholesky factor of W_k^-1, so moving a point is a
// rank-one update or downdate of the factor, O(D^2) (Gill et al. 1974, through Eigen's
// LLT::rankUpdate).
//
// Blocks fixed by the data. The rows are cut into blocks of --block-rows global rows. Within a
// sweep every block sweeps its own rows sequentially, in a fresh order keyed by (seed, sweep,
// global row), against the statistics at the start of the sweep plus its own block's moves; the
// new labels' statistics are then summed exactly over all blocks (the engine's reduction) and
// become the next sweep's statistics. This departs from the exact sampler as AD-LDA does
// (Newman et al. 2009): a block does not see the moves of other blocks in the same sweep. Unlike
// AD-LDA the blocks are fixed by the data, not by the ranks, so the chain is the same bits at any
// rank and thread count; a --block-rows of at least N gives the exact sequential sampler.
//
// As a model of the engine's sampler driver (engine/sampler.hpp): local_step is the sweep of the
// rank's blocks, draw() takes the new summed statistics, and the log joint is the collapsed
// marginal log p(X, z) (Bruno 2022, eq. 2.36 times eq. 2.40 per component; Murphy 2007, eq. 266),
// computed after draw() (kLogJointAfterDraw). The labels are the chain's per-row state. No MPI,
// no files.
#include <Eigen/Cholesky>
#include <Eigen/Core>
#include <cstdint>
#include <span>
#include <vector>

#include "engine/state.hpp"
#include "models/gmm/gmm.hpp"
#include "models/gmm_gibbs/blocked.hpp"

namespace caviar::gmm_gibbs {

// One component's Normal-Wishart posterior given its points (Bishop 2006, eqs. 10.60-10.63 with
// hard counts), in the coordinates of the model's shift c.
class CollapsedComponent {
 public:
  CollapsedComponent() = default;
  // From the posterior's beta_k, nu_k, m_k - c, W_k^-1 and N_k.
  CollapsedComponent(double n, double beta, double nu, Eigen::VectorXd m,
                     const Eigen::MatrixXd& w_inv);

  // Adds or removes the point y = x - c: beta, nu, N change by one, m moves, and
  // W^-1 changes by +- beta_old/beta_new (y - m_old)(y - m_old)^T, written with the values on the
  // side that holds fewer points (Bishop 2006, eqs. 10.60-10.62 before and after the point).
  void add(const Eigen::VectorXd& y);
  void remove(const Eigen::VectorXd& y);
  // log St(y | m, (nu + 1 - D) beta / (1 + beta) W, nu + 1 - D) (Bishop 2006, eqs. 10.81-10.82,
  // B.68). work: D doubles of scratch.
  double log_predictive(const Eigen::VectorXd& y, Eigen::VectorXd& work) const;
  // The component's log marginal likelihood log p(X_k) (Murphy 2007, eq. 266 in Bishop's
  // parameters): needs the prior's beta0, nu0 and log|W0^-1|.
  double log_marginal(double beta0, double nu0, double logdet_w0_inv) const;

  double n() const { return n_; }
  const Eigen::LLT<Eigen::MatrixXd>& llt() const { return llt_; }
  double logdet_w_inv() const;

 private:
  void refresh();  // norm_ from beta_, nu_ and the factor

  double n_ = 0, beta_ = 0, nu_ = 0, norm_ = 0;
  Eigen::VectorXd m_, dev_;
  Eigen::LLT<Eigen::MatrixXd> llt_;
};

class CollapsedSampler {
 public:
  using Stats = BlockedSampler::Stats;  // one-hot N_k, Sx_k, Sxx_k, summed exactly
  using Part = engine::DrawPart;
  // The log joint is a function of the new statistics, known after draw() (engine/sampler.hpp).
  static constexpr bool kLogJointAfterDraw = true;

  // x: this rank's rows, global rows [first_row, first_row + x.rows()) of n_rows; first_row must
  // be a multiple of block_rows (the driver checks it); exponents as for BlockedSampler.
  CollapsedSampler(gmm::Model& model, const gmm::RowMatrix& x, std::int64_t first_row,
                   std::int64_t n_rows, std::vector<int> exponents, std::uint64_t seed,
                   std::int64_t block_rows);

  // The start: this rank's labels and their summed statistics.
  void start(std::span<const std::int64_t> labels, const gmm::Stats& s);

  Stats make_stats() const;
  std::int64_t n_local_rows() const { return x_.rows(); }
  // One sweep of the rank's blocks (Bruno 2022, Algorithm 4, per block), and the new labels'
  // statistics into s. terms are zero: the log joint is all in global_log_density().
  void local_step(std::uint64_t sweep, Stats& s, std::span<double> terms);
  // log p(X, z) of the current statistics: the Dirichlet-multinomial (Bruno 2022, eq. 2.36) and
  // each component's marginal likelihood.
  double global_log_density() const;
  std::vector<double> counts(const Stats& s) const;
  // The statistics of the new labels become the current ones (no randomness: the sweep drew).
  void draw(std::uint64_t sweep, const Stats& s);

  // A recorded draw: counts N_k (K) and sums sum_{z_n = k} x_n (K x D).
  std::vector<Part> layout() const;
  std::vector<double> draw_state() const;
  // log sum_k (N_k + alpha0) / (N + K alpha0) St_k(x_i): the posterior predictive of rows x
  // given the current statistics (Bishop 2006, eq. 10.81 with the counts of Bruno 2022, eq. 2.37).
  void log_density(const gmm::RowMatrix& x, std::span<double> out) const;

  void save(engine::StateWriter& w) const;  // the summed statistics
  void load(const engine::StateReader& r);
  std::vector<engine::LocalState> local_states();  // the labels (as doubles)

  std::vector<std::int64_t> labels() const;

 private:
  void sweep_block(std::uint64_t sweep, std::int64_t r0, std::int64_t r1,
                   std::vector<CollapsedComponent>& comp);
  void set_stats(const gmm::Stats& s);

  gmm::Model& model_;
  const gmm::RowMatrix& x_;
  std::int64_t first_row_, n_rows_, block_rows_;
  std::vector<int> exponents_;
  std::uint64_t seed_;
  std::vector<double> labels_;  // this rank's rows' labels (doubles: the checkpoint's row state)
  std::vector<double> stats_;   // the current summed statistics (gmm::Stats::buffer())
  std::vector<CollapsedComponent> comp_;
  double logdet_w0_inv_ = 0;
};

}  // namespace caviar::gmm_gibbs
