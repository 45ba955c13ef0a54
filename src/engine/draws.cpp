#include "engine/draws.hpp"

#include <Eigen/Core>
#include <algorithm>
#include <array>
#include <utility>

#include "core/error.hpp"
#include "core/parallel.hpp"

namespace caviar::engine::detail {

namespace {

// The level l of the largest whole subtree of the sum tree that starts at group g and holds at
// most `room` groups: node (l, g / 2^l).
int subtree_level(std::int64_t g, std::int64_t room) {
  int l = 0;
  while ((g & ((std::int64_t{2} << l) - 1)) == 0 && (std::int64_t{2} << l) <= room) ++l;
  return l;
}

int tree_top(std::int64_t total) {
  int top = 0;
  while ((std::int64_t{1} << top) < total) ++top;
  return top;
}

}  // namespace

TreeStack::TreeStack(std::int64_t width, std::int64_t total)
    : width_(width), total_(total), top_(tree_top(total)) {
  // Waiting nodes: those whose left sibling lies before the range (at rising levels), then at
  // most one per level; and the one being pushed.
  values_.reserve(static_cast<std::size_t>((2 * top_ + 3) * width_));
}

double* TreeStack::next() {
  const std::size_t need = (ids_.size() + 1) * static_cast<std::size_t>(width_);
  if (values_.size() < need) values_.resize(need);
  return values_.data() + ids_.size() * static_cast<std::size_t>(width_);
}

void TreeStack::push(int level, std::int64_t index) {
  ids_.emplace_back(level, index);
  for (;;) {
    const auto [l, i] = ids_.back();
    if (l >= top_) return;
    if (i % 2 == 0) {
      // No right half in the pass: the parent is this node alone, over the same groups.
      if (((i + 1) << l) >= total_) {
        ids_.back() = {l + 1, i / 2};
        continue;
      }
      return;
    }
    // A right child whose left sibling waits below it: every stack holds the nodes of one
    // contiguous range in order, so the parent lies inside that range too.
    if (ids_.size() < 2 || ids_[ids_.size() - 2] != std::pair{l, i - 1}) return;
    double* left = values_.data() + (ids_.size() - 2) * static_cast<std::size_t>(width_);
    const double* right = left + width_;
    for (std::int64_t c = 0; c < width_; ++c) left[c] += right[c];
    ids_.pop_back();
    ids_.back() = {l + 1, i / 2};
  }
}

void TreeStack::append(const TreeStack& other) {
  for (std::size_t m = 0; m < other.ids_.size(); ++m) {
    const double* v = other.values_.data() + m * static_cast<std::size_t>(width_);
    std::copy(v, v + width_, next());
    push(other.ids_[m].first, other.ids_[m].second);
  }
}

void TreeStack::append(std::span<const double> packed) {
  const std::size_t r = static_cast<std::size_t>(width_);
  for (std::size_t m = 0; m + r + 2 <= packed.size(); m += r + 2) {
    std::copy(packed.data() + m + 2, packed.data() + m + 2 + r, next());
    push(static_cast<int>(packed[m]), static_cast<std::int64_t>(packed[m + 1]));
  }
}

std::vector<double> TreeStack::root() const {
  if (total_ == 0) return std::vector<double>(static_cast<std::size_t>(width_), 0.0);
  if (ids_.size() != 1 || ids_[0] != std::pair{top_, std::int64_t{0}})
    throw Error("internal: a group's sums are missing from the draws' reduction");
  return {values_.begin(), values_.begin() + width_};
}

std::int64_t TreeStack::nodes_of(std::int64_t begin, std::int64_t end, std::int64_t total) {
  // Push the range as its largest aligned subtrees (as reduce_draws does with node()), one value
  // per node.
  TreeStack tree(1, total);
  for (std::int64_t g = begin; g < end;) {
    const int l = subtree_level(g, end - g);
    *tree.next() = 0;
    tree.push(l, g >> l);
    g += std::int64_t{1} << l;
  }
  return static_cast<std::int64_t>(tree.ids_.size());
}

std::vector<double> TreeStack::packed() const {
  const std::size_t r = static_cast<std::size_t>(width_);
  std::vector<double> out(ids_.size() * (r + 2));
  for (std::size_t m = 0; m < ids_.size(); ++m) {
    out[m * (r + 2)] = ids_[m].first;
    out[m * (r + 2) + 1] = static_cast<double>(ids_[m].second);
    std::copy(values_.data() + m * r, values_.data() + (m + 1) * r, out.data() + m * (r + 2) + 2);
  }
  return out;
}

DrawSums reduce_draws(
    const Comm& comm, int samples, std::int64_t width, const Groups& groups,
    const std::function<void(std::span<const std::int64_t>, std::span<double>)>& block,
    const std::function<void(std::span<const std::int64_t>)>& prepare,
    const std::function<void(std::span<const std::int64_t>, std::span<const std::int64_t>,
                             std::span<double>)>& node) {
  const std::int64_t r = samples * width, n_local = groups.size();
  // Contiguous ranges of groups per thread, each summing its groups' subtrees as they come; then
  // the threads' nodes in order, on this thread. A thread's groups go to prepare() in runs of
  // about kRunEntries rows x draws (at least one group): a few hundred KB of a model's per-row
  // terms, which its blocks then read from the L2 cache.
  constexpr std::int64_t kRunEntries = std::int64_t{1} << 11;
  const int threads = max_threads();
  const std::int64_t per = std::max<std::int64_t>(1, (n_local + threads - 1) / threads);
  std::vector<TreeStack> parts;  // built in place: each reserves its levels
  parts.reserve(static_cast<std::size_t>((n_local + per - 1) / per));
  for (std::int64_t k = 0; k < n_local; k += per) parts.emplace_back(r, groups.total);
  parallel_blocks(n_local, per, threads, [&](int, std::int64_t k0, std::int64_t k1) {
    TreeStack& tree = parts[static_cast<std::size_t>(k0 / per)];
    for (std::int64_t k = k0; k < k1;) {
      std::int64_t end = k + 1;
      if (prepare) {
        const auto rows = [&](std::int64_t e) {
          return groups.offsets[static_cast<std::size_t>(e)] -
                 groups.offsets[static_cast<std::size_t>(k)];
        };
        while (end < k1 && rows(end) * samples < kRunEntries) ++end;
        prepare(std::span<const std::int64_t>(
            groups.rows.data() + groups.offsets[static_cast<std::size_t>(k)],
            static_cast<std::size_t>(rows(end))));
      }
      while (k < end) {
        // The largest whole subtree of the sum tree that starts at this group and ends inside
        // the run, node (l, g / 2^l), from the model at once (a leaf: one block).
        const std::int64_t g = groups.first + k;
        const int l = node ? subtree_level(g, end - k) : 0;
        const std::span<double> out(tree.next(), static_cast<std::size_t>(r));
        if (l == 0) {
          block(groups.group(k), out);
        } else {
          const auto at = groups.offsets.begin() + k;
          node(std::span<const std::int64_t>(groups.rows.data() + at[0],
                                             static_cast<std::size_t>(at[1 << l] - at[0])),
               std::span<const std::int64_t>(&at[0], (std::size_t{1} << l) + 1), out);
        }
        tree.push(l, g >> l);
        k += std::int64_t{1} << l;
      }
    }
  });
  for (std::size_t p = 1; p < parts.size(); ++p) parts[0].append(parts[p]);
  DrawSums out;
  if (comm.size() > 1) {
    // Every rank's nodes in rank order, that is in group order, onto one stack: what remains is
    // the root, the same additions as on one rank.
    const std::vector<double> mine = parts.empty() ? std::vector<double>{} : parts[0].packed();
    // Each rank's node count from its range of groups, where every rank knows every range.
    std::vector<std::int64_t> counts;
    if (groups.rank_first.size() == static_cast<std::size_t>(comm.size()) + 1)
      for (std::size_t p = 0; p + 1 < groups.rank_first.size(); ++p)
        counts.push_back(
            TreeStack::nodes_of(groups.rank_first[p], groups.rank_first[p + 1], groups.total) *
            (r + 2));
    const Stopwatch watch;
    const std::vector<double> all =
        counts.empty() ? comm.allgatherv(mine) : comm.allgatherv(mine, counts);
    out.reduce_seconds += watch.seconds();
    TreeStack tree(r, groups.total);
    tree.append(all);
    out.sums = tree.root();
  } else {
    out.sums = parts.empty() ? TreeStack(r, groups.total).root() : parts[0].root();
  }
  // A non-finite value in any group makes its draw's sum non-finite: that draw has no estimate
  // and is dropped, the same way on every rank.
  out.kept.assign(static_cast<std::size_t>(samples), 1);
  for (int s = 0; s < samples; ++s) {
    const Eigen::Map<const Eigen::ArrayXd> v(out.sums.data() + s * width, width);
    if (!v.allFinite()) {
      out.kept[static_cast<std::size_t>(s)] = 0;
      ++out.dropped;
    }
  }
  return out;
}

namespace {

// The stratified positions of a step (minibatch_groups below): position j is floor((j + u_j) w)
// with w = n / batch, clamped to n - 1; non-decreasing in j.
class Strata {
 public:
  Strata(std::int64_t n, std::int64_t batch, std::uint64_t seed, std::int64_t t)
      : n_(n),
        batch_(batch),
        w_(static_cast<double>(n) / static_cast<double>(batch)),
        rng_(seed, Stream::kBbviBatch),
        t_(t) {}
  std::int64_t position(std::int64_t j, double u) const {
    return std::min(n_ - 1, static_cast<std::int64_t>((static_cast<double>(j) + u) * w_));
  }
  // The strata [j0, j1) that can hold a position in [begin, end), with a margin of two strata
  // for the rounding of (j + u) w; j0 even, as uniforms() starts at a counter.
  std::pair<std::int64_t, std::int64_t> window(std::int64_t begin, std::int64_t end) const {
    return {std::clamp<std::int64_t>(stratum(begin) - 2, 0, batch_) / 2 * 2,
            std::clamp<std::int64_t>(stratum(end) + 3, 0, batch_)};
  }
  // u_j for j = j0, j0 + 1, ... (j0 even).
  void uniforms(std::int64_t j0, std::span<double> u) const {
    rng_.uniforms(static_cast<std::uint64_t>(j0 / 2), static_cast<std::uint32_t>(t_), u);
  }
  // The number of positions before `row`: those of the strata before the window, and the
  // window's own below it.
  std::int64_t before(std::int64_t row) const {
    const auto [j0, j1] = window(row, row);
    std::array<double, 8> u{};
    const std::span<double> window_u(u.data(),
                                     static_cast<std::size_t>(std::max<std::int64_t>(j1 - j0, 0)));
    uniforms(j0, window_u);
    std::int64_t count = j0;
    for (std::size_t i = 0; i < window_u.size(); ++i)
      if (position(j0 + static_cast<std::int64_t>(i), window_u[i]) < row) ++count;
    return count;
  }

