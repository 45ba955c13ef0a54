#pragma once
// Data-parallel VAE training and the commands that use a trained model. This file owns the data
// and the files; training runs on the engine's gradient driver (engine/gradient.hpp: minibatch
// order, exact reduction, Adam, checkpoints), with the model (models/vae/gradient.hpp), which
// never sees MPI or HDF5.
//
// Rank-count independence: the global minibatch comes from a permutation keyed by (seed, epoch);
// it is cut into micro-blocks whose layout depends only on the batch size, and each rank computes
// the gradients of a contiguous run of whole micro-blocks (one thread per micro-block). Noise is
// keyed by (seed, global row, step). The micro-block gradients are summed exactly in int64 fixed
// point (core/gradient_sum.hpp), so the parameters after any number of steps are bitwise the
// same at any rank and thread count.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "comm/comm.hpp"
#include "models/vae/vae.hpp"

namespace caviar::vae {

struct TrainOptions {
  std::string data;          // FILE.h5[:/path], N x D
  std::string test;          // optional held-out set, evaluated at every epoch end
  std::string arch = "mlp";  // mlp | conv (Layout: stride-2 convolutions with batch norm)
  std::vector<int> hidden{400};
  std::vector<int> channels{32, 64};  // conv: output channels of the stride-2 convolutions
  std::string image;                  // conv: "CxHxW"; "" = 1 x s x s for s^2 columns
  bool bayesian_decoder = false;      // mlp: a mean-field Gaussian over the decoder's weights
  double prior_scale = 1.0;           // its prior N(0, s^2)
  int latent = 20;
  int epochs = 10;
  int batch_size = 100;
  double lr = 1e-3;
  double weight_decay = 0.0;
  int samples = 1;  // S, reparameterised samples per row
  std::string likelihood = "bernoulli";
  std::string posterior = "diagonal";  // of the encoder: diagonal | full
  // The KL's gradient: reparam (closed form) | stl (path derivative) | auto (stl for a full
  // posterior, where it was measured to help, reparam for a diagonal one)
  std::string estimator = "auto";
  std::uint64_t seed = 0;
  int micro_blocks = 4;             // micro-blocks per global batch (independent of the ranks)
  std::string reduction = "exact";  // exact (int64 fixed point) | fast (double, rank-dependent)
  std::string out;                  // model file ("" = none)
  std::string checkpoint;           // written on SIGTERM/SIGUSR1 and every checkpoint_every
  std::string checkpoint_every;     // "N" epochs or "Ts" seconds; "" = 1 with a checkpoint
  std::string resume;               // checkpoint to continue from ("" = start afresh)
  std::string command, version;     // provenance
};

struct EpochReport {
  int epoch = 0, epochs = 0;
  double train_elbo = 0;       // mean over the epoch's minibatches, nats per row
  double test_elbo = 0;        // NaN without --test
  double seconds = 0;          // this epoch, training and evaluation
  double rows_per_second = 0;  // training rows per second of training time
};

struct TrainResult {
  double train_elbo = 0, test_elbo = 0;
  int epochs = 0;      // completed, including those of a resumed checkpoint
  int epochs_run = 0;  // by this call
  std::int64_t steps = 0, n = 0;
  double seconds = 0;
  // Where the time went, summed over epochs (rank 0's clock).
  double train_seconds = 0;  // the training passes only (no evaluation, no checkpoints)
  double compute_seconds = 0, reduce_seconds = 0, update_seconds = 0, eval_seconds = 0;
  std::vector<double> train_trace, test_trace;
  ParamVec params;
  std::vector<double> running;  // batch norm's running statistics (conv)
  double decoder_kl = 0;        // a Bayesian decoder's KL(q(w) || p(w)) at the end
};

using EpochProgress = std::function<void(const EpochReport&)>;
TrainResult train(const Comm& comm, const TrainOptions& opt, const EpochProgress& progress);

struct LoadedModel {
  Layout layout;
  ParamVec params;
  std::vector<double> running;  // batch norm's running statistics (conv)
};
// Collective: every rank reads the (small) model file written by train.
LoadedModel load_model(const Comm& comm, const std::string& file);

// Image-producing commands: write the pixel means to `images_out` (HDF5: /images, n x D, with
// the grid shape as attributes) and, if png is non-empty, render it with scripts/plot_vae.py.
struct ImageOptions {
  std::string model;
  std::string png;         // "" = no PNG
  std::string images_out;  // "" = a temporary file next to the PNG
  std::uint64_t seed = 0;
};
// n decoded samples z ~ N(0, I).
std::int64_t sample(const Comm& comm, const ImageOptions& o, int n);
// The first n rows of data and their reconstructions (decoder mean at z = mu).
std::int64_t reconstruct(const Comm& comm, const ImageOptions& o, const std::string& data, int n);
// Latent 2 only: the decoded grid z = (Phi^-1(p_j), Phi^-1(p_i)), p = (k + 1/2) / grid.
std::int64_t manifold(const Comm& comm, const ImageOptions& o, int grid);

// /mu and /logvar (N x Z, float32) of every row of data, each rank writing its own rows.
std::int64_t encode(const Comm& comm, const std::string& model, const std::string& data,
                    const std::string& out);

// vae score: the mean ELBO per row (one sample, as vae train --test reports it) and the
// importance-weighted estimate of log p(x) per row with k samples (Burda, Grosse &
// Salakhutdinov 2016), a lower bound that tightens to log p(x) as k grows. The draws are keyed by
// (seed, row, sample), so the result is the same at any rank or thread count. `out`, if given,
// gets /log_px (N, float64), each rank writing its own rows.
struct ScoreOptions {
  std::string model, data, out;
  int importance_samples = 5000;
  std::uint64_t seed = 0;
  // Called on rank 0 now and then with the fraction of its rows done (thread 0 only).
  std::function<void(double)> progress;
};
struct ScoreResult {
  std::int64_t n = 0;
  int importance_samples = 0;
  double elbo = 0, log_px = 0;  // nats per row
  double seconds = 0;
};
ScoreResult score(const Comm& comm, const ScoreOptions& o);

}  // namespace caviar::vae
