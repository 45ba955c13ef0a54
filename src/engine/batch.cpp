#include "engine/batch.hpp"

namespace caviar::engine::detail {

void record(const std::function<double()>& heldout_fn, const Progress& progress, FitClock& clock,
            int it, double f, RunResult& res) {
  const double seconds = clock.elapsed();
  double heldout = std::numeric_limits<double>::quiet_NaN();
  if (heldout_fn) {
    heldout = clock.excluding(heldout_fn);
    res.trace.heldout.push_back(heldout);
  }
  res.trace.objective.push_back(f);
  res.trace.seconds.push_back(seconds);
  if (progress) progress({it, f, heldout, seconds});
}

void finish(const Comm& comm, double local_seconds, double reduce_seconds, FitClock& clock,
            RunResult& res) {
  res.seconds = clock.elapsed();
  res.local_seconds_max = comm.allreduce_max(local_seconds);
  res.local_seconds_min = -comm.allreduce_max(-local_seconds);
  res.reduce_seconds_max = comm.allreduce_max(reduce_seconds);
}

}  // namespace caviar::engine::detail
