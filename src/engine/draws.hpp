#pragma once
// The driver of black-box variational inference (Ranganath, Gerrish & Blei 2014; Kucukelbir et
// al. 2017) over rows SHARDED across ranks: each rank holds only its own contiguous rows
// (core/partition.hpp), unlike engine/gradient.hpp's driver, where any rank computes any row.
// What crosses ranks is not a gradient but per-draw quantities of a model's S shared draws.
//
//   each step t    the model draws its S parameter vectors keyed by (seed, t): the same on every
//                  rank; B global positions, one in each of B equal strata of the N rows,
//                  keyed by (seed, kBbviBatch, t, stratum): the same on every rank (doubly
//                  stochastic VI, Titsias & Lazaro-Gredilla 2014, with a stratified minibatch).
//                  Rank p makes and takes the positions inside its rows, each its own group: a
//                  group's row is the same whatever the rank count, one thread computes each
//                  group.
//     prepare        model.prepare(rows), if the model has it: the rows of a run of a thread's
//                    consecutive groups, before their blocks (per-row work done in large kernels)
//     block          model.block(rows, out): per draw, W values summed over the group's rows
//                    (the log-likelihood, and for reparameterisation its gradient in theta);
//                    model.block_node(rows, bounds, out), if the model has it, for a whole
//                    subtree of 2^l > 1 groups inside one run: the subtree's root, the groups'
//                    values added as the sum tree adds them, without writing them
//     sum            the groups' values summed pairwise over a fixed tree of the pass's groups
//                    in their global order (detail::tree_nodes): each rank sums the largest
//                    subtrees among its own groups, one allgather sends those O(log G) nodes,
//                    every rank adds the rest of the tree the same way: the sums are independent
//                    of ranks and threads
//     drop           a draw whose sum is not finite (a non-finite value in any group) is
//                    dropped on every rank and counted; more than half of the S in one step
//                    stops the fit
//     update         model.gradient(sums, kept, N / B, g): the gradient of -ELBO in lambda,
//                    computed identically on every rank; the optimiser's step (double)
//   every E steps  the ELBO estimate with the model's separate ELBO draws, summed the same
//                  way, over every row, or with elbo_rows = M < N over M positions drawn
//                  once (keyed by seed) and scaled by N / M: the same rows at every estimate, so
//                  the changes that the stopping rule compares are not blurred by a new
//                  subsample each time, and the cost stays M rows, not N. Stop, as Stan's ADVI does
//                  (Kucukelbir et al. 2017, section 3.3), when the mean or the median of the
//                  relative ELBO changes over a window of max(2, max_iter / (10 E)) evaluations
//                  falls below tol.
//
// --max-iter counts optimiser steps. Stop signals are agreed before every step. A checkpoint
// holds lambda (model/), the optimiser's state and the steps done (driver/) and the ELBO trace;
// its "iteration" is the number of ELBO estimates, so --checkpoint-every N saves after every N-th
// estimate (Ts: every T seconds, at the next step). Every draw is keyed by (seed, step), so a
// resume continues bit for bit, at the same or another rank count.
#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "comm/comm.hpp"
#include "core/error.hpp"
#include "core/parallel.hpp"
#include "core/partition.hpp"
#include "core/rng.hpp"
#include "engine/batch.hpp"
#include "engine/checkpoint.hpp"
#include "engine/draw_model.hpp"
#include "engine/optimizer.hpp"
#include "engine/run.hpp"

