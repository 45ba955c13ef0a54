#pragma once
// Variational Bayesian Gaussian mixture (Bishop 2006, section 10.2, eqs 10.46-10.82).
//
//   pi ~ Dir(alpha0),  (mu_k, Lambda_k) ~ N(m0, (beta0 Lambda_k)^-1) W(W0, nu0),
//   z_n ~ Cat(pi),     x_n | z_n = k ~ N(mu_k, Lambda_k^-1).
//
// Weight priors: a symmetric Dirichlet(alpha0), or the truncated stick-breaking (Dirichlet-process)
// prior of Blei & Jordan (2006): v_k ~ Beta(1, alpha0), pi_k = v_k prod_{j<k} (1 - v_j), with
// q(v_k) = Beta(a_k, b_k) for k = 1..K (as scikit-learn's "dirichlet_process": the K-th stick
// keeps its Beta factor, the mass beyond K is dropped and the expected weights renormalised).
//
// The same class also runs maximum likelihood (EM, Estimator::kMaximumLikelihood): then the
// "posterior" is a point estimate (weights, means, covariances), the E-step uses ln pi_k +
// ln N(x | mu_k, Sigma_k), and the objective is the log-likelihood. The E-step and the
// statistics are shared; only update() and the objective differ.
//
// Full covariance uses a D-dimensional Wishart; diagonal covariance gives each dimension its own
// 1-D Wishart (a Gamma) sharing beta_k and nu_k, so the diagonal model is exactly conjugate.
// Tied covariance shares one D-dimensional Wishart Lambda among the components, with
// mu_k | Lambda ~ N(m0, (beta0 Lambda)^-1): its exact posterior is q(Lambda) = W(W, nu0 + N), the
// scatter of every component pooled (Bishop 2006, eqs 10.59-10.63 summed over k; the factor
// |Lambda|^(1/2) of each mean's prior cancels against its posterior). Spherical covariance gives
// component k one precision lambda_k I, lambda_k ~ W_1(W0, nu0) (a Gamma), mu_k | lambda_k ~
// N(m0, (beta0 lambda_k)^-1 I): a point brings D dimensions of evidence, so nu_k = nu0 + D N_k and
// W_k^-1 sums the diagonal scatter over dimensions. Both are exact conjugate models; they are not
// scikit-learn's tied and spherical updates, which are heuristics (docs/architecture.md).
//
// Storage: tied holds K equal copies of the shared W^-1, nu and Cholesky factor, and uses the
// full model's statistics and E-step; spherical holds each W_k^-1 (and the prior's W0^-1) as a
// D x 1 vector of equal entries and uses the diagonal model's statistics and E-step. Only update(),
// the ELBO's Wishart terms, the predictive density and natural_inner() differ.
//
// The model knows nothing of MPI or files. A step is:
//   local_step(shard)    -> Stats  (E-step over local rows; OpenMP inside)
//   [driver: Stats are summed over ranks in one allreduce]
//   update(stats)        -> new Posterior (M-step, identical on every rank)
//   elbo(stats)          -> the full bound (Bishop 10.70-10.77, every constant)
//
// All second moments are taken about a fixed shift c (the global data mean): this keeps the raw
// moment sums well conditioned when the data sit far from the origin.
#include <Eigen/Cholesky>
#include <Eigen/Core>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>
#include "core/exact_sum.hpp"

