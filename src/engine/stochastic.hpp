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
// --max-iter counts passes. Stop signals are agreed at every minibatch boundary (one allreduce). A
// checkpoint holds the model's globals (model/), the position inside the pass (driver/: the
// gradient driver's EpochPosition) and the pass's objective terms so far, one per row
// (rows/pass_terms, written by every rank in parallel): the pass's objective is one exact sum of
// all its row terms (engine/reduce.hpp), whose grid depends on every term, so the terms, not a
// running sum, are what a resume needs to continue bit for bit, at the same or another rank
// count. --checkpoint-every N saves at the start of every N-th pass, Ts every T seconds at the next
// minibatch boundary.
#include <algorithm>
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
#include "engine/gradient.hpp"
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
  std::int64_t first_t = 1;       // t of the first minibatch (Hoffman et al. 2010 count from 0)
  // false: a rank computes the minibatch's rows it owns (Run::rows; local indices). true: rank p
  // of P computes positions [B p / P, B (p + 1) / P) of each minibatch, whatever rows they are
  // (global indices): balanced minibatches when rows are read from a file, and rows must not
  // keep local state. The row terms are then kept by position in the pass (rank p holds
  // positions [N p / P, N (p + 1) / P)), exchanged after each minibatch.
  bool any_rank = false;
};

struct StochasticRun : Run {
  Schedule schedule;
};

namespace detail {

// Pass `pass`'s visiting order, a permutation of [0, N) the same on every rank: the model's own
// (M::pass_order), or data/minibatch.hpp's EpochPermutation keyed by (seed, pass).
template <class M>
std::vector<std::int64_t> pass_order(const M& model, std::int64_t n, std::uint64_t seed, int pass) {
  if constexpr (requires { model.pass_order(pass); }) {
    return model.pass_order(pass);
  } else {
    const EpochPermutation perm(static_cast<std::uint64_t>(n), seed,
                                static_cast<std::uint32_t>(pass));
    std::vector<std::int64_t> order(static_cast<std::size_t>(n));
    for (std::int64_t p = 0; p < n; ++p)
      order[p] = static_cast<std::int64_t>(perm(static_cast<std::uint64_t>(p)));
    return order;
  }
}

// One minibatch: positions [step B, step B + B) of the order; this rank's rows of it (local
// indices, increasing) through the local step, the exact reduction and the natural-gradient step
// with rho_t = (tau0 + t)^-kappa (Hoffman et al. 2013, section 2.4). Each row's objective term goes
// to row_terms (a row is visited once per pass).
template <StochasticModel M>
void stochastic_step(M& model, typename M::Stats& stats, const StochasticRun& run,
                     const std::vector<std::int64_t>& order, int pass, std::int64_t step,
                     std::span<double> row_terms, std::vector<double>& terms,
                     GradientTimes& times) {
  const Schedule& sc = run.schedule;
  const std::int64_t n = run.global_rows, steps = (n + sc.batch_size - 1) / sc.batch_size;
  const std::int64_t p0 = step * sc.batch_size, p1 = std::min(n, p0 + sc.batch_size);
  const Comm& comm = *run.comm;
  std::vector<std::int64_t> rows;
  std::vector<std::pair<std::int64_t, std::int64_t>> at;  // any_rank: (row, position)
  if (sc.any_rank) {
    const std::int64_t bn = p1 - p0, size = comm.size(), rank = comm.rank();
    for (std::int64_t p = p0 + bn * rank / size; p < p0 + bn * (rank + 1) / size; ++p)
      at.emplace_back(order[p], p);
    std::sort(at.begin(), at.end());
    for (const auto& [r, p] : at) rows.push_back(r);
  } else {
    for (std::int64_t p = p0; p < p1; ++p)
      if (order[p] >= run.rows.begin && order[p] < run.rows.end)
        rows.push_back(order[p] - run.rows.begin);
    std::sort(rows.begin(), rows.end());
  }
  terms.assign(rows.size(), 0.0);
  stats.set_zero();
  const Stopwatch local;
  model.local_step(stats, std::span<double>(terms), std::span<const std::int64_t>(rows));
  times.local += local.seconds();
  const Stopwatch reduce;
  engine::reduce(stats, Reducer(*run.comm));
  times.reduce += reduce.seconds();
  if (sc.any_rank) {
    // Every rank gets the minibatch's terms (a sum of one value and zeros: exact), and keeps
    // those of its own positions.
    std::vector<double> mb(static_cast<std::size_t>(p1 - p0), 0.0);
    for (std::size_t i = 0; i < at.size(); ++i) mb[at[i].second - p0] = terms[i];
    comm.allreduce_sum(std::span<double>(mb));
    const std::int64_t own = n * comm.rank() / comm.size();
    for (std::int64_t p = std::max(p0, own); p < std::min(p1, own + std::ssize(row_terms)); ++p)
      row_terms[p - own] = mb[p - p0];
  } else {
    for (std::size_t i = 0; i < rows.size(); ++i) row_terms[rows[i]] = terms[i];
  }
  const auto t = static_cast<double>(sc.first_t + static_cast<std::int64_t>(pass) * steps + step);
  model.update_stochastic(std::as_const(stats), std::pow(sc.tau0 + t, -sc.kappa),
                          static_cast<double>(n) / static_cast<double>(p1 - p0));
}

}  // namespace detail

