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
// Opt-in, for a model that needs them (the mixture's SVI, models/gmm/svi.hpp): its own step
// objective in place of row terms, its own step size, a per-step hook, every rank computing the
// whole minibatch (Schedule::every_rank), and a stop after the objective decreased for a number
// of passes (Schedule::max_decreases); see StepObjectiveModel below. Without them a model's
// steps, objective and checkpoints are what they were.
//
// --max-iter counts passes. Stop signals are agreed at every minibatch boundary (one allreduce). A
// checkpoint holds the model's globals (model/), the position inside the pass (driver/: the
// gradient driver's EpochPosition) and the pass's objective terms so far, one per row
// (rows/pass_terms, written by every rank in parallel): the pass's objective is one exact sum of
// all its row terms (engine/reduce.hpp), whose grid depends on every term, so the terms, not a
// running sum, are what a resume needs to continue bit for bit, at the same or another rank
// count. (A model with a step objective has no row terms: the pass's running sum of step
// objectives, the same on every rank, is saved under driver/ instead.) --checkpoint-every N saves
// at the start of every N-th pass, Ts every T seconds at the next minibatch boundary.
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
  // true: every rank computes every row of each minibatch (global indices, increasing), and the
  // statistics are combined over that one process (Reducer::local()), not summed over ranks: for
  // a model whose exact sum needs the whole minibatch in one place (the mixture: a few hundred
  // rows have no split into its 256-row exact blocks that is the same at every rank count). The
  // model fetches the rows it does not hold through a collective reader of its own.
  bool every_rank = false;
  // > 0: also stop once the objective has decreased for this many passes in a row (stop reason
  // "objective-decreased"; the rule of Bruno 2022, section 2.2.2, with 3).
  int max_decreases = 0;
};

struct StochasticRun : Run {
  Schedule schedule;
};

// Optional parts of a stochastic model, each used when present:
//   step_objective(s, N / |B|)   the objective of a step, from the minibatch's summed statistics
//                                (the GMM: the stochastic ELBO, Bruno 2022, eq. 2.52); a pass's
//                                objective is then the steps' values weighted by |B| / N, plus
//                                global_objective(), in place of the sum of row terms
//   step_size(s, N / |B|, rho)   the step size to take instead of the Robbins-Monro rho (e.g.
//                                the adaptive rate of Ranganath et al. 2013)
//   end_step(seconds)            after each step, with the fit's seconds so far: per-step traces
//                                and diagnostics, whose own time the fit's clock does not count
template <class M>
concept StepObjectiveModel = requires(M& m, const typename M::Stats& s, double x) {
  { m.step_objective(s, x) } -> std::convertible_to<double>;
};
template <class M>
concept StepSizeModel = requires(M& m, const typename M::Stats& s, double x) {
  { m.step_size(s, x, x) } -> std::convertible_to<double>;
};
template <class M>
concept StepEndModel = requires(M& m, double x) {
  m.end_step(x);
};

// Which rows a rank computed for one minibatch: `rows` as given to local_step, and with
// any_rank, each row's index in the minibatch.
struct StepRows {
  std::vector<std::int64_t> rows;
  std::vector<std::pair<std::int64_t, std::int64_t>> at;  // any_rank: (row, index in batch)
};

// This rank's rows of a minibatch (`batch`: its global rows in visiting order), as
// Schedule::any_rank and every_rank describe.
inline StepRows step_rows(const StochasticRun& run, std::span<const std::int64_t> batch) {
  const Schedule& sc = run.schedule;
  StepRows s;
  if (sc.any_rank) {
    const auto bn = static_cast<std::int64_t>(batch.size());
    const std::int64_t size = run.comm->size(), rank = run.comm->rank();
    for (std::int64_t i = bn * rank / size; i < bn * (rank + 1) / size; ++i)
      s.at.emplace_back(batch[i], i);
    std::sort(s.at.begin(), s.at.end());
    for (const auto& [r, i] : s.at) s.rows.push_back(r);
    return s;
  }
  for (const std::int64_t r : batch)
    if (sc.every_rank)
      s.rows.push_back(r);
    else if (r >= run.rows.begin && r < run.rows.end)
      s.rows.push_back(r - run.rows.begin);
  std::sort(s.rows.begin(), s.rows.end());
  return s;
}

