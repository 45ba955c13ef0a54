#pragma once
// Gaussian variational families q(theta | lambda) over P parameters, for black-box VI: each
// draws by reparameterisation, theta = r(eps, lambda) with eps standard normal, and gives
// log q, its score in lambda, the entropy and the chain rule through r.
//
//   mean-field  lambda = (mu, omega)           Sigma = diag(exp(2 omega))   (Bruno 2022, eq. 2.74)
//               theta = mu + exp(omega) * eps, eps in R^P
//   full rank   lambda = (mu, L)               Sigma = L L^T                (Bruno 2022, eq. 2.75)
//               L lower triangular, stored row by row, its diagonal as log L_ii so that it stays
//               positive (Kucukelbir et al. 2017, section 2.5); theta = mu + L eps, eps in R^P
//   low rank    lambda = (mu, B, log c)        Sigma = B B^T + diag(c^2)    (Bruno 2022, eq. 2.76;
//               B is P x r, row-major          Ong, Nott & Smith 2018)
//               theta = mu + B z + c * e, (z, e) in R^(r + P)
// The low-rank family never forms a P x P matrix: Sigma^-1 and log det Sigma go through the
// Woodbury identity and the matrix determinant lemma with an r x r Cholesky factor.
#include <Eigen/Dense>
#include <cstdint>
#include <span>
#include <string>

namespace caviar::bbvi {

enum class FamilyKind { kMeanField, kFullRank, kLowRank };

FamilyKind parse_family(const std::string& s);  // meanfield | fullrank | lowrank
std::string to_string(FamilyKind f);

class Family {
 public:
  Family(FamilyKind kind, int dim, int rank = 0);

  FamilyKind kind() const { return kind_; }
  int dim() const { return p_; }
  int rank() const { return r_; }
  std::int64_t n_params() const;  // size of lambda
  int n_noise() const;            // size of eps

  // mu = 0 and marginal standard deviations init_sd. The low-rank factor B cannot start at 0
  // (there the score gradient in B vanishes identically), so it starts from small values drawn
  // from (seed) that depend on nothing else.
  void init(std::span<double> lambda, double init_sd, std::uint64_t seed) const;

  // theta = r(eps, lambda) for S draws at once: eps holds S rows of n_noise() values, theta S
  // rows of dim(), row-major.
  void draw(std::span<const double> lambda, std::span<const double> eps,
            std::span<double> theta) const;
  double log_q(std::span<const double> lambda, std::span<const double> theta) const;
  double entropy(std::span<const double> lambda) const;

  // grad += d log q(theta | lambda) / d lambda at fixed theta (the score, for the score-function
  // estimator).
  void add_score(std::span<const double> lambda, std::span<const double> theta,
                 std::span<double> grad) const;
  // grad += d entropy / d lambda.
  void add_entropy_grad(std::span<const double> lambda, std::span<double> grad) const;
  // grad += sum_s (d r(eps_s, lambda) / d lambda)^T g_s: the chain rule of the
  // reparameterisation, summed over S draws (eps and g_theta: S rows each, as in draw).
  void add_reparam_grad(std::span<const double> lambda, std::span<const double> eps,
                        std::span<const double> g_theta, std::span<double> grad) const;

  Eigen::VectorXd mean(std::span<const double> lambda) const;
  Eigen::VectorXd marginal_sd(std::span<const double> lambda) const;
  Eigen::MatrixXd covariance(std::span<const double> lambda) const;  // P x P: for small P only

 private:
  FamilyKind kind_;
  int p_, r_;
};

}  // namespace caviar::bbvi
