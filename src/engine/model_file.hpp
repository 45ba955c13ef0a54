#pragma once
// The outputs every fit writes the same way: the model file of --out (the model's own save(),
// the traces and the provenance, readable with h5py) and per-row outputs (e.g. --doc-topics),
// written by every rank in parallel.
#include <cstdint>
#include <functional>
#include <string>

#include "comm/comm.hpp"
#include "engine/checkpoint.hpp"
#include "engine/run.hpp"
#include "engine/state.hpp"

namespace caviar::io {
class FileReader;
class FileWriter;
}  // namespace caviar::io

namespace caviar::engine {

struct Provenance {
  std::string model, algorithm, data, command, version;
  std::uint64_t seed = 0;
  // What the file calls the objective and the held-out metric (trace/<name> and the final value's
  // attribute): "objective" and "heldout" unless a model's files have long used other names
  // (LDA: "elbo" and "perplexity").
  std::string objective_name = "objective", heldout_name = "heldout";
};

// Rank 0 writes `out` atomically (collective: agreed errors): the model's datasets and attributes
// at the root, trace/objective, trace/seconds (and trace/heldout), and the attributes model,
// algorithm, objective, n_iter, converged, ranks, threads, seed, data, version, command. `extra`
// (may be empty) adds what is not model state, e.g. a corpus's vocabulary.
void write_model_file(const Comm& comm, const std::string& out,
                      const std::function<void(StateWriter&)>& save, const RunResult& res,
                      const Provenance& p,
                      const std::function<void(io::FileWriter&)>& extra = nullptr);

// The run's attributes that every caviar output carries (model files, chain summaries): ranks,
// threads, seed, data, version, command.
void write_run_attrs(io::FileWriter& w, const Comm& comm, const Provenance& p);

// Refuses a file that is not a model file of `kind` (its "model" attribute), in one line:
// "'FILE' is not a caviar KIND model".
void require_model_kind(const io::FileReader& r, const std::string& file, const std::string& kind);

// Collective: every rank writes its rows of s to the dataset s.name of `out` (atomic).
void write_rows_file(const Comm& comm, const std::string& out, const RowState& s);

}  // namespace caviar::engine