namespace caviar::gmm {

using RowMatrix = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

enum class Covariance { kFull, kDiag, kTied, kSpherical };
Covariance parse_covariance(const std::string& s);
std::string to_string(Covariance c);
// Whether the statistics and the E-step are the full model's (full, tied) or the diagonal
// model's (diag, spherical).
inline bool full_moments(Covariance c) {
  return c == Covariance::kFull || c == Covariance::kTied;
}

enum class WeightPrior { kDirichlet, kStickBreaking };
WeightPrior parse_weight_prior(const std::string& s);
std::string to_string(WeightPrior w);

enum class Estimator { kVariational, kMaximumLikelihood };

// The arithmetic of the full-covariance E-step's distances (x - m_k)^T W_k (x - m_k): double, or
// float32 products with double sums (--precision single; docs/performance.md measures it, see
// Model::log_rho). Everything else is double either way.
enum class Precision { kDouble, kSingle };
Precision parse_precision(const std::string& s);
std::string to_string(Precision p);

struct Prior {
  WeightPrior weights = WeightPrior::kDirichlet;
  double alpha0 = 0;       // Dirichlet concentration per component, or the DP concentration
  double beta0 = 1;        // precision scaling of the mean
  double nu0 = 0;          // Wishart degrees of freedom
  Eigen::VectorXd m0;      // D
  Eigen::MatrixXd W0_inv;  // inverse Wishart scale: full, tied D x D; diag D x 1 (the diagonal);
                           // spherical D x 1, every entry the scalar W0^-1
};

// Default priors: alpha0 = 1/K, beta0 = 1, m0 = 0, W0 = I, nu0 = D.
Prior default_prior(Covariance cov, int dim, int n_components);

// q(pi) q(mu, Lambda): Bishop (10.57)-(10.63). The Wishart scale is held as W_k^-1, the form
// the update produces (and the natural parameter SVI interpolates); W_k itself is derived.
struct Posterior {
  Eigen::VectorXd alpha;               // K, Dirichlet weights (empty with stick-breaking)
  Eigen::VectorXd stick_a, stick_b;    // K each, q(v_k) = Beta(a_k, b_k) (stick-breaking only)
  Eigen::VectorXd beta, nu;            // K
  RowMatrix m;                         // K x D
  std::vector<Eigen::MatrixXd> W_inv;  // K of (D x D) full and tied (equal copies), or (D x 1)
                                       // diag and spherical (equal entries)
};

// Maximum-likelihood parameters (EM): sklearn GaussianMixture's weights_, means_, covariances_.
struct MlParams {
  Eigen::VectorXd weights;                   // K
  RowMatrix means;                           // K x D
  std::vector<Eigen::MatrixXd> covariances;  // as Posterior::W_inv
};

class Model;

namespace detail {
struct PassScratch;  // the per-thread sums and scratch of Model's passes (gmm.cpp)
// Owns a PassScratch kept from one pass to the next; copies start without one (it holds no
// value, only zeroed sums and workspace).
class ScratchSlot {
 public:
  ScratchSlot();
  ~ScratchSlot();
  ScratchSlot(const ScratchSlot&);
  ScratchSlot& operator=(const ScratchSlot&);
  ScratchSlot(ScratchSlot&&) noexcept;
  ScratchSlot& operator=(ScratchSlot&&) noexcept;
  PassScratch& get();
  void reset();

 private:
  std::unique_ptr<PassScratch> p_;
};
}  // namespace detail

// The sufficient statistics of one step, one contiguous buffer (so one allreduce moves them).
//   N_k = sum_n r_nk; Sx_k = sum_n r_nk (x_n - c); Sxx_k = sum_n r_nk (x_n - c)(x_n - c)^T, packed
//   upper triangle (full) or diagonal (diag); log_norm = sum_n log sum_k rho_nk; rows = n.
// Layout: one row per component, [N_k, Sx_k (D), Sxx_k (M)], then log_norm and rows. A block's
// rows are then exactly R^T [1, x - c, (x - c)(x - c)^T] (one GEMM; see Model::local_step).
//
// Exact mode (make_exact, the drivers' default): local_step and accumulate add each 256-row
// block's statistics into an ExactSum (core/exact_sum.hpp) on a grid fixed by data bounds, and
// keep the blocks' log-normalisers apart (their bound is known only after the pass), instead of
// summing doubles into buffer(). The driver reduces both over ranks and calls load_exact, which
// writes buffer(). Integer sums are associative, so the result is the same bits however the
// blocks were split over threads and ranks (docs/reproducibility.md). Without make_exact, blocks
// are summed in double in thread order (--fast-reduce): the last bits then depend on the
// thread/rank counts.
class Stats {
 public:
  Stats(int dim, int n_components, Covariance cov);
  std::span<double> buffer() { return buf_; }
  std::span<const double> buffer() const { return buf_; }
  void set_zero();
  Stats& operator+=(const Stats& o);
  Stats& operator*=(double a);
  // this = (1 - rho) this + rho o: the SVI step in statistic coordinates (Hoffman et al. 2013;
  // Bruno 2022, eq. 2.50).
  void interpolate(const Stats& o, double rho);

  int dim() const { return dim_; }
  int n_components() const { return k_; }
  std::size_t moment_size() const { return moment_size_; }  // per component
  std::size_t row_size() const { return 1 + dim_ + moment_size_; }
  double& n(int k) { return buf_[k * row_size()]; }
  double n(int k) const { return buf_[k * row_size()]; }
  double* sx(int k) { return buf_.data() + k * row_size() + 1; }
  const double* sx(int k) const { return buf_.data() + k * row_size() + 1; }
  double* sxx(int k) { return buf_.data() + k * row_size() + 1 + dim_; }
  const double* sxx(int k) const { return buf_.data() + k * row_size() + 1 + dim_; }
  double& log_norm() { return buf_[buf_.size() - 2]; }
  double log_norm() const { return buf_[buf_.size() - 2]; }
  double& rows() { return buf_.back(); }
  double rows() const { return buf_.back(); }

  // Full covariance: unpack component k's Sxx into a symmetric D x D matrix.
  Eigen::MatrixXd sxx_matrix(int k) const;

