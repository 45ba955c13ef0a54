#pragma once
// The driver of gradient-based variational inference, written once for every model whose
// objective is a sum over rows plus a global term, F = sum_i f_i + g, fitted by minibatch
// stochastic gradients: the VAE (Kingma & Welling 2014, Algorithm 1), and next black-box VI with
// score or reparameterisation gradients (Ranganath, Gerrish & Blei 2014).
//
// One epoch (pass) over the N rows:
//
//   order          the Fisher-Yates permutation of [0, N) keyed by (seed, stream, epoch)
//                  (data/minibatch.hpp's shuffled_rows): the same on every rank
//   each step      B = the next batch_size positions of it, cut into micro-blocks of
//                  ceil(batch_size / micro_blocks) rows, whose number and layout depend on the
//                  batch size only; rank p computes a contiguous run of whole micro-blocks, one
//                  thread per micro-block (so every rank must be able to compute any row):
//     block          f_b = model.block(ws, rows, t, g_b): the objective of the block's rows and,
//                    into g_b, the gradient of -f_b; t is the optimiser's step count, the key of
//                    the step's random draws
//     exact reduction  each g_b in int64 fixed point on one grid 2^-k shared by every block (k
//                    from the largest |g| over all blocks, core/gradient_sum.hpp) and each f_b as
//                    the bits of its double (one owner each), in one allreduce of integers: the
//                    sums are independent of the rank and thread counts
//     global term    model.global_term(gg): g and, into gg, the gradient of -g (e.g. a log
//                    prior), computed identically on every rank; only if M::kGlobalTerm
//     update         the optimiser (engine/optimizer.hpp: Adam, Kingma & Ba 2015, or
//                    Robbins & Monro 1951) on sum_b g_b / |B| + gg / N, an unbiased estimate of
//                    the gradient of -F / N
//   objective      (the epoch's sum of f_b + g at the epoch's end) / N: the mean objective per
//                  row (the VAE's ELBO per row), each block's taken with the parameters of the
//                  step that visited it; an estimate, not a monotone one
//
// --max-iter counts epochs. Stop signals are agreed at every step boundary (one allreduce): a
// checkpoint holds the parameters (model/, the model's save), the optimiser's state and the
// position inside the epoch with the epoch's running sum (driver/), so a resume continues bit for
// bit, at the same or another rank count. --checkpoint-every N saves at every N-th epoch's end,
// Ts every T seconds at the next step boundary; the end of the last epoch is a boundary too.
#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "comm/comm.hpp"
#include "core/error.hpp"
#include "core/gradient_sum.hpp"
#include "core/parallel.hpp"
#include "core/rng.hpp"
#include "data/minibatch.hpp"
#include "engine/batch.hpp"
#include "engine/checkpoint.hpp"
#include "engine/optimizer.hpp"
#include "engine/run.hpp"
#include "engine/state.hpp"

