#pragma once
// Monte Carlo estimators of the ELBO's gradient in the variational parameters lambda, from S
// draws of q that every rank shares (black-box VI; Ranganath, Gerrish & Blei 2014; Kingma &
// Welling 2014; Titsias & Lazaro-Gredilla 2014):
//
//   score     (1/S) sum_s h_s (f_s - log q(theta_s)),  h_s = d log q(theta_s | lambda) / d lambda
//             (Ranganath et al. 2014, eq. 3; Bruno 2022, eq. 2.64)
//   score-cv  the same with the control variate h_s: for each component m,
//             (1/S) sum_s h_ms (f_s - log q(theta_s)) - a_m (1/S) sum_s h_ms,
//             a_m = Cov(h_m w, h_m) / Var(h_m) (Ranganath et al. 2014, section 3.2; Bruno
//             2022, eqs. 2.69-2.70), estimated for each draw from the other S - 1 draws, so
//             that the estimate stays unbiased (needs S >= 3; with fewer it is the score)
//   reparam   (1/S) sum_s (d theta / d lambda)^T grad f(theta_s) + d entropy / d lambda
//             (Kingma & Welling 2014; Kucukelbir et al. 2017, eq. 8; Bruno 2022, eq. 2.73)
//
// where f(theta) = log p(y, theta | X) is the (minibatch-scaled) log joint. The draws are a pure
// function of (seed, step, draw), so every rank holds the same ones.
#include <Eigen/Dense>
#include <cstdint>
#include <span>
#include <string>

#include "core/rng.hpp"
#include "models/bbvi/family.hpp"

namespace caviar::bbvi {

enum class Estimator { kScore, kScoreCv, kReparam };

Estimator parse_estimator(const std::string& s);  // score | score-cv | reparam
std::string to_string(Estimator e);

using RowMatrix = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// One step's draws and what the log joint says of them, summed over every rank's rows.
struct Draws {
  RowMatrix eps;         // S x n_noise
  RowMatrix theta;       // S x P: r(eps_s, lambda)
  Eigen::VectorXd f;     // S: log joint at theta_s
  RowMatrix grad_theta;  // S x P: its gradient (reparam only)
};

// eps for `step`: standard normals keyed by (seed, stream, step, draw, component).
RowMatrix draw_noise(std::uint64_t seed, std::uint64_t step, int samples, int n_noise,
                     Stream stream = Stream::kBbviNoise);

// grad := the estimate of d ELBO / d lambda. Returns the ELBO estimate mean_s f_s + entropy.
double elbo_gradient(Estimator e, const Family& q, std::span<const double> lambda, const Draws& d,
                     std::span<double> grad);

}  // namespace caviar::bbvi