  // Exact mode; exponents[i] bounds entry i of buffer() (Model::exact_exponents).
  void make_exact(std::vector<int> exponents);
  bool exact() const { return exact_.has_value(); }
  struct ExactPart {
    ExactSum sum;                         // every entry but log_norm
    std::vector<double> block_log_norms;  // one per block, in any order
    std::vector<Int128> wire;             // the driver's reduction buffer, reused between passes
  };
  ExactPart& exact_part() { return *exact_; }
  const ExactPart& exact_part() const { return *exact_; }
  // buffer() = the exact sums, with the given log_norm.
  void load_exact(double log_norm);
  // Completes an exact pass: sums the blocks' log-normalisers on a grid fixed by
  // max_blocks x the largest |block log-normaliser| (max_blocks = blocks of n_rows rows), adds
  // them and the statistics over the contributors, and load_exact()s the totals. `max` and `sum`
  // combine a double and the Int128 sums over every contributor (the driver passes MPI
  // reductions). A non-finite block log-normaliser (a broken posterior) leaves log_norm NaN for
  // the caller's check.
  struct Combine {
    std::function<double(double)> max;
    std::function<void(std::span<Int128>)> sum;
  };
  void finish_exact(std::int64_t n_rows, const Combine& combine);
  void finish_exact(std::int64_t n_rows);  // one process holds every block

  // For Model's passes (local_step, accumulate): per-thread partial sums and workspace, kept with
  // the statistics they feed so that repeated passes reuse them. (Fresh megabytes per pass cost a
  // page fault per 4 KB when first touched: at D = 192 that was ~70 ms a pass per thread on this
  // project's VM, more than the exact adds themselves.) Between passes its sums are zero.
  detail::PassScratch& pass_scratch() { return scratch_.get(); }

 private:
  int dim_, k_;
  [[maybe_unused]] Covariance cov_;  // stored, never read (clang: -Wunused-private-field)
  std::size_t moment_size_;
  std::vector<double> buf_;
  std::optional<ExactPart> exact_;
  detail::ScratchSlot scratch_;
};

class Model {
 public:
  Model(Covariance cov, int n_components, Prior prior, Eigen::VectorXd shift,
        Estimator est = Estimator::kVariational, double reg_covar = 0.0);

  Covariance covariance() const { return cov_; }
  int dim() const { return static_cast<int>(shift_.size()); }
  int n_components() const { return k_; }
  Estimator estimator() const { return est_; }
  double reg_covar() const { return reg_covar_; }
  const Prior& prior() const { return prior_; }
  const Posterior& posterior() const { return post_; }
  const Eigen::VectorXd& shift() const { return shift_; }
  Stats make_stats() const { return Stats(dim(), n_components(), cov_); }
  // Throws caviar::Error for kSingle with diagonal covariance (whose E-step has no products).
  void set_precision(Precision p);
  Precision precision() const { return precision_; }

  // The grid of exact statistic sums over at most n_rows rows whose centred values are bounded,
  // |x_nj - c_j| <= max_abs_j: |N_k| <= n, |Sx_kj| <= n a_j, |Sxx_kij| <= n a_i a_j, each with a
  // factor 2 for the rounding of the block sums (and of r_nk <= 1). Every rank computes the same.
  std::vector<int> exact_exponents(double n_rows, const Eigen::VectorXd& max_abs) const;

  // Accumulates the statistics of given responsibilities (rows of resp sum to 1) into stats.
  // Rows are taken in blocks of kBlockRows from row 0 of x: for sums that do not depend on the
  // rank count, x must start at a global block boundary (as shards and stream chunks do).
  void accumulate(const RowMatrix& x, const RowMatrix& resp, Stats& stats) const;

  // E-step over local rows: responsibilities from the current posterior (Bishop 2006, eq. 10.67,
  // in log space), their statistics added into stats (blocks as in accumulate). If resp_out is
  // given it receives r (n x K).
  void local_step(const RowMatrix& x, Stats& stats, RowMatrix* resp_out = nullptr) const;

  // M-step from summed statistics (Bishop 10.58, 10.60-10.63, in natural-parameter form), or
  // the maximum-likelihood M-step for EM (Bishop 9.24-9.26 with reg_covar added to Sigma_k).
  // The variational posterior is an affine function of the statistics, so SVI's natural-gradient
  // step on lambda is the same step on the statistics fed to update (Hoffman et al. 2013; Bruno
  // 2022, eqs 2.50 and 2.53).
  // Throws caviar::Error if a component's scale or covariance is not positive definite.
  void update(const Stats& stats);

  // <g, h> of two directions given as statistic differences, measured in the natural parameters
  // of q(pi) q(mu, Lambda) they induce: the inner product of the adaptive learning rate
  // (Ranganath et al. 2013; Bruno 2022, eqs 2.55-2.57). log_norm and rows are not natural
  // parameters and are ignored.
  double natural_inner(const Stats& g, const Stats& h) const;