// A pass's visiting order, a permutation of [0, N) the same on every rank: the model's own
// (M::pass_order, held whole), or data/minibatch.hpp's EpochPermutation keyed by (seed, pass),
// computed pointwise one minibatch at a time (O(B) memory per rank, not O(N)).
class PassOrder {
 public:
  PassOrder(std::int64_t n, std::uint64_t seed, std::uint32_t pass,
            std::vector<std::int64_t> given = {})
      : perm_(static_cast<std::uint64_t>(n), seed, pass), given_(std::move(given)) {}
  // The global rows at positions [p0, p1).
  std::span<const std::int64_t> batch(std::int64_t p0, std::int64_t p1) {
    if (!given_.empty()) return {given_.data() + p0, static_cast<std::size_t>(p1 - p0)};
    rows_.resize(static_cast<std::size_t>(p1 - p0));
    for (std::int64_t p = p0; p < p1; ++p)
      rows_[p - p0] = static_cast<std::int64_t>(perm_(static_cast<std::uint64_t>(p)));
    return rows_;
  }

 private:
  EpochPermutation perm_;
  std::vector<std::int64_t> given_, rows_;
};

// The statistics of one minibatch (`batch`: its global rows in visiting order) under the current
// globals, combined over ranks as a step of fit_stochastic combines them (no update): this rank's
// rows through the local step (one term per row into `terms`), then the exact reduction. Also for
// a model's own estimates outside the passes (the adaptive step size's first averages).
template <StochasticModel M>
StepRows minibatch_stats(M& model, typename M::Stats& stats, const StochasticRun& run,
                         std::span<const std::int64_t> batch, std::vector<double>& terms,
                         detail::GradientTimes* times = nullptr) {
  StepRows s = step_rows(run, batch);
  terms.assign(s.rows.size(), 0.0);
  stats.set_zero();
  const detail::Stopwatch local;
  model.local_step(stats, std::span<double>(terms), std::span<const std::int64_t>(s.rows));
  const double local_seconds = local.seconds();
  const detail::Stopwatch reduce;
  engine::reduce(stats, run.schedule.every_rank ? Reducer::local() : Reducer(*run.comm));
  if (times) {
    times->local += local_seconds;
    times->reduce += reduce.seconds();
  }
  return s;
}

namespace detail {

template <class M>
PassOrder pass_order(const M& model, std::int64_t n, std::uint64_t seed, int pass) {
  if constexpr (requires { model.pass_order(pass); })
    return PassOrder(n, seed, static_cast<std::uint32_t>(pass), model.pass_order(pass));
  else
    return PassOrder(n, seed, static_cast<std::uint32_t>(pass));
}

// Keeps the row terms of minibatch positions [p0, p0 + |terms|) that this rank holds in row_terms
// (a row is visited once per pass). any_rank: every rank gets the minibatch's terms (a sum of one
// value and zeros: exact), and keeps those of its own positions.
inline void keep_terms(const StochasticRun& run, const StepRows& s, std::int64_t p0,
                       std::int64_t p1, const std::vector<double>& terms,
                       std::span<double> row_terms) {
  const Schedule& sc = run.schedule;
  const Comm& comm = *run.comm;
  if (sc.any_rank) {
    std::vector<double> mb(static_cast<std::size_t>(p1 - p0), 0.0);
    for (std::size_t i = 0; i < s.at.size(); ++i) mb[s.at[i].second] = terms[i];
    comm.allreduce_sum(std::span<double>(mb));
    const std::int64_t own = run.global_rows * comm.rank() / comm.size();
    for (std::int64_t p = std::max(p0, own); p < std::min(p1, own + std::ssize(row_terms)); ++p)
      row_terms[p - own] = mb[p - p0];
  } else {
    for (std::size_t i = 0; i < s.rows.size(); ++i) {
      const std::int64_t r = sc.every_rank ? s.rows[i] - run.rows.begin : s.rows[i];
      if (r >= 0 && r < std::ssize(row_terms)) row_terms[r] = terms[i];
    }
  }
}

// One minibatch: positions [step B, step B + B) of the order; its statistics (minibatch_stats)
// and the natural-gradient step with rho_t = (tau0 + t)^-kappa (Hoffman et al. 2013, section 2.4)
// or the model's step_size. Row terms go to row_terms; returns the model's step objective times
// |B| (0 without one).
template <StochasticModel M>
double stochastic_step(M& model, typename M::Stats& stats, const StochasticRun& run,
                       PassOrder& order, int pass, std::int64_t step, std::span<double> row_terms,
                       std::vector<double>& terms, GradientTimes& times) {
  const Schedule& sc = run.schedule;
  const std::int64_t n = run.global_rows, steps = (n + sc.batch_size - 1) / sc.batch_size;
  const std::int64_t p0 = step * sc.batch_size, p1 = std::min(n, p0 + sc.batch_size);
  const StepRows s = minibatch_stats(model, stats, run, order.batch(p0, p1), terms, &times);
  if constexpr (!StepObjectiveModel<M>) keep_terms(run, s, p0, p1, terms, row_terms);
  const auto t = static_cast<double>(sc.first_t + static_cast<std::int64_t>(pass) * steps + step);
  const double scale = static_cast<double>(n) / static_cast<double>(p1 - p0);
  double weighted = 0;
  if constexpr (StepObjectiveModel<M>)
    weighted = model.step_objective(std::as_const(stats), scale) * static_cast<double>(p1 - p0);
  double rho = std::pow(sc.tau0 + t, -sc.kappa);
  if constexpr (StepSizeModel<M>) rho = model.step_size(std::as_const(stats), scale, rho);
  model.update_stochastic(std::as_const(stats), rho, scale);
  return weighted;
}

// After pass `pass` (its objective last in res.trace): whether the fit stops, on --tol's relative
// change or on Schedule::max_decreases consecutive decreases; sets converged and stop_reason.
inline bool pass_stops(const StochasticRun& run, int pass, RunResult& res) {
  const std::vector<double>& f = res.trace.objective;
  const double now = f.back(),
               prev = f.size() > 1 ? f[f.size() - 2] : std::numeric_limits<double>::quiet_NaN();
  if (pass > 0 && std::abs(now - prev) / std::abs(now) < run.stop.tol) {
    res.converged = true;
    res.stop_reason = "tol";
    return true;
  }
  int decreases = 0;
  for (std::size_t i = f.size() - 1; i > 0 && f[i] < f[i - 1]; --i) ++decreases;
  if (run.schedule.max_decreases > 0 && decreases >= run.schedule.max_decreases) {
    res.stop_reason = "objective-decreased";
    return true;
  }
  return false;
}

}  // namespace detail

