#pragma once
// Rows drawn from a Gaussian mixture (ancestral sampling; Bishop 2006, section 11.1.1): the
// component z_n by inverse CDF of the weights, then x_n = mu_z + L_z eps with L_z the Cholesky
// factor of the covariance and eps standard normal. Row n's draws are keyed by (seed, stream, n),
// so a sample is the same for any number of ranks and threads. Used by `caviar generate gmm`
// (true parameters) and `caviar gmm sample` (a fitted model's).
#include <Eigen/Core>
#include <cstdint>
#include <vector>

#include "core/rng.hpp"
#include "models/gmm/gmm.hpp"

namespace caviar::gmm {

struct Mixture {
  Eigen::VectorXd weights;            // K, summing to 1
  RowMatrix means;                    // K x D
  std::vector<Eigen::MatrixXd> chol;  // K lower Cholesky factors of the covariances, D x D
};

// Rows [row_begin, row_begin + x.rows()) of a sample into x (preallocated n x D) and their
// components into z (n). step0: the first counter step of this sample (distinct samples drawn
// with one seed and stream use disjoint steps).
void draw_rows(const Mixture& m, const CounterRng& rng, std::uint32_t step0, std::int64_t row_begin,
               RowMatrix& x, std::vector<std::int64_t>& z);

}  // namespace caviar::gmm
