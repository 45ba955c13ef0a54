#pragma once
// Drivers for the Gaussian mixture: they own the communicator and the files, and run the model's
// local_step / allreduce / update loop. The model itself never sees MPI or HDF5.
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "comm/comm.hpp"
#include "engine/run.hpp"
#include "models/gmm/gmm.hpp"

namespace caviar::gmm {

enum class Algorithm { kCavi, kSvi, kEm };
Algorithm parse_algorithm(const std::string& s);
std::string to_string(Algorithm a);

enum class Schedule { kRobbinsMonro, kAdaptive };
Schedule parse_schedule(const std::string& s);  // robbins-monro (or rm) | adaptive
std::string to_string(Schedule s);

struct FitOptions {
  std::string data;  // FILE.h5[:/path]
  int components = 0;
  Algorithm algorithm = Algorithm::kCavi;
  Covariance covariance = Covariance::kFull;
  WeightPrior weights = WeightPrior::kDirichlet;
  int max_iter = 200;  // CAVI/EM iterations; SVI epochs
  double tol = 1e-6;   // relative change of the ELBO / log-likelihood / SVI epoch-average ELBO;
                       // 0 runs all max_iter iterations (SVI: unless it decreases 3 epochs)
  std::uint64_t seed = 0;
  std::string init;  // kmeans++ | random | FILE.h5:/resp; "" = kmeans++ (random with --stream)
  // Start from the responsibilities of the mixture in this file (/weights, /means, /covariances,
  // full K x D x D or diagonal K x D): given parameters, or a model file of gmm fit (whose
  // posterior --warm-start continues from instead).
  std::string init_params;
  // Continue the fit in this model file of gmm fit (CAVI and EM): its whole state (the
  // variational posterior, or EM's point estimate) replaces the initialisation, so the first
  // E-step is the one the fit that wrote it would have taken next. K, D, the covariance type, the
  // algorithm and the weight prior must match; not with --init, --init-params or --n-init > 1.
  std::string warm_start;
  // Starts keyed by (seed, start), keeping the one with the best final bound (scikit-learn's
  // n_init); start 0 is the fit of `seed` itself.
  int n_init = 1;
  // EM: added to the diagonal of every covariance (scikit-learn's reg_covar, same default).
  double reg_covar = 1e-6;
  // SVI (Hoffman et al. 2013): minibatch size, step-size schedule rho_t = (tau0 + t)^-kappa
  // (Robbins & Monro 1951; Bruno 2022, eq. 2.51; the same names as lda fit and hmm fit) or the
  // adaptive rate with initial memory tau_1 = adaptive_memory (Ranganath et al. 2013; Bruno 2022,
  // eqs 2.54-2.58).
  std::int64_t batch_size = 512;
  Schedule schedule = Schedule::kRobbinsMonro;
  double tau0 = 1.0, kappa = 0.9, adaptive_memory = 500;
  bool stream = false;  // read rows from the file per step/chunk; never the whole dataset
  // Sum statistics in double in thread and rank order instead of exactly (see Stats): faster,
  // but the last bits of every result then depend on the rank and thread counts.
  bool fast_reduce = false;
  // float32 products in the full-covariance E-step (Model::set_precision): faster, results
  // change by about the float rounding of the distances.
  Precision precision = Precision::kDouble;
  std::int64_t chunk_rows = 0;  // rows per chunk of a streamed full pass (0: about 8 MB)
  int full_elbo_every = 0;      // SVI: also compute the full ELBO every S steps (clock paused)
  std::string heldout;          // FILE.h5[:/path]: report the held-out score after fitting
  int kmeans_iter = 10;
  std::optional<double> alpha0, beta0, nu0;
  std::string prior_mean = "zero";       // zero | data
  std::string prior_scale = "identity";  // identity | data
  std::string out;                       // model file ("" = none)
  std::string labels;                    // per-row labels file ("" = none)
  bool save_responsibilities = false;
  // Checkpoint/resume (the engine's, engine/checkpoint.hpp): write the complete state to
  // `checkpoint` every N iterations (SVI: epochs) or T seconds ("N" | "Ts"; and always on
  // SIGTERM/SIGUSR1), continue from `resume`.
  std::string checkpoint, checkpoint_every, resume;
  std::string command;  // provenance
  std::string version;
};

struct IterationReport {
  int iteration;           // CAVI/EM iteration, or SVI epoch
  double elbo;             // ELBO, log-likelihood (EM), or the SVI epoch-average stochastic ELBO
  double rel_change;       // NaN on the first
  double seconds;          // since the start of the fit
  double rho = 0;          // SVI: the step size of the epoch's last step
  std::int64_t steps = 0;  // SVI: steps so far
};

struct FitResult {
  Algorithm algorithm = Algorithm::kCavi;
  double elbo = 0;  // final full ELBO (SVI: one full pass after the last step); EM: log-likelihood
  int iterations = 0;
  bool converged = false;
  std::string stop_reason;  // tol | elbo-decreased | max-iter
  double seconds = 0;
  double loop_seconds = 0;  // the iterations alone (no data bounds, initialisation or output)
  double allreduce_seconds_min = 0, allreduce_seconds_max = 0;  // of them in allreduce, over ranks
  std::int64_t n = 0;
  std::vector<double> trace;          // per iteration (CAVI/EM) or per SVI step (stochastic ELBO)
  std::vector<double> seconds_trace;  // time of each trace entry (excluding full-ELBO checks)
  std::vector<double> epoch_trace;    // SVI: epoch-average stochastic ELBO
  std::vector<double> rho_trace;      // SVI: step sizes
  std::int64_t steps = 0;             // SVI
  std::vector<double> full_elbo, full_elbo_seconds, full_elbo_step;  // SVI checkpoints
  std::optional<double> heldout;     // average held-out log predictive density (EM: loglik)
  std::vector<double> start_bounds;  // --n-init > 1: each start's final bound (elbo)
  int best_start = 0;                // the start returned
};

using Progress = std::function<void(const IterationReport&)>;

FitResult fit(const Comm& comm, const FitOptions& opt, const Progress& progress);

struct ScoreResult {
  double score = 0;  // average log predictive density per point (Bishop 2006, eq. 10.81)
  std::int64_t n = 0;
};
ScoreResult score(const Comm& comm, const std::string& model_file, const std::string& data);

// Writes argmax_k r_nk as /labels (and /responsibilities if asked) to `out`; returns N.
std::int64_t predict(const Comm& comm, const std::string& model_file, const std::string& data,
                     const std::string& out, bool save_responsibilities);

// Draws n rows from a fitted model's mixture (its weights, means and covariances: the posterior
// expectations of a variational fit, as scikit-learn's sample() uses) and writes them as /X with
// their components as /labels, in parallel. Row i depends only on (seed, i).
void sample(const Comm& comm, const std::string& model_file, std::int64_t n, std::uint64_t seed,
            const std::string& out);

// A Gibbs chain of the Bayesian mixture (gmm sample --data): the blocked sampler of
// models/gmm_gibbs/blocked.hpp or the collapsed one of models/gmm_gibbs/collapsed.hpp on the
// engine's sampler driver (engine/sampler.hpp). `fit` holds the data, K, covariance, priors, seed,
// start (init / init_params), --heldout, --out (the chain file), --labels and the checkpoint
// options, with the meanings they have for gmm fit.
struct ChainOptions {
  FitOptions fit;
  std::string sampler = "blocked";  // blocked | collapsed
  int sweeps = 200, burn_in = 0, thin = 1;
  // Collapsed: rows per block (default 256; >= N is the exact sequential sampler).
  std::optional<std::int64_t> block_rows;
};

struct ChainResult {
  int sweeps = 0;
  std::int64_t draws = 0;
  double log_joint = 0;           // of the last sweep
  std::optional<double> heldout;  // of the last sweep's parameters
  double seconds = 0;             // of sampling (held-out evaluation excluded)
  std::int64_t n = 0;
};

ChainResult sample_chain(const Comm& comm, const ChainOptions& c, const engine::Progress& progress);

}  // namespace caviar::gmm
