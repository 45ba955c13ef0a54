#pragma once
// The blocked (uncollapsed) Gibbs sampler of the Bayesian Gaussian mixture (Bruno 2022, eqs.
// 2.20-2.31; Bishop 2006, section 10.2 model) as a model of the engine's sampler driver
// (engine/sampler.hpp). One sweep t:
//
//   local step   z_n | pi, mu, Lambda for the rank's rows (draws.hpp's LabelKernel, in parallel
//                over 256-row blocks), and the one-hot statistics N_k, Sx_k, Sxx_k of the new
//                labels, summed exactly (gmm::Stats in exact mode), so the sum is the same bits
//                for any split of rows over ranks and threads
//   [driver: the statistics are reduced over ranks]
//   draw         pi, (mu_k, Lambda_k) | z, X from the conjugate posterior of the summed
//                statistics (gmm::Model::update with hard counts, then draw_params)
//
// Every draw is keyed by (seed, sweep, component or global row), so the chain's state is the
// current parameters alone: saving them (as doubles) and resuming gives the same bits. The
// labels of the last sweep are kept for --labels. No MPI, no files.
#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "engine/reduce.hpp"
#include "engine/state.hpp"
#include "models/gmm/batch.hpp"
#include "models/gmm/gmm.hpp"
#include "models/gmm_gibbs/draws.hpp"

namespace caviar::gmm_gibbs {

// log p(pi) + sum_k log p(mu_k, Lambda_k) under the prior of the model (Bishop 2006, eqs. 10.39
// and 10.40; the densities of B.16, B.37 and B.78): the parameters' part of the log joint.
double log_prior_density(const gmm::Prior& prior, gmm::Covariance cov, const Params& p);

// Adds the one-hot statistics of rows x with labels (integers, of any arithmetic type) to s, a
// slice of whole 256-row blocks at a time (no N x K matrix is held): the statistics the samplers'
// parameters are conditioned on.
template <class Label>
void accumulate_one_hot(const gmm::Model& model, const gmm::RowMatrix& x,
                        const std::vector<Label>& labels, gmm::Stats& s) {
  const int k_n = model.n_components();
  constexpr Eigen::Index kSlice = 32 * 256;
  for (Eigen::Index r0 = 0; r0 < x.rows(); r0 += kSlice) {
    const Eigen::Index n = std::min(kSlice, x.rows() - r0);
    gmm::RowMatrix r = gmm::RowMatrix::Zero(n, k_n);
    for (Eigen::Index i = 0; i < n; ++i)
      r(i, static_cast<Eigen::Index>(labels[static_cast<std::size_t>(r0 + i)])) = 1.0;
    model.accumulate(x.middleRows(r0, n), r, s);
  }
}

class BlockedSampler {
 public:
  using Stats = gmm::SummedStats;
  using Part = engine::DrawPart;

  // model: the variational mixture whose prior and shift the sampler uses (its update() gives
  // the conditional posterior of the parameters); x: this rank's rows, global rows
  // [first_row, first_row + x.rows()) of n_rows; exponents: the grid of exact sums
  // (gmm::Model::exact_exponents).
  BlockedSampler(gmm::Model& model, const gmm::RowMatrix& x, std::int64_t first_row,
                 std::int64_t n_rows, std::vector<int> exponents, std::uint64_t seed);

  Stats make_stats() const;
  std::int64_t n_local_rows() const { return x_.rows(); }
  // Labels of this rank's rows given the current parameters (Bruno 2022, eq. 2.21), their
  // one-hot statistics into s, and terms[i] = log(pi_z N(x_i | mu_z, Lambda_z^-1)).
  void local_step(std::uint64_t sweep, Stats& s, std::span<double> terms);
  // The log prior density of the current parameters.
  double global_log_density() const;
  std::vector<double> counts(const Stats& s) const;  // N_k, K
  // The parameters of `sweep` from their conditional given the summed statistics s (Bruno
  // 2022, eqs. 2.22-2.31); sweep 0 draws the start from the initial statistics.
  void draw(std::uint64_t sweep, const Stats& s);
  void draw(std::uint64_t sweep, const gmm::Stats& s);

  // A recorded draw: weights (K), means (K x D), covariances Lambda_k^-1 (K x D x D, or K x D
  // diagonal), concatenated in the order of layout().
  std::vector<Part> layout() const;
  std::vector<double> draw_state() const;
  // log sum_k pi_k N(x_i | mu_k, Lambda_k^-1) of rows x under the current parameters.
  void log_density(const gmm::RowMatrix& x, std::span<double> out) const;

  void save(engine::StateWriter& w) const;
  void load(const engine::StateReader& r);

  const Params& params() const { return params_; }
  const std::vector<std::int64_t>& labels() const { return labels_; }

 private:
  gmm::Model& model_;
  const gmm::RowMatrix& x_;
  std::int64_t first_row_, n_rows_;
  std::vector<int> exponents_;
  std::uint64_t seed_;
  Params params_;
  std::vector<std::int64_t> labels_;
};

}  // namespace caviar::gmm_gibbs
