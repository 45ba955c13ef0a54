#pragma once
// Counter-based random numbers (Philox4x32-10, Salmon et al. SC'11). A draw is a pure function of
// (seed, stream, global index, step), never of the rank or thread that computes it: this is what
// makes every random choice in caviar independent of the number of ranks and threads.
#include <array>
#include <cstdint>
#include <span>

namespace caviar {

// One stream per purpose, so that two uses of the same seed never share draws.
enum class Stream : std::uint32_t {
  kInitResponsibilities = 1,
  kKmeansPlusPlus = 2,
  kGenerateParams = 3,
  kGenerateRows = 4,
  kSviMinibatch = 5,   // global minibatch draws of SVI (mixtures and LDA)
  kVaeInit = 6,        // VAE weight initialisation
  kVaeNoise = 7,       // VAE reparameterisation noise, keyed by (global row, step)
  kVaeShuffle = 8,     // VAE epoch permutations
  kLdaInit = 9,        // LDA initial topics
  kLdaGenerate = 10,   // synthetic LDA corpora
  kPlsaInit = 11,      // pLSA initial topics
  kHmmInit = 12,       // HMM initial parameters
  kHmmGenerate = 13,   // synthetic HMM sequences
  kHmmSample = 14,     // sequences sampled from a fitted HMM
  kGmmSample = 15,     // rows sampled from a fitted Gaussian mixture
  kGmmStarts = 16,     // the seeds of the starts of gmm fit --n-init
  kInitFromData = 17,  // the K rows of gmm fit --init random-from-data
  kBbviInit = 18,      // the starting low-rank factor of black-box VI
  kBbviNoise = 19,     // black-box VI draws, keyed by (step, draw)
  kGibbsGamma = 20,    // Gibbs samplers of the mixture: Gamma draws (Dirichlet, Wishart)
  kGibbsNormal = 21,   // Gibbs samplers of the mixture: normal draws (Wishart, means)
  kGibbsLabels = 22,   // Gibbs samplers of the mixture: label draws, keyed by (row, sweep)
  kBbviBatch = 23,     // black-box VI minibatch positions, keyed by (step, position)
  kBbviElbo = 24,      // black-box VI draws of the ELBO estimate and of the k-hat diagnostic
  kGibbsOrder = 25,    // collapsed Gibbs: each block's order of rows, keyed by (row, sweep)
  kGibbsCollapsedLabels = 26,  // collapsed Gibbs: label draws, keyed by (row, sweep)
  kVaeWeights = 27,            // a Bayesian VAE decoder's weight draws, keyed by (parameter, step)
};

std::array<std::uint32_t, 4> philox4x32_10(std::array<std::uint32_t, 4> counter,
                                           std::array<std::uint32_t, 2> key);

class CounterRng {
 public:
  CounterRng(std::uint64_t seed, Stream stream) : seed_(seed), stream_(stream) {}

  // Two independent uniforms in the open interval (0, 1), 53 random bits each.
  std::array<double, 2> uniform2(std::uint64_t index, std::uint32_t step) const;
  // Two independent standard normals (Box-Muller on uniform2).
  std::array<double, 2> normal2(std::uint64_t index, std::uint32_t step) const;
  // out[i] = uniform2(first + i / 2, step)[i % 2], the same bits, several counters at once.
  void uniforms(std::uint64_t first, std::uint32_t step, std::span<double> out) const;
  // Two standard normals, Box-Muller on uniform2 with math::fast's logarithm, cosine and sine
  // (arithmetic, no C library), computed in vector lanes: within a few ulps of normal2, which
  // calls the C library's, and several times cheaper in normals.
  std::array<double, 2> poly_normal2(std::uint64_t index, std::uint32_t step) const;
  // out[i] = poly_normal2(first + i / 2, step)[i % 2], the same bits, several counters at once.
  void normals(std::uint64_t first, std::uint32_t step, std::span<double> out) const;

 private:
  std::uint64_t seed_;
  Stream stream_;
};

// Gamma(shape, 1) draw from the counter RNG of `stream` at `index` (Marsaglia & Tsang 2000; a
// shape below one is boosted by U^(1/shape)). Retries use successive steps, so the draw is a pure
// function of (seed, stream, index). Used by LDA (initial topics, generated corpora) and by the
// samplers of the Gaussian mixture (Dirichlet and Wishart draws).
double sample_gamma(std::uint64_t seed, std::uint32_t stream, std::uint64_t index, double shape);

}  // namespace caviar