template <StochasticModel M>
RunResult fit_stochastic(M& model, const StochasticRun& run) {
  const Comm& comm = *run.comm;
  Checkpointer& ck = *run.checkpoint;
  const Schedule& sc = run.schedule;
  const std::int64_t n = run.global_rows, steps = (n + sc.batch_size - 1) / sc.batch_size;
  // The pass's objective terms, one per local row (or position, any_rank): rows/pass_terms.
  const RowRange held =
      sc.any_rank ? RowRange{n * comm.rank() / comm.size(), n * (comm.rank() + 1) / comm.size()}
                  : run.rows;
  std::vector<double> row_terms(static_cast<std::size_t>(held.size()), 0.0);
  const RowState terms_state{{"pass_terms", row_terms.data(), 1, false, "row"}, n, held};
  detail::EpochPosition pos;
  ck.restore_model([&](const StateReader& r) { model.load(r); });
  ck.restore_driver([&](const StateReader& r) { pos.load(r, steps); });
  ck.restore_rows(terms_state);
  ck.restore_counters(run.counters);
  RunResult res;
  res.trace = ck.trace();
  res.iterations = ck.iteration();
  FitClock clock(ck.elapsed());
  auto stats = model.make_stats();
  std::vector<double> terms;
  detail::GradientTimes times;
  // Before minibatch st of pass `pass` (0-based), with `pass` passes done.
  const auto boundary = [&](int pass, std::int64_t st) {
    const std::string where =
        st == 0 ? "" : "at pass " + std::to_string(pass) + ", minibatch " + std::to_string(st);
    ck.boundary(
        {pass, st > 0, where}, res.trace, clock.elapsed(), [&](StateWriter& w) { model.save(w); },
        std::span<const RowState>(&terms_state, 1), run.counters,
        [&](StateWriter& w) {
          detail::EpochPosition{st, 0}.save(w);
        });
  };
  for (int pass = ck.iteration(); pass < run.stop.max_iter; ++pass) {
    const std::vector<std::int64_t> order = detail::pass_order(model, n, sc.seed, pass);
    for (; pos.step < steps; ++pos.step) {
      boundary(pass, pos.step);
      detail::stochastic_step(model, stats, run, order, pass, pos.step, row_terms, terms, times);
    }
    pos = {};
    if constexpr (requires { model.end_pass(); }) model.end_pass();
    const double f = exact_sum(comm, row_terms) + model.global_objective();
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
  detail::finish(comm, times.local, times.reduce, clock, res);
  return res;
}

}  // namespace caviar::engine
