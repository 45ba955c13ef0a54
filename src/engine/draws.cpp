#include "engine/draws.hpp"

#include <Eigen/Core>
#include <limits>

#include "core/gradient_sum.hpp"
#include "core/parallel.hpp"

namespace caviar::engine::detail {

DrawSums reduce_draws(const Comm& comm, int samples, std::int64_t width,
                      const std::vector<std::vector<std::int64_t>>& groups,
                      std::int64_t n_global_groups,
                      const std::function<void(std::int64_t, std::span<double>)>& block) {
  const std::int64_t r = samples * width, n_local = static_cast<std::int64_t>(groups.size());
  // One buffer for every call on this thread, written in full by the blocks: a step's values
  // are megabytes (at N = 1e6 a 1,024-row minibatch is about 1,000 groups of S x W), and a
  // fresh zeroed vector cost a memset and page faults at every step.
  // (The worker threads must see this thread's buffer, not their own: `all` is a plain pointer.)
  thread_local std::vector<double> vals;
  if (vals.size() < static_cast<std::size_t>(n_local * r))
    vals.resize(static_cast<std::size_t>(n_local * r));
  double* const all = vals.data();
  parallel_blocks(n_local, 1, max_threads(), [&](int, std::int64_t k, std::int64_t) {
    block(k, std::span<double>(all + k * r, static_cast<std::size_t>(r)));
  });
  // Per draw, the largest |value| over every group and rank; non-finite as +inf (MPI's max may
  // drop a NaN). A non-finite draw has no grid: it is dropped on every rank.
  std::vector<double> dmax(static_cast<std::size_t>(samples), 0.0);
  for (std::int64_t k = 0; k < n_local; ++k)
    for (int s = 0; s < samples; ++s) {
      const Eigen::Map<const Eigen::ArrayXd> v(vals.data() + k * r + s * width, width);
      double& m = dmax[static_cast<std::size_t>(s)];
      m = std::max(m, v.allFinite() ? v.abs().maxCoeff() : std::numeric_limits<double>::infinity());
    }
  DrawSums out;
  const Stopwatch max_watch;
  comm.allreduce_max(std::span<double>(dmax));
  out.reduce_seconds += max_watch.seconds();
  out.kept.assign(static_cast<std::size_t>(samples), 1);
  double gmax = 0;
  for (int s = 0; s < samples; ++s) {
    if (std::isfinite(dmax[static_cast<std::size_t>(s)])) {
      gmax = std::max(gmax, dmax[static_cast<std::size_t>(s)]);
    } else {
      out.kept[static_cast<std::size_t>(s)] = 0;
      ++out.dropped;
    }
  }
  const int e = fixed_point_exponent(gmax, std::max<std::int64_t>(1, n_global_groups));
  std::vector<std::int64_t> acc(static_cast<std::size_t>(r), 0);
  for (std::int64_t k = 0; k < n_local; ++k)
    for (int s = 0; s < samples; ++s)
      if (out.kept[static_cast<std::size_t>(s)])
        add_fixed_point(vals.data() + k * r + s * width, width, e, acc.data() + s * width);
  const Stopwatch sum_watch;
  comm.allreduce_sum(std::span<std::int64_t>(acc));
  out.reduce_seconds += sum_watch.seconds();
  out.sums.resize(static_cast<std::size_t>(r));
  from_fixed_point(acc.data(), r, e, 1.0, out.sums.data());
  return out;
}

std::vector<std::vector<std::int64_t>> minibatch_groups(std::int64_t n, RowRange rows,
                                                        std::int64_t batch, std::uint64_t seed,
                                                        std::int64_t t) {
  // Positions keyed by (seed, step, position): every rank draws the same B, keeps its own.
  const CounterRng rng(seed, Stream::kBbviBatch);
  std::vector<std::int64_t> local;
  for (std::int64_t b = 0; b < batch; b += 2) {
    const auto u = rng.uniform2(static_cast<std::uint64_t>(b / 2), static_cast<std::uint32_t>(t));
    for (int k = 0; k < 2 && b + k < batch; ++k) {
      const auto i = std::min(n - 1, static_cast<std::int64_t>(u[k] * static_cast<double>(n)));
      if (i >= rows.begin && i < rows.end) local.push_back(i);
    }
  }
  std::sort(local.begin(), local.end());
  std::vector<std::vector<std::int64_t>> groups;
  for (std::size_t i = 0; i < local.size(); ++i) {
    if (i == 0 || local[i] / kBlockRows != local[i - 1] / kBlockRows) groups.emplace_back();
    groups.back().push_back(local[i] - rows.begin);
  }
  return groups;
}

std::vector<std::vector<std::int64_t>> all_groups(RowRange rows) {
  std::vector<std::vector<std::int64_t>> groups;
  for (std::int64_t b = rows.begin; b < rows.end; b += kBlockRows) {
    groups.emplace_back();
    for (std::int64_t i = b; i < std::min(rows.end, b + kBlockRows); ++i)
      groups.back().push_back(i - rows.begin);
  }
  return groups;
}

ElboChanges elbo_changes(const std::vector<double>& elbo, std::int64_t window) {
  // Relative changes |(f_k - f_{k-1}) / f_k| of the last `window` evaluations.
  const auto n = static_cast<std::int64_t>(elbo.size());
  if (n < 2) return {};
  std::vector<double> rel;
  for (std::int64_t k = std::max<std::int64_t>(1, n - window); k < n; ++k)
    rel.push_back(std::abs((elbo[k] - elbo[k - 1]) / elbo[k]));
  double mean = 0;
  for (double v : rel) mean += v;
  mean /= static_cast<double>(rel.size());
  std::sort(rel.begin(), rel.end());
  const std::size_t m = rel.size();
  const double median = m % 2 ? rel[m / 2] : 0.5 * (rel[m / 2 - 1] + rel[m / 2]);
  return {mean, median, true};
}

bool elbo_converged(const std::vector<double>& elbo, std::int64_t window, double tol) {
  const ElboChanges c = elbo_changes(elbo, window);
  return c.valid && (c.mean < tol || c.median < tol);
}

bool elbo_diverging(const std::vector<double>& elbo, std::int64_t window) {
  const ElboChanges c = elbo_changes(elbo, window);
  return c.valid && (c.mean > 0.5 || c.median > 0.5);
}

std::int64_t steps_done(const StateReader& r, std::int64_t max_iter) {
  return r.attr_int("steps_done", 0, max_iter,
                    "the checkpoint's steps done (more than --max-iter?)");
}

}  // namespace caviar::engine::detail

namespace caviar::engine {

ElboRows elbo_rows(const Run& run, const DrawSchedule& s) {
  ElboRows e;
  if (s.elbo_rows <= 0 || s.elbo_rows >= run.global_rows) {
    e.groups = detail::all_groups(run.rows);
    e.n_global_groups = (run.global_rows + kBlockRows - 1) / kBlockRows;
    return e;
  }
  // Step 2^32 - 1 of the minibatch stream: beyond any optimiser step (--max-iter is an int).
  constexpr std::int64_t kElboRowsStep = 0xFFFFFFFF;
  e.groups =
      detail::minibatch_groups(run.global_rows, run.rows, s.elbo_rows, s.seed, kElboRowsStep);
  e.n_global_groups = s.elbo_rows;
  e.scale = static_cast<double>(run.global_rows) / static_cast<double>(s.elbo_rows);
  return e;
}

}  // namespace caviar::engine