  // Replaces the posterior (e.g. read from a model file) and recomputes the cached expectations.
  void set_posterior(Posterior post);
  // EM: replaces the point estimate.
  void set_ml_params(MlParams p);
  const MlParams& ml_params() const { return ml_; }

  // The objective the driver tracks: the ELBO (variational) or the log-likelihood
  // sum_n ln sum_k pi_k N(x_n | mu_k, Sigma_k) (EM), from local_step statistics.
  double objective(const Stats& stats) const;

  // The ELBO of the current posterior with the optimal responsibilities. stats must come from
  // local_step under this posterior (their log_norm is the data term): Bishop (10.70)-(10.77).
  double elbo(const Stats& stats) const;

  // Sum over rows of the log posterior predictive density, a Student-t mixture (Bishop 2006,
  // eq. 10.81); for EM the log-likelihood of the rows. Appends one partial sum per kBlockRows block
  // of x to `blocks` (for an order-independent total) and returns their sum in block order.
  double log_predictive_sum(const RowMatrix& x, std::vector<double>* blocks = nullptr) const;

  // Expected weights E[pi_k] (stick-breaking: renormalised over the K components, as
  // scikit-learn), means m_k, and covariances (E[Lambda_k])^-1 = W_k^-1 / nu_k (the convention
  // of scikit-learn's BayesianGaussianMixture.covariances_). EM: the point estimates.
  Eigen::VectorXd weights() const;
  RowMatrix means() const;
  std::vector<Eigen::MatrixXd> covariances() const;
  // EM: sklearn's precisions_cholesky_ (full: upper P_k with P_k P_k^T = Sigma_k^-1; diag: D x 1
  // of 1/sigma_kd).
  std::vector<Eigen::MatrixXd> precisions_cholesky() const;
  // W_k = P_k P_k^T, from the Cholesky factor (no inverse of W_k^-1 is formed).
  std::vector<Eigen::MatrixXd> scale_matrices() const;

 private:
  void refresh();         // recompute the cached expectations below from post_
  void refresh_ml();      // the same from ml_
  void refresh_kernel();  // prec_all_, offset_all_, theta_ from prec_chol_ and m_shifted_
  void update_ml(const Stats& stats);
  double weight_kl_terms() const;  // E[ln p(pi)] - E[ln q(pi)] (or of the sticks v)
  // ln rho_nk (Bishop 2006, eq. 10.46 with 10.64-10.66) of one block of centred rows, given as
  // xc = x - c (n x D) and transposed (xt, D x n), into out (K x n); y is scratch (with theta_:
  // the block's point-major features on return).
  void log_rho(const RowMatrix& xc, const RowMatrix& xt, RowMatrix& y, RowMatrix& out) const;

  Covariance cov_;
  int k_;
  Prior prior_;
  Eigen::VectorXd shift_;
  Estimator est_;
  double reg_covar_;
  Posterior post_;
  MlParams ml_;
  // Cached from post_ by refresh() (or from ml_ by refresh_ml()):
  //   ln rho_nk = log_rho_base_k - quad_scale_k / 2 ||(x_n - m_k)^T P_k||^2.
  Eigen::VectorXd log_rho_base_;            // per-component constant of ln rho_nk
  Eigen::VectorXd quad_scale_;              // nu_k (variational) or 1 (EM)
  Eigen::VectorXd e_log_pi_;                // E[ln pi_k], Bishop 2006 eq. 10.65 (EM: ln pi_k)
  Eigen::VectorXd e_logdet_;                // E[ln |Lambda_k|], Bishop 2006 eq. 10.66
  Eigen::VectorXd logdet_w_;                // ln |W_k|
  std::vector<Eigen::MatrixXd> prec_chol_;  // full: upper P_k = L_k^-T with P_k P_k^T = W_k
                                            // (EM: = Sigma_k^-1)
  RowMatrix w_diag_;                        // diag: W_kd (K x D) (EM: 1/sigma_kd^2)
  RowMatrix m_shifted_;                     // m_k - c (K x D)
  // Full: [P_1 ... P_K] (D x KD) and [(m_1 - c)^T P_1 ... ] (1 x KD), so that one GEMM of a block
  // of rows gives every (x_n - m_k)^T P_k at once.
  Eigen::MatrixXd prec_all_;
  Eigen::RowVectorXd offset_all_;
  // Full, 4 < D <= 32, double: ln rho_nk = Theta_k . [1, x - c, packed (x - c)(x - c)^T], one row
  // per component (K x (1 + D + D(D+1)/2)); empty where the lines above are used instead.
  RowMatrix theta_;
  Precision precision_ = Precision::kDouble;
  std::vector<Eigen::MatrixXf> prec_chol_t_f_;  // kSingle: P_k^T (lower triangular) in float
};

}  // namespace caviar::gmm
