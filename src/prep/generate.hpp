#pragma once
// Synthetic Gaussian mixtures, written in parallel. Row n depends only on (seed, n), so the file
// is identical for any number of ranks.
#include <Eigen/Core>
#include <cstdint>
#include <string>
#include <vector>

#include "comm/comm.hpp"

namespace caviar {

struct MixtureSpec {
  Eigen::VectorXd weights;            // K, sums to 1
  Eigen::MatrixXd means;              // K x D
  std::vector<Eigen::MatrixXd> covs;  // K of D x D
};

// Random parameters from the seed: weights from 0.5 + U(0,1), means ~ N(0, 4^2 I),
// covariances 0.5 I + A A^T / (2D) with A standard normal.
MixtureSpec random_mixture(int dim, int n_components, std::uint64_t seed);

// The first simulation study of Bruno 2022, section 1.2.3 (Figure 1.5): three 2-D Gaussians.
MixtureSpec seed_three_clusters();
// Its second (Figure 1.7): two 2-D Gaussians, to be fitted with K = 4.
MixtureSpec seed_two_clusters();

struct Sample {
  std::string path;  // dataset path inside the file, e.g. "/X"
  MixtureSpec spec;
  std::int64_t n;
};

// Collective: writes each sample to `file` (atomically): data at path, the true labels at
// <parent>/labels and the parameters at <parent>/true/{weights,means,covariances}.
void write_samples(const Comm& comm, const std::string& file, const std::vector<Sample>& samples,
                   std::uint64_t seed);

}  // namespace caviar
