#pragma once
// The driver of batch conjugate fits (CAVI and EM), written once for every model.
//
// One iteration (Blei, Kucukelbir & McAuliffe 2017, section 2.4; Dempster, Laird & Rubin 1977):
//
//   local step      model.local_step(stats, terms)   each rank, its own rows, any thread count:
//                   the expected sufficient statistics of its rows, and one objective term per row
//   exact reduction comm.allreduce_sum(stats.words())  integers, so the sum is independent of the
//                   split of rows over ranks and threads
//   objective       exact_sum(terms) + model.global_objective()   of the current parameters
//   global update   model.update(stats)               the M-step / CAVI update of the globals
//
// The objective reported at iteration t is that of the parameters the local step used, so a
// fit's last reported value is the objective of the state it returns, and the trace of an EM or
// CAVI fit never decreases (tests assert it). --max-iter bounds the updates; --tol stops when the
// relative change of the objective falls below it.
#include <chrono>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <functional>
#include <limits>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "comm/comm.hpp"
#include "core/error.hpp"
#include "core/partition.hpp"
#include "engine/checkpoint.hpp"
#include "engine/reduce.hpp"
#include "engine/run.hpp"
#include "engine/state.hpp"

namespace caviar::engine {

// What a batch conjugate model provides. Stats::words() is the integer representation of the
// statistics that the engine sums over ranks (e.g. core/fixed_point.hpp's FixedPointCounts).
template <class M>
concept BatchModel = requires(M& m, const M& cm, typename M::Stats& s, std::span<double> terms,
                              StateWriter& w, const StateReader& r) {
  { cm.make_stats() } -> std::same_as<typename M::Stats>;
  { s.words() } -> std::same_as<std::span<std::int64_t>>;
  s.set_zero();
  { cm.n_local_rows() } -> std::convertible_to<std::int64_t>;
  m.local_step(s, terms);
  { cm.global_objective() } -> std::convertible_to<double>;
  m.update(std::as_const(s));
  cm.save(w);
  m.load(r);
  { m.local_states() } -> std::same_as<std::vector<LocalState>>;
};

// What every driver is given: where the fit runs, and how it stops, checkpoints and reports.
struct Run {
  const Comm* comm = nullptr;
  StopRule stop;  // max_iter: iterations (batch) or passes over the rows (stochastic)
  Checkpointer* checkpoint = nullptr;
  RowRange rows;                 // this rank's rows of the data
  std::int64_t global_rows = 0;  // every rank's
  Progress progress;             // called on every rank after each iteration or pass (may be empty)
  std::function<double()>
      heldout;                    // collective held-out metric of the current state (may be empty)
  std::vector<Counter> counters;  // carried across a resume (engine/checkpoint.hpp)
};
using BatchRun = Run;

namespace detail {
inline std::vector<RowState> row_states(std::vector<LocalState> local, const Run& run) {
  std::vector<RowState> out;
  for (LocalState& l : local) out.push_back({std::move(l), run.global_rows, run.rows});
  return out;
}

// Records iteration `it` (objective f) in the trace and reports it.
void record(const std::function<double()>& heldout, const Progress& progress, FitClock& clock,
            int it, double f, RunResult& res);
inline void record(const BatchRun& run, FitClock& clock, int it, double f, RunResult& res) {
  record(run.heldout, run.progress, clock, it, f, res);
}

// The reductions' timing summary (collective).
void finish(const Comm& comm, double local_seconds, double reduce_seconds, FitClock& clock,
            RunResult& res);

class Stopwatch {
 public:
  double seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  }

 private:
  std::chrono::steady_clock::time_point t0_ = std::chrono::steady_clock::now();
};
}  // namespace detail

template <BatchModel M>
RunResult fit_batch(M& model, const BatchRun& run) {
  const Comm& comm = *run.comm;
  Checkpointer& ck = *run.checkpoint;
  ck.restore_model([&](const StateReader& r) { model.load(r); });
  for (const RowState& s : detail::row_states(model.local_states(), run)) ck.restore_rows(s);
  ck.restore_counters(run.counters);
  RunResult res;
  res.trace = ck.trace();
  FitClock clock(ck.elapsed());
  auto stats = model.make_stats();
  std::vector<double> terms(static_cast<std::size_t>(model.n_local_rows()));
  double local_seconds = 0, reduce_seconds = 0;
  for (int it = ck.iteration();; ++it) {
    // Iteration boundary: may checkpoint, or stop on a signal (every rank at once).
    ck.boundary(
        it, res.trace, clock.elapsed(), [&](StateWriter& w) { model.save(w); },
        detail::row_states(model.local_states(), run), run.counters);
    stats.set_zero();
    const detail::Stopwatch local;
    model.local_step(stats, terms);
    local_seconds += local.seconds();
    const detail::Stopwatch reduce;
    comm.allreduce_sum(stats.words());
    reduce_seconds += reduce.seconds();
    const double f = exact_sum(comm, terms) + model.global_objective();
    if (!std::isfinite(f))
      throw Error("the objective is not finite at iteration " + std::to_string(it));
    const double prev = res.trace.objective.empty() ? std::numeric_limits<double>::quiet_NaN()
                                                    : res.trace.objective.back();
    detail::record(run, clock, it, f, res);
    res.iterations = it;
    if (it > 0 && std::abs(f - prev) / std::abs(f) < run.stop.tol) {
      res.converged = true;
      break;
    }
    if (it >= run.stop.max_iter) break;
    model.update(std::as_const(stats));
  }
  detail::finish(comm, local_seconds, reduce_seconds, clock, res);
  return res;
}

}  // namespace caviar::engine