namespace caviar::engine {

// What a gradient model provides. Its parameters are one float32 buffer (aligned: Params); a
// Workspace is one thread's scratch memory. block() and global_term() write every entry of g.
template <class M>
concept GradientModel = requires(M& m, const M& cm, typename M::Workspace& ws,
                                 std::span<const std::int64_t> rows, std::int64_t step, float* g,
                                 StateWriter& w, const StateReader& r) {
  { cm.make_workspace() } -> std::same_as<typename M::Workspace>;
  { m.params() } -> std::same_as<Params&>;
  { cm.block(ws, rows, step, g) } -> std::convertible_to<double>;  // rows: global indices
  { M::kGlobalTerm } -> std::convertible_to<bool>;
  { cm.global_term(g) } -> std::convertible_to<double>;  // g may be null: the value only
  cm.save(w);
  m.load(r);
};

// A model whose rows are not independent within a minibatch, such as a network with batch
// normalisation (Ioffe & Szegedy 2015), whose layers normalise with the statistics of the whole
// global minibatch. Its pass over a block runs in stages 0 .. reductions(): stage k < reductions()
// writes the block's partial sums (reduction_size(k) values) to `local`; the driver gathers every
// block's (in block order, from every rank), and model.combine() turns them into the values that
// stage k + 1 of every block starts from. The last stage writes the gradient and returns the
// objective, as block() does. With reductions() == 0 the driver calls block() instead.
template <class M>
concept StagedGradientModel = GradientModel<M> &&
    requires(M& m, const M& cm, typename M::Workspace& ws, std::span<const std::int64_t> rows,
             std::int64_t step, float* g, std::span<const double> in, std::span<double> out,
             std::vector<double>& combined) {
  { cm.reductions() } -> std::convertible_to<int>;
  { cm.reduction_size(0) } -> std::convertible_to<std::size_t>;
  { cm.stage(ws, 0, rows, step, in, out, g) } -> std::convertible_to<double>;
  m.combine(0, in, step, combined);
};

struct GradientSchedule {
  std::int64_t batch_size = 100;       // rows per global minibatch
  std::int64_t micro_blocks = 4;       // blocks per minibatch: a thread's unit of work
  std::uint64_t seed = 0;              // of the epoch permutations
  Stream order = Stream::kVaeShuffle;  // their stream (one per model, core/rng.hpp)
  // false: plain double sums, whose rounding depends on the rank count (only to measure what the
  // exact reduction costs)
  bool exact = true;
  OptimizerConfig optimizer;
};

struct GradientRun : Run {  // Run::rows is unused: any rank computes any row
  GradientSchedule schedule;
};

namespace detail {

// The gradient and objective buffers of the local micro-blocks, and the reduction's.
struct GradientBuffers {
  GradientBuffers(const Comm& comm, std::int64_t n_params, const GradientSchedule& s);
  std::int64_t np, m_rows, max_blocks, max_local;
  Params grads, g, gg;  // one slot of np per local block; the step's gradient; the global term's
  std::vector<double> block_f, block_max, dacc;
  std::vector<std::int64_t> iacc;
  int exponent = 0;  // of the last exact reduction's grid
};

// Step st's minibatch: positions [b0, b0 + bn) of the order, n_blocks micro-blocks, this rank's
// [lb0, lb1) of them.
struct StepBlocks {
  std::int64_t b0, bn, n_blocks, lb0, lb1;
};
StepBlocks step_blocks(const Comm& comm, std::int64_t n, std::int64_t batch, std::int64_t m_rows,
                       std::int64_t st);

// Collective: sums the local blocks' gradients and objectives over ranks; returns the minibatch's
// objective. Throws (on every rank) if a gradient is not finite.
double reduce_blocks(const Comm& comm, GradientBuffers& b, const StepBlocks& s, bool exact,
                     int epoch, std::int64_t st);

// g = the summed gradient / |B| (+ global_scale gg), then the optimiser's step on params.
void apply_step(Optimizer& opt, GradientBuffers& b, const StepBlocks& s, bool exact, float* params,
                double global_scale);

// The position inside an epoch: steps done, and the sum of their minibatches' objectives.
struct EpochPosition {
  std::int64_t step = 0;
  double sum = 0;
  void save(StateWriter& w) const;
  void load(const StateReader& r, std::int64_t steps);
};

struct GradientTimes {
  double local = 0, reduce = 0, update = 0;
};

// Local block lb's rows of step s (global row indices, positions of the epoch's order).
inline std::span<const std::int64_t> block_rows(const StepBlocks& s, const GradientBuffers& buf,
                                                const std::vector<std::int64_t>& order,
                                                std::int64_t lb) {
  const std::int64_t r0 = s.b0 + (s.lb0 + lb) * buf.m_rows;
  const std::int64_t rn = std::min(buf.m_rows, s.b0 + s.bn - r0);
  return {order.data() + r0, static_cast<std::size_t>(rn)};
}

// The step's exact reduction of the blocks' gradients and objectives, and the update.
template <GradientModel M>
double finish_step(M& model, Optimizer& opt, GradientBuffers& buf, const GradientRun& run,
                   const StepBlocks& s, int epoch, std::int64_t st, GradientTimes& times) {
  const Comm& comm = *run.comm;
  const GradientSchedule& sc = run.schedule;
  const Stopwatch reduce;
  const double f = reduce_blocks(comm, buf, s, sc.exact, epoch, st);
  times.reduce += reduce.seconds();
  const Stopwatch update;
  double global_scale = 0;
  if constexpr (M::kGlobalTerm) {
    model.global_term(buf.gg.data());
    global_scale = 1.0 / static_cast<double>(run.global_rows);
  }
  apply_step(opt, buf, s, sc.exact, model.params().data(), global_scale);
  times.update += update.seconds();
  return f;
}

// The local blocks of a staged model: one workspace per local block, which keeps the block's
// pass between stages. Each reduction gathers every block's partial sums in block order (ranks
// hold contiguous runs of blocks), so the combined values do not depend on the rank count.
template <GradientModel M>
void staged_blocks(M& model, const Comm& comm, GradientBuffers& buf,
                   std::vector<typename M::Workspace>& ws, const std::vector<std::int64_t>& order,
                   const StepBlocks& s, std::int64_t t) {
  const std::int64_t n_local = s.lb1 - s.lb0;
  const int n_red = model.reductions();
  std::vector<double> local, combined;
  for (int k = 0; k <= n_red; ++k) {
    const std::size_t m = k < n_red ? model.reduction_size(k) : 0;
    local.assign(static_cast<std::size_t>(n_local) * m, 0.0);
    parallel_blocks(n_local, 1, max_threads(), [&](int, std::int64_t lb, std::int64_t) {
      float* gb = buf.grads.data() + lb * buf.np;
      const double f =
          model.stage(ws[static_cast<std::size_t>(lb)], k, block_rows(s, buf, order, lb), t,
                      combined, std::span<double>(local.data() + lb * m, m), gb);
      if (k == n_red) {
        buf.block_f[lb] = f;
        buf.block_max[lb] = max_abs(gb, buf.np);
      }
    });
    if (k < n_red) {
      const std::vector<double> all = comm.allgatherv(local);
      model.combine(k, all, s.n_blocks, combined);
    }
  }
}

template <GradientModel M>
double gradient_step(M& model, Optimizer& opt, GradientBuffers& buf,
                     std::vector<typename M::Workspace>& ws, const GradientRun& run,
                     const std::vector<std::int64_t>& order, int epoch, std::int64_t st,
                     GradientTimes& times) {
  const Comm& comm = *run.comm;
  const GradientSchedule& sc = run.schedule;
  const StepBlocks s = step_blocks(comm, run.global_rows, sc.batch_size, buf.m_rows, st);
  const std::int64_t t = opt.steps();
  const Stopwatch local;
  if constexpr (StagedGradientModel<M>) {
    if (model.reductions() > 0) {
      staged_blocks(model, comm, buf, ws, order, s, t);
      times.local += local.seconds();
      return finish_step(model, opt, buf, run, s, epoch, st, times);
    }
  }
  parallel_blocks(s.lb1 - s.lb0, 1, static_cast<int>(ws.size()),
                  [&](int th, std::int64_t lb, std::int64_t) {
                    float* gb = buf.grads.data() + lb * buf.np;
                    buf.block_f[lb] = model.block(ws[th], block_rows(s, buf, order, lb), t, gb);
                    buf.block_max[lb] = max_abs(gb, buf.np);
                  });
  times.local += local.seconds();
  return finish_step(model, opt, buf, run, s, epoch, st, times);
}

}  // namespace detail

template <GradientModel M>
RunResult fit_gradient(M& model, const GradientRun& run) {
  const Comm& comm = *run.comm;
  Checkpointer& ck = *run.checkpoint;
  const GradientSchedule& sc = run.schedule;
  const std::int64_t n = run.global_rows, steps = (n + sc.batch_size - 1) / sc.batch_size;
  Optimizer opt(sc.optimizer, static_cast<std::int64_t>(model.params().size()));
  detail::EpochPosition pos;
  ck.restore_model([&](const StateReader& r) { model.load(r); });
  ck.restore_driver([&](const StateReader& r) {
    opt.load(r);
    pos.load(r, steps);
  });
  ck.restore_counters(run.counters);
  RunResult res;
  res.trace = ck.trace();
  res.iterations = ck.iteration();
  FitClock clock(ck.elapsed());
  detail::GradientBuffers buf(comm, static_cast<std::int64_t>(model.params().size()), sc);
  std::vector<typename M::Workspace> ws;
  // One per thread; a staged model keeps a block's pass between stages, so one per local block.
  std::int64_t n_ws = max_threads();
  if constexpr (StagedGradientModel<M>)
    if (model.reductions() > 0) n_ws = std::max(n_ws, buf.max_local);
  for (std::int64_t t = 0; t < n_ws; ++t) ws.push_back(model.make_workspace());
  detail::GradientTimes times;
  // Before step st of epoch `epoch` (1-based), with epoch - 1 epochs done.
  const auto boundary = [&](int epoch, std::int64_t st) {
    const std::string where =
        st == 0 && epoch > 1 ? "after epoch " + std::to_string(epoch - 1)
                             : "at epoch " + std::to_string(epoch) + ", step " + std::to_string(st);
    ck.boundary(
        {epoch - 1, st > 0, where}, res.trace, clock.elapsed(),
        [&](StateWriter& w) { model.save(w); }, {}, run.counters,
        [&](StateWriter& w) {
          opt.save(w);
          detail::EpochPosition{st, pos.sum}.save(w);
        });
  };
  for (int epoch = ck.iteration() + 1; epoch <= run.stop.max_iter; ++epoch) {
    const std::vector<std::int64_t> order =
        shuffled_rows(n, sc.seed, sc.order, static_cast<std::uint32_t>(epoch));
    for (; pos.step < steps; ++pos.step) {
      boundary(epoch, pos.step);
      pos.sum += detail::gradient_step(model, opt, buf, ws, run, order, epoch, pos.step, times);
    }
    double f = pos.sum;
    if constexpr (M::kGlobalTerm) f += model.global_term(nullptr);
    f /= static_cast<double>(n);
    pos = {};
    if (!std::isfinite(f))
      throw Error("training diverged at epoch " + std::to_string(epoch) +
                  " (non-finite objective); try a smaller --lr");
    const double prev = res.trace.objective.empty() ? f : res.trace.objective.back();
    detail::record(run.heldout, run.progress, clock, epoch, f, res);
    res.iterations = epoch;
    if (res.trace.objective.size() > 1 && std::abs(f - prev) / std::abs(f) < run.stop.tol) {
      res.converged = true;
      break;
    }
  }
  if (res.iterations == run.stop.max_iter) boundary(res.iterations + 1, 0);
  res.steps = opt.steps();
  detail::finish(comm, times.local, times.reduce, clock, res);
  res.update_seconds_max = comm.allreduce_max(times.update);
  return res;
}

}  // namespace caviar::engine
