#pragma once
// The conditional draws of the blocked (uncollapsed) Gibbs sampler of the Bayesian Gaussian
// mixture (Bishop 2006, section 10.2 model; Bruno 2022, eqs. 2.20-2.31): given the labels, the
// weights and the components' (mu_k, Lambda_k) are independent, with the conjugate posteriors
//
//   pi | z                ~ Dirichlet(alpha_k)                     alpha_k = alpha0 + N_k
//   Lambda_k | z, X       ~ Wishart(nu_k, W_k)                     (Bishop 2006, eqs. 10.58-10.63,
//   mu_k | Lambda_k, z, X ~ N(m_k, (beta_k Lambda_k)^-1)            with hard counts)
//
// whose parameters are those of the variational update with one-hot responsibilities
// (gmm::Posterior). Every draw is a pure function of (seed, sweep, component), never of the rank
// or thread that computes it. No MPI, no files.
#include <Eigen/Dense>
#include <cstdint>
#include <span>
#include <vector>

#include "models/gmm/gmm.hpp"

namespace caviar::gmm_gibbs {

// One draw of the mixture's parameters.
struct Params {
  Eigen::VectorXd weights;                 // K
  gmm::RowMatrix means;                    // K x D
  std::vector<Eigen::MatrixXd> precision;  // K of D x D (diagonal covariance: D x 1)
};

// Gamma(alpha_k) draws normalised: pi ~ Dirichlet(alpha).
Eigen::VectorXd draw_dirichlet(const Eigen::VectorXd& alpha, std::uint64_t seed,
                               std::uint64_t sweep);

// Bartlett's decomposition of a Wishart draw (Smith & Hocking 1972): A lower triangular
// (D x D) with A_ii^2 ~ chi^2(nu - i) and A_ij ~ N(0, 1) below the diagonal. If R is the
// Cholesky factor of W^-1 = R R^T, then Lambda = C C^T with C = R^-T A is a Wishart(nu, W) draw,
// and (beta Lambda)^-1 has the square root C^-T / sqrt(beta) = R A^-T / sqrt(beta): neither
// needs an inverse. `key` indexes the draw.
Eigen::MatrixXd draw_bartlett(double nu, int dim, std::uint64_t seed, std::uint64_t key);

// (pi, mu_k, Lambda_k) from the posterior `post` (full or diagonal covariance, Dirichlet
// weights), the draw of `sweep`.
Params draw_params(const gmm::Posterior& post, gmm::Covariance cov, std::uint64_t seed,
                   std::uint64_t sweep);

// The per-component constants of the labels' conditional under one draw of the parameters
// (Cholesky factors of Lambda_k, log pi_k + log det(Lambda_k) / 2 - D log(2 pi) / 2), computed
// once per sweep and shared by every block of rows and thread. `p` must outlive the kernel.
class LabelKernel {
 public:
  LabelKernel(const Params& p, gmm::Covariance cov);
  // draw_labels over rows x (global rows first_row, first_row + 1, ...).
  void draw(const Eigen::Ref<const gmm::RowMatrix>& x, std::int64_t first_row, std::uint64_t seed,
            std::uint64_t sweep, std::span<std::int64_t> labels, std::span<double> terms) const;
  // out[i] = log sum_k pi_k N(x_i | mu_k, Lambda_k^-1): the density of row i under this draw.
  void log_density(const Eigen::Ref<const gmm::RowMatrix>& x, std::span<double> out) const;

 private:
  // logp[i K + k] = log(pi_k N(x_i | mu_k, Lambda_k^-1)) for the rows i < m <= kGroup of x from
  // row i0; scratch is reused between calls.
  static constexpr Eigen::Index kGroup = 16;
  void log_joint(const Eigen::Ref<const gmm::RowMatrix>& x, Eigen::Index i0, Eigen::Index m,
                 std::vector<double>& scratch, double* logp) const;
  // Calls row(i, logp, mx, total) for every row i of x, with logp its K terms above, mx their
  // maximum and total = sum_k exp(logp_k - mx).
  template <class Row>
  void for_rows(const Eigen::Ref<const gmm::RowMatrix>& x, Row&& row) const;
  const Params& p_;
  bool diag_;
  std::vector<Eigen::MatrixXd> chol_;
  Eigen::VectorXd offset_;
};

// The labels' full conditional given the parameters (Bruno 2022, eq. 2.21):
//   p(z_n = k | x_n, pi, mu, Lambda) proportional to pi_k N(x_n | mu_k, Lambda_k^-1),
// independent over rows. The rows x are global rows [first_row, first_row + x.rows()); row n's
// label is drawn by inverting its conditional's CDF at a uniform keyed by (seed, sweep, n), so
// it does not depend on how the rows are split. Writes labels[i] and terms[i] = log(pi_z
// N(x_n | mu_z, Lambda_z^-1)), the row's term of the log joint density.
void draw_labels(const Params& p, gmm::Covariance cov, const gmm::RowMatrix& x,
                 std::int64_t first_row, std::uint64_t seed, std::uint64_t sweep,
                 std::span<std::int64_t> labels, std::span<double> terms);

}  // namespace caviar::gmm_gibbs
