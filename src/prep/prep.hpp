#pragma once
// Dataset preparation: converts public datasets into caviar's HDF5 layout, optionally with a
// principal-component projection computed across ranks. The output is the same for any number of
// ranks (the PCA up to the rounding of its sums).
#include <cstdint>
#include <functional>
#include <string>

#include "comm/comm.hpp"

namespace caviar {

// Where Debian's dataset-fashion-mnist package puts the gzip-compressed IDX files.
inline constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";

struct PrepOptions {
  std::string source = kFashionMnistDir;
  std::string out;
  int pca = 0;  // number of principal components; 0 for none
};

struct PrepResult {
  std::int64_t train = 0, test = 0;  // images
  std::int64_t pixels = 0;           // per image
  int pca = 0;
  double pca_variance_fraction = 0;  // share of the total variance the components explain
  double seconds = 0;
};

using PrepProgress = std::function<void(const std::string&)>;

// Collective. Writes `out` (atomically) with
//   /train/images, /test/images   N x pixels float32, pixel / 255 (the quotient rounded to float)
//   /train/labels, /test/labels   N int64, 0..9
// and, if opt.pca > 0, with D = opt.pca and the statistics of the training images:
//   /pca/mean (pixels), /pca/components (D x pixels, orthonormal rows by decreasing eigenvalue,
//   each with its largest-magnitude entry positive), /pca/explained_variance (D eigenvalues of the
//   covariance normalised by N, like numpy's np.cov(..., bias=True)), and /train/pca, /test/pca
//   (N x D float64: (x - training mean) projected on the components).
// Missing or malformed inputs throw one agreed Error naming the file; no output is created then.
PrepResult prep_fashion_mnist(const Comm& comm, const PrepOptions& opt,
                              const PrepProgress& progress);

}  // namespace caviar
