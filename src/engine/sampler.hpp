#pragma once
// The driver of Markov chains (Gibbs samplers), written once for every sampler model: the
// analogue of fit_batch (engine/batch.hpp) for a chain. Sweep t = 1..sweeps:
//
//   local step      model.local_step(t, stats, terms)   each rank, its own rows, any thread count:
//                   draws the rows' local variables (e.g. labels) given the current parameters,
//                   their statistics, and one log-joint term per row
//   exact reduction reduce(stats, Reducer(comm))          (engine/reduce.hpp)
//   log joint       exact_sum(terms) + model.global_log_density()   of the new local variables and
//                   the parameters they were drawn from
//   global draw     model.draw(t, stats)                   the parameters given the statistics
//
// After --burn-in sweeps, every --thin-th sweep's parameters are recorded (model.draw_state()).
// Each sweep's traces: the log joint, the model's counts (e.g. points per component), the
// seconds, and with held-out data its average log predictive density under the new parameters.
//
// Every random draw of a sampler model is keyed by (seed, sweep, global row or component), so
// the chain's state at a sweep boundary is the model's parameters (model.save) plus the traces
// and draws recorded so far (the checkpoint's "driver/"); a resumed chain gives the same bits as
// an uninterrupted one, at any rank and thread count.
#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "engine/batch.hpp"
#include "engine/checkpoint.hpp"

