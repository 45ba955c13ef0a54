#pragma once
// Initial responsibilities for the mixtures. Every choice is keyed by (seed, global row), so the
// result is the same for any number of ranks.
#include <cstdint>
#include <string>
#include <vector>

#include "comm/comm.hpp"
#include "core/partition.hpp"
#include "models/gmm/gmm.hpp"

namespace caviar {

using gmm::RowMatrix;

// r_nk proportional to independent uniforms (as scikit-learn's init_params="random").
RowMatrix random_responsibilities(std::int64_t row_begin, std::int64_t n_rows, int k,
                                  std::uint64_t seed);

// K distinct global rows out of n_global, drawn uniformly without replacement and keyed by
// seed alone (so the same for any number of ranks); component j starts from row j of the
// result, as scikit-learn's init_params="random_from_data" (one-hot rows for these points, zero
// rows for every other point). Needs n_global >= k.
std::vector<std::int64_t> random_rows_from_data(std::int64_t n_global, int k, std::uint64_t seed);

// Distributed k-means++ seeding (Arthur & Vassilvitskii 2007), then `lloyd_iters` Lloyd steps;
// returns each local row's cluster (0..K-1). Each center is drawn by weighted reservoir sampling
// (key ln(u_n) / d_n^2, largest wins; Efraimidis & Spirakis 2006), so the draw is one max-reduction
// whose winner does not depend on how rows are split over ranks.
Eigen::VectorXi kmeans_labels(const Comm& comm, const RowMatrix& x, RowRange range,
                              std::int64_t n_global, int k, std::uint64_t seed, int lloyd_iters);

}  // namespace caviar