namespace caviar::engine {

struct DrawSchedule {
  std::int64_t batch_size = 1024;
  std::uint64_t seed = 0;
  int elbo_every = 100;
  std::int64_t elbo_rows = 0;  // rows of the ELBO estimates (0 or >= N: all)
  // The parameters of q the fit returns: the average of the iterates after this many steps, or
  // (-1) the last iterate.
  std::int64_t average_from = -1;
  OptimizerConfig optimizer;
};

struct DrawRun : Run {  // Run::rows: this rank's rows; Run::global_rows: N
  DrawSchedule schedule;
  // Called once (on every rank) with the step at which the ELBO estimates look divergent.
  std::function<void(std::int64_t)> diverging;
};

struct DrawResult : RunResult {
  std::int64_t dropped = 0;   // non-finite draws dropped (gradient steps and ELBO estimates)
  std::int64_t averaged = 0;  // iterates averaged into the returned parameters (0: the last one)
};

// A pass's groups: this rank's rows in groups (local indices, group by group, in CSR form): a full
// pass's by kBlockRows block, a minibatch's one position each; and where they sit in the list of
// every rank's groups, which does not depend on the rank count (shards are whole blocks,
// core/partition.hpp).
struct Groups {
  std::vector<std::int64_t> rows;        // local rows, group after group
  std::vector<std::int64_t> offsets{0};  // group k: rows[offsets[k], offsets[k + 1])
  std::int64_t first = 0;                // the global index of this rank's first group
  std::int64_t total = 0;                // groups over every rank
  // Where known (a minibatch given every rank's rows): every rank's first group in rank order,
  // then total. reduce_draws then knows every rank's share of the sum tree without asking.
  std::vector<std::int64_t> rank_first;
  std::int64_t size() const { return static_cast<std::int64_t>(offsets.size()) - 1; }
  std::span<const std::int64_t> group(std::int64_t k) const {
    return {rows.data() + offsets[static_cast<std::size_t>(k)],
            static_cast<std::size_t>(offsets[static_cast<std::size_t>(k) + 1] -
                                     offsets[static_cast<std::size_t>(k)])};
  }
};

namespace detail {

// Collective: per-draw sums over every rank's groups, the same bits at any rank and thread count;
// kept[s] = 0 for a draw whose sum is not finite.
struct DrawSums {
  std::vector<double> sums;
  std::vector<std::uint8_t> kept;
  int dropped = 0;
  double reduce_seconds = 0;  // in the allgather, waiting for other ranks included
};
// `prepare` (optional) is called, on the thread that computes them, with the rows of a run of
// consecutive groups before their blocks. `node` (optional) writes the node of the sum tree
// (below) over 2^l consecutive groups of one run, 0 < l, in place of their blocks: node(rows,
// bounds, out), the groups' rows one group after another, and their 2^l + 1 bounds (offsets
// into Groups::rows; group t is rows[bounds[t] - bounds[0], bounds[t + 1] - bounds[0])). It must
// give the bits of the blocks added pairwise as the tree adds them: node (1, i) = group 2i +
// group 2i + 1, node (2, i) = node (1, 2i) + node (1, 2i + 1), and so on.
DrawSums reduce_draws(
    const Comm& comm, int samples, std::int64_t width, const Groups& groups,
    const std::function<void(std::span<const std::int64_t>, std::span<double>)>& block,
    const std::function<void(std::span<const std::int64_t>)>& prepare = {},
    const std::function<void(std::span<const std::int64_t>, std::span<const std::int64_t>,
                             std::span<double>)>& node = {});

// The sum tree over a pass's groups (Groups::total of them, G): node (l, i) holds the sum of
// groups [i 2^l, min((i + 1) 2^l, G)), which is node (l - 1, 2i) + node (l - 1, 2i + 1), or node
// (l - 1, 2i) alone where the right half is empty, element by element; the root is (top, 0),
// 2^top >= G. Every sum in it is one double addition of fixed operands, so the root's bits
// depend on the groups' values alone, not on which rank or thread added what (pairwise
// summation: Higham 1993), and a rank sends O(log G) nodes, not its G / p groups.
//
// TreeStack builds the nodes inside one contiguous range of groups as their values arrive, in
// order, like a binary counter: a pushed node joins its left sibling on top of the stack into
// their parent, so O(log G) nodes wait and the values stay in cache (a pass's groups are
// megabytes, S x W values each, at N = 1e6 and B = 1,024).
class TreeStack {
 public:
  // `width` values per node, `total` groups in the pass (G).
  TreeStack(std::int64_t width, std::int64_t total);
  // Where to write the next node's values, then push(l, i) it (group k is the node (0, k)).
  double* next();
  void push(int level, std::int64_t index);
  // Copies the nodes of `other`, which follow this stack's in group order, onto it.
  void append(const TreeStack& other);
  // The same for nodes packed as packed() writes them (several ranks' one after another).
  void append(std::span<const double> packed);
  // The waiting nodes, packed as [l, i, width values] one after another: the largest nodes
  // inside the range pushed.
  std::vector<double> packed() const;
  // The root's values, once every group has been pushed; throws if some are missing. Zeros when
  // the pass has no group.
  std::vector<double> root() const;
  // The number of nodes packed() holds after groups [begin, end) of `total` were pushed, in any
  // split (the stack of a range does not depend on it).
  static std::int64_t nodes_of(std::int64_t begin, std::int64_t end, std::int64_t total);