namespace caviar::engine {

struct ChainRule {
  int sweeps = 200;
  int burn_in = 0;  // sweeps before the first recorded draw
  int thin = 1;     // record every thin-th sweep after burn-in
  // The number of draws recorded after `done` sweeps.
  std::int64_t draws_after(int done) const { return done > burn_in ? (done - burn_in) / thin : 0; }
  bool records(int sweep) const { return sweep > burn_in && (sweep - burn_in) % thin == 0; }
};

template <class M>
concept SamplerModel = requires(M& m, const M& cm, typename M::Stats& s, std::uint64_t sweep,
                                std::span<double> terms, StateWriter& w, const StateReader& r) {
  { cm.make_stats() } -> std::same_as<typename M::Stats>;
  s.set_zero();
  { cm.n_local_rows() } -> std::convertible_to<std::int64_t>;
  m.local_step(sweep, s, terms);
  { cm.global_log_density() } -> std::convertible_to<double>;
  { cm.counts(std::as_const(s)) } -> std::same_as<std::vector<double>>;
  m.draw(sweep, std::as_const(s));
  { cm.draw_state() } -> std::same_as<std::vector<double>>;
  cm.save(w);
  m.load(r);
}
&&ReducibleStats<typename M::Stats>;

struct SamplerRun {
  const Comm* comm = nullptr;
  ChainRule rule;
  Checkpointer* checkpoint = nullptr;
  Progress progress;                // called on every rank after each sweep (may be empty)
  std::function<double()> heldout;  // collective held-out metric of the current parameters
  std::size_t count_width = 0;      // model.counts()'s length
  std::size_t draw_width = 0;       // model.draw_state()'s length
  RowRange rows;                    // this rank's rows (for a model's per-row state)
  std::int64_t global_rows = 0;
};

// A model whose chain state includes per-row variables (e.g. a collapsed sampler's labels)
// exposes them as local_states(); the driver checkpoints and restores them.
template <class M>
concept HasRowState = requires(M& m) {
  { m.local_states() } -> std::same_as<std::vector<LocalState>>;
};
// A model whose log joint is a function of the statistics it takes in draw() (a collapsed
// sampler) sets kLogJointAfterDraw; the driver then evaluates global_log_density() after draw().
template <class M>
constexpr bool log_joint_after_draw() {
  if constexpr (requires { M::kLogJointAfterDraw; })
    return M::kLogJointAfterDraw;
  else
    return false;
}

struct Chain {
  RunResult run;               // trace.objective: the log joint per sweep; iterations: sweeps done
  std::vector<double> counts;  // sweeps x count_width
  std::vector<double> draws;   // n_draws x draw_width
  std::int64_t n_draws = 0;
};

namespace detail {
// The recorded counts and draws as the checkpoint's driver state (absent while empty).
inline void save_chain(StateWriter& w, const Chain& c, const SamplerRun& run, int done) {
  const auto n = static_cast<std::uint64_t>(done);
  if (n > 0) w.array("counts", c.counts, {n, run.count_width});
  if (c.n_draws > 0)
    w.array("draws", c.draws, {static_cast<std::uint64_t>(c.n_draws), run.draw_width});
}
inline void load_chain(const StateReader& r, Chain& c, const SamplerRun& run, int done) {
  const auto n = static_cast<std::uint64_t>(done);
  c.n_draws = run.rule.draws_after(done);
  if (n > 0) c.counts = r.array("counts", {n, run.count_width});
  if (c.n_draws > 0)
    c.draws = r.array("draws", {static_cast<std::uint64_t>(c.n_draws), run.draw_width});
}
}  // namespace detail

// The chain's outputs for its file (write_model_file's save): trace/counts (sweeps x
// count_width) and draws/<part> (n_draws x the part's dims) for each part of `layout`.
inline void save_chain_outputs(StateWriter& w, const Chain& c, const std::vector<DrawPart>& layout,
                               std::size_t count_width) {
  const auto sweeps =
      static_cast<std::uint64_t>(c.counts.size() / std::max<std::size_t>(1, count_width));
  w.array("trace/counts", c.counts, {sweeps, count_width});
  std::size_t width = 0;
  for (const DrawPart& p : layout) {
    std::size_t n = 1;
    for (auto v : p.dims) n *= v;
    width += n;
  }
  std::size_t offset = 0;
  for (const DrawPart& p : layout) {
    std::size_t n = 1;
    for (auto v : p.dims) n *= v;
    std::vector<double> part;
    part.reserve(n * static_cast<std::size_t>(c.n_draws));
    for (std::int64_t i = 0; i < c.n_draws; ++i) {
      const auto* row = c.draws.data() + static_cast<std::size_t>(i) * width + offset;
      part.insert(part.end(), row, row + n);
    }
    Dims dims{static_cast<std::uint64_t>(c.n_draws)};
    dims.insert(dims.end(), p.dims.begin(), p.dims.end());
    w.array("draws/" + p.name, part, dims);
    offset += n;
  }
}

// Runs sweeps ck.iteration() + 1 .. rule.sweeps of a chain whose model holds its starting
// parameters (or, resuming, loads them from the checkpoint).
template <SamplerModel M>
Chain run_sampler(M& model, const SamplerRun& run) {
  const Comm& comm = *run.comm;
  Checkpointer& ck = *run.checkpoint;
  Chain chain;
  ck.restore_model([&](const StateReader& r) { model.load(r); });
  ck.restore_driver(
      [&](const StateReader& r) { detail::load_chain(r, chain, run, ck.iteration()); });
  const auto rows = [&] {
    std::vector<RowState> out;
    if constexpr (HasRowState<M>)
      for (LocalState& l : model.local_states()) out.push_back({l, run.global_rows, run.rows});
    return out;
  };
  for (const RowState& s : rows()) ck.restore_rows(s);
  chain.run.trace = ck.trace();
  FitClock clock(ck.elapsed());
  chain.run.iterations = ck.iteration();
  auto stats = model.make_stats();
  std::vector<double> terms(static_cast<std::size_t>(model.n_local_rows()));
  double local_seconds = 0, reduce_seconds = 0;
  for (int done = ck.iteration(); done < run.rule.sweeps; ++done) {
    // Sweep boundary: may checkpoint, or stop on a signal (every rank at once).
    ck.boundary(
        Position{done, false, "before sweep " + std::to_string(done + 1)}, chain.run.trace,
        clock.elapsed(), [&](StateWriter& w) { model.save(w); }, rows(), {},
        [&](StateWriter& w) { detail::save_chain(w, chain, run, done); });
    const int sweep = done + 1;
    stats.set_zero();
    const detail::Stopwatch local;
    model.local_step(static_cast<std::uint64_t>(sweep), stats, terms);
    local_seconds += local.seconds();
    const detail::Stopwatch reduce;
    engine::reduce(stats, Reducer(comm));
    reduce_seconds += reduce.seconds();
    const double terms_sum = exact_sum(comm, terms);
    const auto log_joint_now = [&] {
      const double v = terms_sum + model.global_log_density();
      if (!std::isfinite(v))
        throw Error("the log joint density is not finite at sweep " + std::to_string(sweep));
      return v;
    };
    double log_joint = 0;
    if constexpr (!log_joint_after_draw<M>()) log_joint = log_joint_now();
    const std::vector<double> c = model.counts(std::as_const(stats));
    chain.counts.insert(chain.counts.end(), c.begin(), c.end());
    model.draw(static_cast<std::uint64_t>(sweep), std::as_const(stats));
    if constexpr (log_joint_after_draw<M>()) log_joint = log_joint_now();
    if (run.rule.records(sweep)) {
      const std::vector<double> d = model.draw_state();
      chain.draws.insert(chain.draws.end(), d.begin(), d.end());
      ++chain.n_draws;
    }
    detail::record(run.heldout, run.progress, clock, sweep, log_joint, chain.run);
    chain.run.iterations = sweep;
  }
  detail::finish(comm, local_seconds, reduce_seconds, clock, chain.run);
  return chain;
}

}  // namespace caviar::engine
