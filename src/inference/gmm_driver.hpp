#pragma once
// Drivers for the Gaussian mixture: they own the communicator and the files, and run the model's
// local_step / allreduce / update loop. The model itself never sees MPI or HDF5.
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "comm/comm.hpp"
#include "models/gmm/gmm.hpp"

namespace caviar::gmm {

struct FitOptions {
  std::string data;  // FILE.h5[:/path]
  int components = 0;
  Covariance covariance = Covariance::kFull;
  int max_iter = 200;
  double tol = 1e-6;  // relative ELBO change; 0 runs all max_iter iterations
  std::uint64_t seed = 0;
  std::string init = "kmeans++";  // kmeans++ | random | FILE.h5:/resp
  int kmeans_iter = 10;
  std::optional<double> alpha0, beta0, nu0;
  std::string prior_mean = "zero";       // zero | data
  std::string prior_scale = "identity";  // identity | data
  std::string out;                       // model file ("" = none)
  std::string labels;                    // per-row labels file ("" = none)
  bool save_responsibilities = false;
  std::string command;  // provenance
  std::string version;
};

struct IterationReport {
  int iteration;
  double elbo;
  double rel_change;  // NaN on the first
  double seconds;     // since the start of the fit
};

struct FitResult {
  double elbo = 0;
  int iterations = 0;
  bool converged = false;
  double seconds = 0;
  std::int64_t n = 0;
  std::vector<double> trace;
};

using Progress = std::function<void(const IterationReport&)>;

FitResult fit(const Comm& comm, const FitOptions& opt, const Progress& progress);

struct ScoreResult {
  double score = 0;  // average log predictive density per point (seed eq. 1.73)
  std::int64_t n = 0;
};
ScoreResult score(const Comm& comm, const std::string& model_file, const std::string& data);

// Writes argmax_k r_nk as /labels (and /responsibilities if asked) to `out`; returns N.
std::int64_t predict(const Comm& comm, const std::string& model_file, const std::string& data,
                     const std::string& out, bool save_responsibilities);

}  // namespace caviar::gmm
