#pragma once
// The driver of stochastic variational inference (SVI) for conjugate models, written once for every
// model whose rows are independent given the globals (Hoffman, Blei, Wang & Paisley 2013,
// section 2.4; for hidden Markov models with whole sequences as rows, Foti, Xu, Laird & Fox 2014).
//
// One pass (epoch) over the N rows:
//
//   order           a permutation of [0, N) keyed by (seed, pass) (data/minibatch.hpp): the same
//                   minibatches for any number of ranks
//   each minibatch  B = the next batch_size positions of the permutation
//     local step      model.local_step(stats, terms, rows)   each rank, the rows of B it owns
//     exact reduction reduce(stats, Reducer(comm))           integers: independent of the split
//     global step     model.update_stochastic(stats, rho_t, N / |B|): the natural-gradient step
//                     lambda <- (1 - rho_t) lambda + rho_t (prior + N / |B| stats), with
//                     rho_t = (tau0 + t)^-kappa for the t-th minibatch, t = 1, 2, ... (Robbins &
//                     Monro 1951; Hoffman et al. 2013, section 2.4)
//   objective       exact_sum(the pass's row terms) + model.global_objective(): an estimate of the
//                   ELBO, each row's term taken with the globals of the step that visited it
//
// --max-iter counts passes. Checkpoints and stop signals are taken at pass boundaries only, so a
// resume continues bit for bit from the start of a pass.
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
#include "data/minibatch.hpp"
#include "engine/batch.hpp"
#include "engine/checkpoint.hpp"
#include "engine/reduce.hpp"
#include "engine/run.hpp"
#include "engine/state.hpp"

namespace caviar::engine {

// What a stochastic conjugate model provides: the batch model's statistics, a local step over a
// subset of its rows (local indices, increasing; one objective term per listed row) and the
// natural-gradient step.
template <class M>
concept StochasticModel = requires(M& m, const M& cm, typename M::Stats& s, std::span<double> terms,
                                   std::span<const std::int64_t> rows, StateWriter& w,
                                   const StateReader& r, double x) {
  { cm.make_stats() } -> std::same_as<typename M::Stats>;
  s.set_zero();
  m.local_step(s, terms, rows);
  { cm.global_objective() } -> std::convertible_to<double>;
  m.update_stochastic(std::as_const(s), x, x);  // (stats, rho, N / |B|)
  cm.save(w);
  m.load(r);
}
&&ReducibleStats<typename M::Stats>;

struct Schedule {
  std::int64_t batch_size = 100;  // rows per global minibatch
  double tau0 = 1, kappa = 0.7;   // rho_t = (tau0 + t)^-kappa
  std::uint64_t seed = 0;         // of the minibatch order
};

struct StochasticRun : Run {
  Schedule schedule;
};

template <StochasticModel M>
RunResult fit_stochastic(M& model, const StochasticRun& run) {
  const Comm& comm = *run.comm;
  Checkpointer& ck = *run.checkpoint;
  const Schedule& sc = run.schedule;
  ck.restore_model([&](const StateReader& r) { model.load(r); });
  ck.restore_counters(run.counters);
  RunResult res;
  res.trace = ck.trace();
  FitClock clock(ck.elapsed());
  auto stats = model.make_stats();
  const std::int64_t n = run.global_rows, steps = (n + sc.batch_size - 1) / sc.batch_size;
  std::vector<double> terms, pass_terms;
  double local_seconds = 0, reduce_seconds = 0;
  for (int pass = ck.iteration(); pass < run.stop.max_iter; ++pass) {
    ck.boundary(
        pass, res.trace, clock.elapsed(), [&](StateWriter& w) { model.save(w); }, {}, run.counters);
    const EpochPermutation perm(static_cast<std::uint64_t>(n), sc.seed,
                                static_cast<std::uint32_t>(pass));
    pass_terms.clear();
    for (std::int64_t step = 0; step < steps; ++step) {
      std::int64_t batch = 0;
      std::vector<std::int64_t> rows =
          minibatch_rows(perm, n, sc.batch_size, step, run.rows, &batch);
      for (std::int64_t& r : rows) r -= run.rows.begin;
      terms.assign(rows.size(), 0.0);
      stats.set_zero();
      const detail::Stopwatch local;
      model.local_step(stats, terms, std::as_const(rows));
      local_seconds += local.seconds();
      const detail::Stopwatch reduce;
      engine::reduce(stats, Reducer(comm));
      reduce_seconds += reduce.seconds();
      pass_terms.insert(pass_terms.end(), terms.begin(), terms.end());
      const double t = static_cast<double>(static_cast<std::int64_t>(pass) * steps + step + 1);
      model.update_stochastic(std::as_const(stats), std::pow(sc.tau0 + t, -sc.kappa),
                              static_cast<double>(n) / static_cast<double>(batch));
    }
    const double f = exact_sum(comm, pass_terms) + model.global_objective();
    if (!std::isfinite(f))
      throw Error("the objective is not finite at pass " + std::to_string(pass));
    const double prev = res.trace.objective.empty() ? std::numeric_limits<double>::quiet_NaN()
                                                    : res.trace.objective.back();
    detail::record(run.heldout, run.progress, clock, pass, f, res);
    res.iterations = pass + 1;
    if (pass > 0 && std::abs(f - prev) / std::abs(f) < run.stop.tol) {
      res.converged = true;
      break;
    }
  }
  detail::finish(comm, local_seconds, reduce_seconds, clock, res);
  return res;
}

}  // namespace caviar::engine
