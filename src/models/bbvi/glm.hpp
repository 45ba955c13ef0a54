#pragma once
// The log joint of a Bayesian generalised linear model over a block of rows, and its gradient:
// the model half of black-box variational inference (Ranganath, Gerrish & Blei 2014). No MPI and
// no files: the engine sums the blocks over ranks.
//
//   p(theta, y | X) = N(theta | 0, s0^2 I) prod_n p(y_n | eta_n),   eta_n = W^T x_n + b
//
// with theta = (W, b) holding one column of weights and one intercept per output:
//   logistic  y in {0, 1}      log p = y eta - log(1 + e^eta)            (Bruno 2022, eq. 2.59)
//   linear    y real           log p = log N(y | eta, sigma^2), sigma known (conjugate)
//   poisson   y in {0, 1, ...} log p = y eta - e^eta - log y!
//   softmax   y in {0..C-1}    log p = eta_y - log sum_c e^eta_c         (multinomial logistic)
// Every likelihood is evaluated in a form that cannot overflow (softplus, log-sum-exp).
#include <cstdint>
#include <span>
#include <string>

namespace caviar::bbvi {

enum class Likelihood { kLogistic, kLinear, kPoisson, kSoftmax };

// logistic | linear | poisson | softmax; `option` names the flag in the error message.
Likelihood parse_likelihood(const std::string& s, const std::string& option = "--model");
std::string to_string(Likelihood l);

struct Glm {
  Likelihood likelihood = Likelihood::kLogistic;
  int features = 0;          // D: columns of X
  int classes = 2;           // C: softmax only
  double noise_sd = 1.0;     // sigma: linear only
  double prior_scale = 1.0;  // s0

  // Outputs per row: C for softmax, 1 otherwise.
  int outputs() const { return likelihood == Likelihood::kSoftmax ? classes : 1; }
  // Parameters: (D + 1) per output, laid out output by output as [w_1..w_D, b].
  std::int64_t n_params() const { return std::int64_t{features + 1} * outputs(); }

  // Sum over the rows of log p(y_n | x_n, theta); adds its gradient in theta to `grad`.
  // x: n x D row-major; y: n responses. Rows are taken in order, so the result depends only on
  // the block, never on the thread that computes it.
  double loglik(std::span<const double> theta, std::span<const double> x, std::span<const double> y,
                std::span<double> grad) const;

  // The same for S parameter vectors at once (one step's draws): f[s] = sum_n log p(y_n | x_n,
  // theta_s) and grad's row s = its gradient (both overwritten). theta: S x P row-major; grad: S
  // rows of P, row s at grad[s * grad_stride] (0: P), or empty for the log-likelihoods alone;
  // x: n x D row-major. row_terms, then the rows' sums in order and rows_gradient: the result
  // depends only on the block and S, not on where the block or the gradient sits in memory.
  void loglik_draws(std::span<const double> theta, int samples, std::span<const double> x,
                    std::span<const double> y, std::span<double> f, std::span<double> grad,
                    std::size_t grad_stride = 0) const;

  // Per row and draw, for the rows of x (n x D row-major) and their responses y (n):
  //   lik[i S + s]          = log p(y_i | x_i, theta_s)
  //   r[i S C + s C + k]    = d log p(y_i | x_i, theta_s) / d eta_{i,s,k}
  // Each row's values are a fixed function of that row, its response and theta: they do not
  // depend on the other rows, their number or order, or memory addresses. So the draws driver
  // may compute them for any run of rows (a thread's share of a pass) and sum them by groups.
  void row_terms(std::span<const double> theta, int samples, std::span<const double> x,
                 std::span<const double> y, double* lik, double* r) const;
  // The gradient in theta of the log-likelihood of groups of consecutive rows of x (n x D), from
  // their r (row_terms'; row i at r + i * ldr): grad's row s, at grad[s * grad_stride] (0: P),
  // overwritten with the sums of r_{i,s,k} [x_i, 1] in output k's place, each over a group's
  // rows in order, then over the groups pairwise as core/tree_sum.hpp adds them. bounds: the
  // G + 1 >= 2 group bounds, group t being rows [bounds[t] - bounds[0], bounds[t + 1] -
  // bounds[0]) of x, each with at least one row. The result depends on the groups' rows and
  // terms alone, not on where they sit in memory.
  void rows_gradient(int samples, std::span<const double> x, const double* r, std::size_t ldr,
                     std::span<const std::int64_t> bounds, std::span<double> grad,
                     std::size_t grad_stride = 0) const;

  // log N(theta | 0, s0^2 I); adds its gradient to `grad`.
  double log_prior(std::span<const double> theta, std::span<double> grad) const;

  // Throws caviar::Error naming the first row whose response the likelihood cannot take
  // (labels not 0/1, negative or fractional counts, classes out of range, non-finite values).
  void check_responses(std::span<const double> y, std::int64_t first_row) const;
};

}  // namespace caviar::bbvi
