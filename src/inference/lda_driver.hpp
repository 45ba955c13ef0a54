#pragma once
// Drivers for LDA: they own the communicator and the files and run the model's local step /
// allreduce / update loop (CAVI or SVI). Documents are the shards; the K x V expected counts are
// reduced as int64 fixed point, so every result is identical for any number of ranks.
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "comm/comm.hpp"
#include "engine/reduce.hpp"
#include "engine/run.hpp"
#include "models/lda/lda.hpp"

namespace caviar::lda {

struct FitOptions {
  std::string data;  // FILE.h5[:/group] holding indptr, indices, data, vocab
  int topics = 0;
  std::string algorithm = "svi";     // cavi | svi
  std::optional<double> alpha, eta;  // default 1/K each (as scikit-learn and gensim)
  // CAVI iterations or SVI passes over the corpus; unset: 100 iterations or 10 passes.
  std::optional<int> max_iter;
  int iterations() const { return max_iter.value_or(algorithm == "svi" ? 10 : 100); }
  double tol =
      1e-5;  // stop when the relative change of the objective (per iteration or pass) is below this
  int batch_size = 256;             // SVI documents per (global) minibatch
  double tau0 = 10.0, kappa = 0.7;  // SVI step size rho_t = (tau0 + t)^-kappa
  LocalOptions local;
  std::uint64_t seed = 0;
  std::string heldout;  // optional FILE.h5[:/group]: perplexity after every iteration / pass
  // SVI only: never hold the corpus. Minibatches are runs of the pass's permutation of
  // 256-document blocks, and each rank reads its part of each minibatch from the file.
  bool stream = false;
  std::int64_t stream_piece_docs = 16 * 256;  // --stream CAVI: documents per read
  std::string out;                            // model file ("" = none)
  // Checkpoint/resume (inference/lda_checkpoint.hpp): write the complete state to `checkpoint`
  // every `checkpoint_every` ("N" iterations/steps or "Ts" seconds) and on SIGTERM/SIGUSR1;
  // continue from `resume`.
  std::string checkpoint, checkpoint_every, resume;
  std::string command, version;
};

struct FitResult {
  // Traces (objective: CAVI's ELBO, SVI's per-pass estimate; heldout: perplexity), iterations
  // (CAVI) or passes (SVI), convergence, and where the time went (engine/run.hpp).
  engine::RunResult run;
  double elbo() const { return run.trace.objective.back(); }
  double read_seconds = 0;
  std::int64_t documents = 0, words = 0;
  double tokens = 0;
  // Document fixed-point sweeps (all ranks) of this run (after a CAVI resume: since the resume).
  std::int64_t sweeps = 0;
  // The share of the K x V rows an SVI reduction moved, averaged over minibatches.
  double reduced_rows = 1;
};

// Called on every rank after each CAVI iteration or SVI pass (objective: the ELBO or its
// estimate; heldout: the perplexity, NaN without --heldout).
using Progress = engine::Progress;
FitResult fit(const Comm& comm, const FitOptions& opt, const Progress& progress);

struct ScoreResult {
  double perplexity = 0;      // exp(-log_likelihood / heldout_tokens)
  double log_likelihood = 0;  // of the held-out halves
  double heldout_tokens = 0;
  std::int64_t documents = 0;
  double seconds = 0;
};
ScoreResult score(const Comm& comm, const std::string& model_file, const std::string& data,
                  const LocalOptions& local);

struct Topic {
  std::vector<std::string> words;
  std::vector<double> weights;  // E[beta_kw]
};
// Serial: the `top` most probable words of every topic.
std::vector<Topic> topics(const std::string& model_file, int top);

// Rank 0: writes /components (lambda, K x V), /topic_word (E[beta]), /vocab and the alpha, eta
// attributes to `out`: the exchange format for other LDA implementations.
void export_topics(const Comm& comm, const std::string& model_file, const std::string& out);
// Rank 0: a model file from an exchange file (`components` = K x V Dirichlet parameters lambda;
// scikit-learn's components_ or gensim's state.get_lambda()). alpha/eta default to the file's
// attributes. vocab_from, if given, copies the vocabulary of a corpus.
void import_topics(const Comm& comm, const std::string& components, std::optional<double> alpha,
                   std::optional<double> eta, const std::string& vocab_from, const std::string& out,
                   const std::string& command);

// Exact order-independent global sum of doubles (the engine's).
using engine::exact_sum;

}  // namespace caviar::lda
