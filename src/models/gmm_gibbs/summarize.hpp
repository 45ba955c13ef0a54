#pragma once
// Posterior summaries of a Gibbs chain of the Bayesian Gaussian mixture, relabelled against a
// reference fit (e.g. CAVI's). The mixture's likelihood is invariant under permutations of the
// components, so a chain that switches labels averages unrelated components (Stephens 2000,
// section 1); each recorded draw is therefore first matched to the reference: the permutation
// minimising the summed squared distances between the draw's means and the reference's, found by
// the Hungarian algorithm (Kuhn 1955; Munkres 1957). Then the posterior mean and standard
// deviation of each weight, mean and covariance entry over the relabelled draws (Bruno 2022,
// Table 2.1's quantities). No MPI, no files.
#include <Eigen/Core>
#include <cstdint>
#include <vector>

namespace caviar::gmm_gibbs {

// The assignment of rows to columns of the square matrix `cost` with the least total cost:
// out[i] is row i's column. The Hungarian algorithm (Kuhn 1955; Munkres 1957) with row and
// column potentials, one row added at a time along a shortest augmenting path: O(K^3). Throws
// Error for a non-square or non-finite `cost`.
std::vector<int> min_cost_assignment(const Eigen::MatrixXd& cost);

// n recorded draws of a K-component mixture in D dimensions, in the chain's labels, row-major:
// weights n x K, means n x K x D, covariances n x K x D x D (empty: the chain records none).
struct MixtureDraws {
  std::int64_t n = 0;
  int k = 0, d = 0;
  std::vector<double> weights, means, covariances;
};

// The reference fit: weights (K), means (K x D), covariances (K x D x D), row-major.
struct Mixture {
  int k = 0, d = 0;
  std::vector<double> weights, means, covariances;
};

// A collapsed chain's draw is its statistics (N_k, S_k = sum of the points labelled k); its
// weights and means are the posterior means given those labels under the conjugate prior,
//   E[pi_k | z] = (alpha0 + N_k) / (K alpha0 + N)       (Bishop 2006, eqs. 10.58 and B.17),
//   E[mu_k | z] = (beta0 m0 + S_k) / (beta0 + N_k)      (Bishop 2006, eqs. 10.60-10.61),
// with N = sum_k N_k. The statistics hold no second moments, so no covariances.
// counts: n x K; sums: n x K x D (data coordinates); m0: D.
MixtureDraws collapsed_posterior_means(std::int64_t n, int k, int d,
                                       const std::vector<double>& counts,
                                       const std::vector<double>& sums, double alpha0, double beta0,
                                       const std::vector<double>& m0);

// The mean and standard deviation (divisor n - 1; NaN for a single draw) over draws of each
// entry, in the reference's order.
struct Moments {
  std::vector<double> mean, sd;
};

struct ChainSummary {
  std::vector<std::int64_t> matching;   // n x K: the chain's component matched to reference k
  MixtureDraws relabelled;              // the draws in the reference's order
  Moments weights, means, covariances;  // covariances empty when the draws hold none
  // The largest |chain mean - reference| over the entries of the weights, the means and the
  // covariances (NaN without covariances).
  double max_diff_weight = 0, max_diff_mean = 0, max_diff_covariance = 0;
};

// Matches every draw to `ref` (min_cost_assignment on the squared distances between means) and
// summarises the relabelled draws. Throws Error if K or D differ.
ChainSummary summarize_chain(const MixtureDraws& draws, const Mixture& ref);

}  // namespace caviar::gmm_gibbs
