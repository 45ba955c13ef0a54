#pragma once
// `caviar <model> compare MODEL.h5 ...`: one row per fitted model file (K, algorithm, seed, final
// objective, held-out score, effective number of components), read from the provenance every fit
// writes (engine/model_file.hpp, and the GMM's own writer), and optionally a PNG of the objective
// and the held-out score against K. This is how a user picks K from a sweep of fits.
#include <CLI/CLI.hpp>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/command.hpp"

namespace caviar::engine {

// A component counts as effective when its mixing weight is at least kEffectiveShare / K, i.e. 1%
// of the weight it would carry if all K were used equally. A relative threshold, so that the
// count does not drift with the number of points (an absolute one, e.g. an expected count >= 1,
// calls a component holding 50 of 10^6 points "used").
inline constexpr double kEffectiveShare = 0.01;

struct FitSummary {
  std::string file, model, algorithm;  // algorithm: e.g. "svi/adaptive" when a schedule is recorded
  std::int64_t k = 0;
  std::optional<std::int64_t> seed;
  std::string objective_name;  // the attribute the final objective was read from
  double objective = 0;
  std::string heldout_name;  // "" without a held-out score
  std::optional<double> heldout;
  std::optional<std::int64_t> effective;  // only for models with mixing weights (/weights)
  std::optional<std::int64_t> iterations;
  std::optional<bool> converged;
};

// Reads one model file written by `caviar <model> fit` (serial, any rank). Throws Error for a
// missing file, a file that is not HDF5, a checkpoint, a file that is not a fitted caviar model,
// or a model of another kind than `model`.
FitSummary read_fit_summary(const std::string& file, const std::string& model);

// All of `files`, sorted by K (then seed, then file name); throws Error if they mix objectives
// (EM's log-likelihood and a variational bound are different quantities) or held-out metrics.
std::vector<FitSummary> read_fit_summaries(const std::vector<std::string>& files,
                                           const std::string& model);

// The table printed by compare: a header line and one line per fit.
std::string format_table(const std::vector<FitSummary>& rows);

// Registers `<group> compare` for the model files of `model` ("gmm", "lda", "hmm", ...).
void add_compare_command(CLI::App* group, Context& ctx, const std::string& model);

}  // namespace caviar::engine
