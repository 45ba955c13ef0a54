#pragma once
// The driver of batch conjugate fits (CAVI and EM), written once for every model.
//
// One iteration (Blei, Kucukelbir & McAuliffe 2017, section 2.4; Dempster, Laird & Rubin 1977):
//
//   local step      model.local_step(stats, terms)   each rank, its own rows, any thread count:
//                   the expected sufficient statistics of its rows, and one objective term per row
//   exact reduction reduce(stats, Reducer(comm))      integers (Stats::words(), or the model's own
//                   Stats::reduce), so the sum is independent of the split of rows over ranks
//                   and threads (engine/reduce.hpp)
//   objective       exact_sum(terms) + model.global_objective()   of the current parameters, or
//                   model.objective(stats) for a model whose objective is a function of the
//                   summed statistics (e.g. the mixture's ELBO, Bishop 2006, eqs 10.70-10.77)
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

// The objective of a batch model: one term per row plus global_objective() (the terms summed
// exactly over ranks), or objective(stats), a function of the summed statistics alone (then the
// local step leaves `terms` empty: the driver passes none).
template <class M>
concept StatsObjective = requires(const M& cm, const typename M::Stats& s) {
  { cm.objective(s) } -> std::convertible_to<double>;
};
template <class M>
concept RowObjective = requires(const M& cm) {
  { cm.global_objective() } -> std::convertible_to<double>;
};

// What a batch conjugate model provides. Its Stats are summed over ranks by engine/reduce.hpp's
// reduce(): integer words, or the model's own exact protocol.
template <class M>
concept BatchModel = requires(M& m, const M& cm, typename M::Stats& s, std::span<double> terms,
                              StateWriter& w, const StateReader& r) {
  { cm.make_stats() } -> std::same_as<typename M::Stats>;
  s.set_zero();
  { cm.n_local_rows() } -> std::convertible_to<std::int64_t>;
  m.local_step(s, terms);
  m.update(std::as_const(s));
  cm.save(w);
  m.load(r);
  { m.local_states() } -> std::same_as<std::vector<LocalState>>;
}
&&ReducibleStats<typename M::Stats> && (StatsObjective<M> || RowObjective<M>);

// What every driver is given: where the fit runs, and how it stops, checkpoints and reports.
struct Run {
  const Comm* comm = nullptr;
  StopRule stop;  // max_iter: iterations (batch) or passes over the rows (stochastic)
  Checkpointer* checkpoint = nullptr;
  RowRange rows;                 // this rank's rows of the data
  std::int64_t global_rows = 0;  // every rank's
  Progress progress;             // called on every rank after each iteration or pass (may be empty)
  // What the objective is called in the error raised when it is not finite ("the <name> is not
  // finite at iteration t"), e.g. "ELBO" or "log-likelihood".
  std::string objective_name = "objective";
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

// The objective of the current parameters, given the summed statistics and this rank's terms.
template <class M>
double objective(const Comm& comm, const M& model, const typename M::Stats& s,
                 std::span<const double> terms) {
  if constexpr (StatsObjective<M>)
    return model.objective(s);
  else
    return exact_sum(comm, terms) + model.global_objective();
}

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
  std::vector<double> terms(StatsObjective<M> ? 0 : static_cast<std::size_t>(model.n_local_rows()));
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
    engine::reduce(stats, Reducer(comm));
    reduce_seconds += reduce.seconds();
    const double f = detail::objective(comm, model, std::as_const(stats), terms);
    if (!std::isfinite(f))
      throw Error("the " + run.objective_name + " is not finite at iteration " +
                  std::to_string(it));
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