 private:
  std::int64_t width_, total_;
  int top_;
  std::vector<std::pair<int, std::int64_t>> ids_;
  std::vector<double> values_;  // ids_.size() + 1 slots of width_ values
};

// The steps from one stop poll to the next (fit_draws): as many as take about kPollSeconds at the
// pace since the previous poll (`steps` steps in `seconds`), between 1 and kPollSteps. The poll
// is a collective, so it is not worth making every step when a step is a fifth of a millisecond;
// a step of a second would otherwise hold a SIGTERM for kPollSteps seconds.
inline constexpr std::int64_t kPollSteps = 16;
inline constexpr double kPollSeconds = 0.01;
std::int64_t poll_stride(double seconds, std::int64_t steps);

// Step t's minibatch on this rank: the stratified positions inside `rows`, as local indices, one
// group per position (groups.total = batch). With rank_rows (every rank's first row in rank
// order, then n; the ranks' rows one contiguous partition), also every rank's first group.
Groups minibatch_groups(std::int64_t n, RowRange rows, std::int64_t batch, std::uint64_t seed,
                        std::int64_t t, std::span<const std::int64_t> rank_rows = {});
// Every local row, grouped by block (n: the rows over every rank).
Groups all_groups(std::int64_t n, RowRange rows);

// A checkpoint's steps done (driver/steps_done), checked against --max-iter.
std::int64_t steps_done(const StateReader& r, std::int64_t max_iter);

// The mean and median of the relative changes |(f_k - f_{k-1}) / f_k| of the last `window` ELBO
// estimates (valid once there are two).
struct ElboChanges {
  double mean = 0, median = 0;
  bool valid = false;
};
ElboChanges elbo_changes(const std::vector<double>& elbo, std::int64_t window);
// Stan's ADVI stopping rule: the mean or the median below tol.
bool elbo_converged(const std::vector<double>& elbo, std::int64_t window, double tol);
// Stan's ADVI divergence warning: the mean or the median above 0.5 (checked after 100 steps).
bool elbo_diverging(const std::vector<double>& elbo, std::int64_t window);

}  // namespace detail

// Collective: a pass over the rows of `groups` with the model's current draws.
template <DrawModel M>
detail::DrawSums drawn_pass(const Comm& comm, const M& model, const Groups& groups) {
  std::function<void(std::span<const std::int64_t>)> prepare;
  if constexpr (requires(std::span<const std::int64_t> rows) { model.prepare(rows); })
    prepare = [&](std::span<const std::int64_t> rows) { model.prepare(rows); };
  std::function<void(std::span<const std::int64_t>, std::span<const std::int64_t>,
                     std::span<double>)>
      node;
  if constexpr (requires(std::span<const std::int64_t> rows, std::span<double> out) {
                  model.block_node(rows, rows, out);
                })
    node = [&](std::span<const std::int64_t> rows, std::span<const std::int64_t> bounds,
               std::span<double> out) { model.block_node(rows, bounds, out); };
  return detail::reduce_draws(
      comm, model.n_draws(), model.width(), groups,
      [&](std::span<const std::int64_t> rows, std::span<double> out) { model.block(rows, out); },
      prepare, node);
}

// Collective: a pass over the rows of `groups` with the model's draws (kind, t).
template <DrawModel M>
detail::DrawSums groups_pass(const Comm& comm, M& model, DrawKind kind, std::int64_t t,
                             const Groups& groups) {
  model.set_draws(kind, t);
  return drawn_pass(comm, model, groups);
}

// Collective: a full pass over every rank's rows with the model's draws (kind, t).
template <DrawModel M>
detail::DrawSums full_pass(const Comm& comm, M& model, const Run& run, DrawKind kind,
                           std::int64_t t) {
  return groups_pass(comm, model, kind, t, detail::all_groups(run.global_rows, run.rows));
}

// The rows of the ELBO estimates: every row, or elbo_rows positions drawn once with the
// minibatches' stream at a step no fit reaches; the scale of their log-likelihood sums.
struct ElboRows {
  Groups groups;
  double scale = 1;
};
ElboRows elbo_rows(const Run& run, const DrawSchedule& s,
                   std::span<const std::int64_t> rank_rows = {});

template <DrawModel M>
DrawResult fit_draws(M& model, const DrawRun& run) {
  const Comm& comm = *run.comm;
  Checkpointer& ck = *run.checkpoint;
  const DrawSchedule& sc = run.schedule;
  BasicParams<double>& lambda = model.params();
  BasicOptimizer<double> opt(sc.optimizer, static_cast<std::int64_t>(lambda.size()));
  BasicParams<double> g(lambda.size());
  DrawResult res;
  std::int64_t t0 = 0;
  const std::vector<Counter> counters{{"dropped_draws", &res.dropped}};
  // Iterate averaging (Ruppert 1988; Polyak & Juditsky 1992): under a constant step the iterates
  // fluctuate around the optimum, and their mean after step A is much closer to it than the last
  // one. The sum is kept in double, the same on every rank, and checkpointed with its count.
  const bool averaging = sc.average_from >= 0;
  const auto n_lambda = static_cast<std::int64_t>(lambda.size());
  std::vector<double> avg_sum(averaging ? lambda.size() : 0, 0.0);
  std::int64_t avg_count = 0;
  ck.restore_model([&](const StateReader& r) { model.load(r); });
  ck.restore_driver([&](const StateReader& r) {
    opt.load(r);
    t0 = detail::steps_done(r, run.stop.max_iter);
    if (averaging) {
      avg_count = r.attr_int("average_count", 0, t0, "the checkpoint's averaged iterates");
      avg_sum = r.array("average_sum", Dims{static_cast<std::uint64_t>(n_lambda)});
    }
  });
  ck.restore_counters(counters);
  res.trace = ck.trace();
  res.steps = t0;
  FitClock clock(ck.elapsed());
  // Before step t + 1 (t steps done): a count boundary right after an ELBO estimate. The stop
  // poll is a collective: it runs at every count boundary, at the end, and otherwise every
  // detail::poll_stride steps, which rank 0 proposes from its pace since the previous poll and
  // the poll itself carries to every rank.
  std::int64_t next_poll = t0, polled_at = t0;
  double polled_seconds = clock.elapsed();
  const auto boundary = [&](std::int64_t t, bool last) {
    const bool estimate = t > 0 && t % sc.elbo_every == 0;
    if (!estimate && !last && t < next_poll) return;
    const double now = clock.elapsed();
    const std::int64_t stride = ck.boundary(
        {static_cast<int>(res.trace.objective.size()), !estimate,
         "before step " + std::to_string(t + 1),
         detail::poll_stride(now - polled_seconds, t - polled_at)},
        res.trace, now, [&](StateWriter& w) { model.save(w); }, {}, counters,
        [&](StateWriter& w) {
          opt.save(w);
          w.attr("steps_done", t);
          if (averaging) {
            w.attr("average_count", avg_count);
            w.array("average_sum", avg_sum, Dims{static_cast<std::uint64_t>(n_lambda)});
          }
        });
    next_poll = t + std::max<std::int64_t>(1, stride);
    polled_at = t;
    polled_seconds = now;
  };
  double local_seconds = 0, reduce_seconds = 0;
  const std::int64_t window =
      std::max<std::int64_t>(2, run.stop.max_iter / (10 * std::int64_t{sc.elbo_every}));
  const double scale = static_cast<double>(run.global_rows) / static_cast<double>(sc.batch_size);
  // Every rank's first row, then N: each minibatch then carries every rank's first group, and
  // its reduction needs no exchange of sizes (one collective a step fewer).
  std::vector<std::int64_t> rank_rows = comm.allgather(run.rows.begin);
  rank_rows.push_back(run.global_rows);
  comm.raise_if_any(rank_rows[static_cast<std::size_t>(comm.rank()) + 1] == run.rows.end
                        ? ""
                        : "internal: the ranks' rows are not one partition in rank order");
  const ElboRows er = elbo_rows(run, sc, rank_rows);
  bool warned = false;
  for (std::int64_t t = t0; t < run.stop.max_iter; ++t) {
    boundary(t, false);
    const detail::Stopwatch local;
    // The step's minibatch and draws depend on neither each other nor the data: with two
    // threads, at once (every rank repeats them, and the other thread would only wait). Two
    // blocks of one item each; with one thread, one after the other.
    Groups groups;
    parallel_blocks(2, 1, std::min(2, max_threads()), [&](int, std::int64_t b, std::int64_t) {
      if (b == 0)
        groups = detail::minibatch_groups(run.global_rows, run.rows, sc.batch_size, sc.seed, t,
                                          rank_rows);
      else
        model.set_draws(DrawKind::kGradient, t);
    });
    const detail::DrawSums d = drawn_pass(comm, model, groups);
    local_seconds += local.seconds() - d.reduce_seconds;
    reduce_seconds += d.reduce_seconds;
    res.dropped += d.dropped;
    if (2 * d.dropped > model.n_draws())
      throw Error("too many non-finite draws at step " + std::to_string(t + 1) + " (" +
                  std::to_string(d.dropped) + " of " + std::to_string(model.n_draws()) +
                  "); try a smaller --lr or --prior-scale");
    model.gradient(d.sums, d.kept, scale, g);
    opt.begin_step();
    opt.update(lambda.data(), g.data(), 0, static_cast<std::int64_t>(lambda.size()));
    res.steps = t + 1;
    if (averaging && t + 1 > sc.average_from) {
      for (std::int64_t i = 0; i < n_lambda; ++i)
        avg_sum[static_cast<std::size_t>(i)] += lambda[static_cast<std::size_t>(i)];
      ++avg_count;
    }
    if ((t + 1) % sc.elbo_every != 0 && t + 1 != run.stop.max_iter) continue;
    const detail::DrawSums e = groups_pass(comm, model, DrawKind::kElbo, t + 1, er.groups);
    res.dropped += e.dropped;
    const double f = model.elbo(e.sums, e.kept, er.scale);
    if (!std::isfinite(f))
      throw Error("the ELBO estimate is not finite at step " + std::to_string(t + 1) +
                  "; try a smaller --lr");
    detail::record(run.heldout, run.progress, clock, static_cast<int>(t + 1), f, res);
    if (!warned && t + 1 > 100 && detail::elbo_diverging(res.trace.objective, window)) {
      warned = true;
      if (run.diverging) run.diverging(t + 1);
    }
    if (detail::elbo_converged(res.trace.objective, window, run.stop.tol)) {
      res.converged = true;
      break;
    }
  }
  if (res.steps == run.stop.max_iter && !res.converged) boundary(res.steps, true);
  if (avg_count > 0)
    for (std::int64_t i = 0; i < n_lambda; ++i)
      lambda[static_cast<std::size_t>(i)] =
          avg_sum[static_cast<std::size_t>(i)] / static_cast<double>(avg_count);
  res.averaged = avg_count;
  res.iterations = static_cast<int>(res.steps);
  detail::finish(comm, local_seconds, reduce_seconds, clock, res);
  return res;
}

}  // namespace caviar::engine
