#pragma once
// The posterior predictive of a Bayesian GLM under a fitted q(theta), by Monte Carlo over S draws
// theta_s ~ q (Bishop 2006, eq. 4.145 ff. for the logistic case): per row x with
// eta_s = W_s^T x + b_s,
//   logistic  P(y = 1 | x) ~ (1/S) sum_s sigmoid(eta_s)
//   softmax   P(y = c | x) ~ (1/S) sum_s softmax(eta_s)_c
//   linear    E[y | x] ~ (1/S) sum_s eta_s,        sd = sqrt(Var_s(eta_s) + sigma^2)
//   poisson   E[y | x] ~ (1/S) sum_s e^eta_s,      sd = sqrt(E[y | x] + Var_s(e^eta_s))
// (the sds by the laws of total expectation and variance), and, given the responses, the log
// predictive density log (1/S) sum_s p(y | x, theta_s), by log-sum-exp. No MPI, no files.
#include <Eigen/Dense>
#include <span>

#include "models/bbvi/estimator.hpp"
#include "models/bbvi/glm.hpp"

namespace caviar::bbvi {

struct Prediction {
  RowMatrix mean;               // n x C (softmax: class probabilities) or n x 1
  Eigen::VectorXd sd;           // n: linear and poisson only (else empty)
  Eigen::VectorXd log_density;  // n: only with responses
};

// theta: S x P draws (row-major, as Family::draw writes them); x: n x D row-major; y: n
// responses or empty.
Prediction predict(const Glm& glm, const RowMatrix& theta, std::span<const double> x,
                   std::span<const double> y);

}  // namespace caviar::bbvi