 private:
  std::int64_t stratum(std::int64_t row) const {
    return static_cast<std::int64_t>(static_cast<double>(row) / w_);
  }
  std::int64_t n_, batch_;
  double w_;
  CounterRng rng_;
  std::int64_t t_;
};

}  // namespace

std::int64_t poll_stride(double seconds, std::int64_t steps) {
  if (steps <= 0 || !(seconds > 0)) return 1;
  const double per_step = seconds / static_cast<double>(steps);
  return static_cast<std::int64_t>(
      std::clamp(std::floor(kPollSeconds / per_step), 1.0, static_cast<double>(kPollSteps)));
}

Groups minibatch_groups(std::int64_t n, RowRange rows, std::int64_t batch, std::uint64_t seed,
                        std::int64_t t, std::span<const std::int64_t> rank_rows) {
  // Stratified positions, one in each of `batch` strata of w = n / batch rows (Cochran 1977,
  // ch. 5): position j is floor((j + u_j) w), u_j uniform on (0, 1) keyed by (seed, step, j).
  // Every row is drawn batch / n times in expectation, as with positions drawn uniformly with
  // replacement, so the estimator keeps its scale n / batch and its unbiasedness, with a variance
  // no larger. The positions come sorted, every rank holds the positions of its own strata (its
  // share of the batch within one), and a rank makes only those: a step's cost on a rank falls
  // with the rank count, where drawing and sorting all B positions on every rank did not. Each
  // position is one group, so the groups' global list is j = 0..batch-1 on every rank.
  Groups g;
  if (batch <= 0) return g;
  g.total = batch;
  const Strata strata(n, batch, seed, t);
  const auto [j0, j1] = strata.window(rows.begin, rows.end);
  std::vector<double> u(static_cast<std::size_t>(std::max<std::int64_t>(j1 - j0, 0)));
  strata.uniforms(j0, u);
  // Positions are non-decreasing in j: those before the range come first, then the rank's own.
  g.first = j0;
  std::size_t i = 0;
  for (; i < u.size() && strata.position(j0 + static_cast<std::int64_t>(i), u[i]) < rows.begin; ++i)
    ++g.first;
  g.rows.reserve(u.size() - i);
  g.offsets.reserve(u.size() - i + 1);  // offsets starts as {0}
  for (; i < u.size(); ++i) {
    const std::int64_t p = strata.position(j0 + static_cast<std::int64_t>(i), u[i]);
    if (p >= rows.end) break;
    g.rows.push_back(p - rows.begin);
    g.offsets.push_back(static_cast<std::int64_t>(g.rows.size()));
  }
  // Every rank's first group the same way: a few strata around each rank boundary.
  for (const std::int64_t b : rank_rows)
    g.rank_first.push_back(b <= 0 ? 0 : b >= n ? batch : strata.before(b));
  return g;
}

Groups all_groups(std::int64_t n, RowRange rows) {
  Groups g;
  g.first = rows.begin / kBlockRows;
  g.total = (n + kBlockRows - 1) / kBlockRows;
  for (std::int64_t i = rows.begin; i < rows.end; ++i) {
    if (i > rows.begin && i % kBlockRows == 0)
      g.offsets.push_back(static_cast<std::int64_t>(g.rows.size()));
    g.rows.push_back(i - rows.begin);
  }
  if (!g.rows.empty()) g.offsets.push_back(static_cast<std::int64_t>(g.rows.size()));
  return g;
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

ElboRows elbo_rows(const Run& run, const DrawSchedule& s, std::span<const std::int64_t> rank_rows) {
  ElboRows e;
  if (s.elbo_rows <= 0 || s.elbo_rows >= run.global_rows) {
    e.groups = detail::all_groups(run.global_rows, run.rows);
    return e;
  }
  // Step 2^32 - 1 of the minibatch stream: beyond any optimiser step (--max-iter is an int).
  constexpr std::int64_t kElboRowsStep = 0xFFFFFFFF;
  e.groups = detail::minibatch_groups(run.global_rows, run.rows, s.elbo_rows, s.seed, kElboRowsStep,
                                      rank_rows);
  e.scale = static_cast<double>(run.global_rows) / static_cast<double>(s.elbo_rows);
  return e;
}

}  // namespace caviar::engine
