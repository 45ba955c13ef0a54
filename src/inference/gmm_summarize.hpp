#pragma once
// caviar gmm summarize: a Gibbs chain of gmm sample --data, relabelled against a reference fit
// (models/gmm_gibbs/summarize.hpp), summarised into an HDF5 file (posterior means and standard
// deviations, the reference in the same order, the matching) and optionally a PNG of the traces
// and, in 2-D, of the sampled ellipses (scripts/plot_gibbs_summary.py). The files are small: rank 0
// does the work and its errors are every rank's.
#include <cstdint>
#include <string>

#include "comm/comm.hpp"
#include "models/gmm_gibbs/summarize.hpp"

namespace caviar::gmm {

struct SummarizeOptions {
  std::string chain, reference, out, plot;  // plot: "" for none
  std::string command, version;
};

struct SummarizeResult {  // filled on rank 0 only
  std::string sampler;
  gmm_gibbs::Mixture reference;
  gmm_gibbs::ChainSummary summary;
};

// Collective. Throws Error (on every rank, nothing written) for a chain file that is not a chain
// or holds no draws, a reference that is not a fitted gmm model, different K or D, or an output
// that is one of the inputs.
SummarizeResult summarize(const Comm& comm, const SummarizeOptions& o);

// The per-component table printed by the command (Bruno 2022, Table 2.1's layout): weight, mean
// and covariance from the chain (posterior mean, with the weight's sd) and from the reference.
std::string format_summary_table(const SummarizeResult& r);

}  // namespace caviar::gmm