template <StochasticModel M>
RunResult fit_stochastic(M& model, const StochasticRun& run) {
  constexpr bool kRowTerms = !StepObjectiveModel<M>;
  const Comm& comm = *run.comm;
  Checkpointer& ck = *run.checkpoint;
  const Schedule& sc = run.schedule;
  const std::int64_t n = run.global_rows, steps = (n + sc.batch_size - 1) / sc.batch_size;
  // The pass's objective terms, one per local row (or position, any_rank): rows/pass_terms.
  const RowRange held =
      !kRowTerms    ? RowRange{0, 0}
      : sc.any_rank ? RowRange{n * comm.rank() / comm.size(), n * (comm.rank() + 1) / comm.size()}
                    : run.rows;
  std::vector<double> row_terms(static_cast<std::size_t>(held.size()), 0.0);
  const RowState terms_state{{"pass_terms", row_terms.data(), 1, false, "row"}, n, held};
  const std::span<const RowState> row_states(&terms_state, kRowTerms ? 1 : 0);
  detail::EpochPosition pos;
  ck.restore_model([&](const StateReader& r) { model.load(r); });
  ck.restore_driver([&](const StateReader& r) { pos.load(r, steps); });
  if (kRowTerms) ck.restore_rows(terms_state);
  ck.restore_counters(run.counters);
  RunResult res;
  res.trace = ck.trace();
  res.iterations = ck.iteration();
  res.stop_reason = "max-iter";
  FitClock clock(ck.elapsed());
  auto stats = model.make_stats();
  std::vector<double> terms;
  detail::GradientTimes times;
  // Before minibatch st of pass `pass` (0-based), with `pass` passes done.
  const auto boundary = [&](int pass, const detail::EpochPosition& at) {
    const std::string where =
        at.step == 0 ? ""
                     : "at pass " + std::to_string(pass) + ", minibatch " + std::to_string(at.step);
    ck.boundary(
        {pass, at.step > 0, where}, res.trace, clock.elapsed(),
        [&](StateWriter& w) { model.save(w); }, row_states, run.counters,
        [&](StateWriter& w) { at.save(w); });
  };
  for (int pass = ck.iteration(); pass < run.stop.max_iter; ++pass) {
    PassOrder order = detail::pass_order(model, n, sc.seed, pass);
    for (; pos.step < steps; ++pos.step) {
      boundary(pass, pos);
      pos.sum += detail::stochastic_step(model, stats, run, order, pass, pos.step, row_terms, terms,
                                         times);
      if constexpr (StepEndModel<M>) {
        const double seconds = clock.elapsed();
        clock.excluding([&] { model.end_step(seconds); });
      }
    }
    if constexpr (requires { model.end_pass(); }) model.end_pass();
    const double part = kRowTerms ? exact_sum(comm, row_terms) : pos.sum / static_cast<double>(n);
    pos = {};
    const double f = part + model.global_objective();
    if (!std::isfinite(f))
      throw Error("the objective is not finite at pass " + std::to_string(pass));
    detail::record(run.heldout, run.progress, clock, pass, f, res);
    res.iterations = pass + 1;
    if (detail::pass_stops(run, pass, res)) break;
  }
  detail::finish(comm, times.local, times.reduce, clock, res);
  return res;
}

}  // namespace caviar::engine
