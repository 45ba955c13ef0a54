// The draws driver's reduction (engine/draws.hpp): per-draw sums over kBlockRows groups of sharded
// rows, the same bits at every rank and thread count as the tree summed by recursion on one
// process, for a full pass and for sparse minibatches, and close to the exact sum.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "comm/comm.hpp"
#include "core/partition.hpp"
#include "core/rng.hpp"
#include "engine/draws.hpp"
#include "inference/checkpoint.hpp"

namespace caviar::engine {
namespace {

constexpr int kSamples = 3;
constexpr std::int64_t kWidth = 5;

// Row n's value for (draw s, entry j): a function of the global row only, over many binades and
// both signs, so that the order of additions shows in the last bits.
double value(std::int64_t n, int s, std::int64_t j) {
  // The argument is an integer times one constant: one rounding, whatever the compiler contracts.
  const double u = std::sin(0.01 * static_cast<double>((n * 61 + s * 170 + j * 30) % 100003));
  return std::ldexp(u, static_cast<int>((n * 11 + s * 5 + j * 3) % 40) - 20);
}

// A group's values: its rows' values summed in row order (what a model's block() does).
void block(std::int64_t begin, std::span<const std::int64_t> rows, std::span<double> out) {
  std::fill(out.begin(), out.end(), 0.0);
  for (const std::int64_t r : rows)
    for (int s = 0; s < kSamples; ++s)
      for (std::int64_t j = 0; j < kWidth; ++j)
        out[std::size_t(s * kWidth + j)] += value(begin + r, s, j);
}

// Node (l, i) of the sum tree from its definition (engine/draws.hpp): the sum of groups
// [i 2^l, min((i + 1) 2^l, G)), its two halves added element by element, or the left half alone.
std::vector<double> tree_node(const std::vector<double>& vals, std::int64_t total, int l,
                              std::int64_t i) {
  const std::size_t w = kSamples * kWidth;
  if (l == 0) return {vals.begin() + i * std::int64_t(w), vals.begin() + (i + 1) * std::int64_t(w)};
  std::vector<double> sum = tree_node(vals, total, l - 1, 2 * i);
  if (((2 * i + 1) << (l - 1)) < total) {
    const std::vector<double> right = tree_node(vals, total, l - 1, 2 * i + 1);
    for (std::size_t c = 0; c < w; ++c) sum[c] += right[c];
  }
  return sum;
}

// The groups' sums on one process: every group of every rank, in global order, summed over the
// tree by recursion.
std::vector<double> serial(std::int64_t n, const std::function<Groups(RowRange)>& groups_of) {
  const Groups g = groups_of({0, n});
  std::vector<double> vals(static_cast<std::size_t>(g.size() * kSamples * kWidth));
  for (std::int64_t k = 0; k < g.size(); ++k)
    block(0, g.group(k), {vals.data() + k * kSamples * kWidth, std::size_t(kSamples * kWidth)});
  int top = 0;
  while ((std::int64_t{1} << top) < g.total) ++top;
  return tree_node(vals, g.total, top, 0);
}

void expect_invariant(std::int64_t n, const std::function<Groups(RowRange)>& groups_of,
                      const std::string& what) {
  const Comm world = Comm::world();
  const RowRange mine = partition_rows(n, world.size(), world.rank());
  const Groups g = groups_of(mine);
  const std::vector<double> ref = serial(n, groups_of);
  // Each thread sums the subtrees of its own range of groups: 1, 2, 3 and 5 threads split the
  // groups at different places.
  const int threads = omp_get_max_threads();
  detail::DrawSums d;
  for (const int t : {1, 2, 3, 5}) {
    omp_set_num_threads(t);
    // With a prepare(): every group's rows lie inside the run last prepared on its thread, and
    // the runs are the thread's groups, whole and in order (their rows, once each).
    std::vector<std::span<const std::int64_t>> last(static_cast<std::size_t>(t));
    std::vector<std::int64_t> outside(static_cast<std::size_t>(t), 0);
    std::vector<std::int64_t> prepared(static_cast<std::size_t>(t), 0);
    std::atomic<std::int64_t> nodes{0}, deep{0};
    // mode 0: blocks alone; 1: with prepare; 2: with prepare and whole subtrees at once.
    for (const int mode : {0, 1, 2}) {
      const bool with_prepare = mode > 0;
      const auto check_inside = [&](std::span<const std::int64_t> rows) {
        const auto th = static_cast<std::size_t>(omp_get_thread_num());
        const auto& run = last[th];
        if (with_prepare &&
            (rows.data() < run.data() || rows.data() + rows.size() > run.data() + run.size()))
          ++outside[th];
      };
      d = detail::reduce_draws(
          world, kSamples, kWidth, g,
          [&](std::span<const std::int64_t> rows, std::span<double> out) {
            check_inside(rows);
            block(mine.begin, rows, out);
          },
          with_prepare ? std::function<void(std::span<const std::int64_t>)>(
                             [&](std::span<const std::int64_t> rows) {
                               const auto th = static_cast<std::size_t>(omp_get_thread_num());
                               last[th] = rows;
                               prepared[th] += static_cast<std::int64_t>(rows.size());
                             })
                       : std::function<void(std::span<const std::int64_t>)>{},
          mode == 2
              ? std::function<void(std::span<const std::int64_t>, std::span<const std::int64_t>,
                                   std::span<double>)>([&](std::span<const std::int64_t> rows,
                                                           std::span<const std::int64_t> bounds,
                                                           std::span<double> out) {
                  // 2^l groups: each one's block, then the tree by recursion.
                  check_inside(rows);
                  const auto count = static_cast<std::int64_t>(bounds.size()) - 1;
                  int l = 0;
                  while ((std::int64_t{1} << l) < count) ++l;
                  EXPECT_EQ(std::int64_t{1} << l, count);
                  ++nodes;
                  if (l >= 2) ++deep;
                  std::vector<double> vals(std::size_t(count) * out.size());
                  for (std::int64_t k = 0; k < count; ++k)
                    block(mine.begin,
                          rows.subspan(
                              std::size_t(bounds[std::size_t(k)] - bounds[0]),
                              std::size_t(bounds[std::size_t(k) + 1] - bounds[std::size_t(k)])),
                          {vals.data() + k * std::int64_t(out.size()), out.size()});
                  const std::vector<double> v = tree_node(vals, count, l, 0);
                  std::copy(v.begin(), v.end(), out.begin());
                })
              : std::function<void(std::span<const std::int64_t>, std::span<const std::int64_t>,
                                   std::span<double>)>{});
      ASSERT_EQ(d.sums.size(), ref.size());
      EXPECT_EQ(std::memcmp(d.sums.data(), ref.data(), sizeof(double) * ref.size()), 0)
          << what << " at " << world.size() << " ranks x " << t << " threads, mode " << mode;
    }
    EXPECT_EQ(std::accumulate(outside.begin(), outside.end(), std::int64_t{0}), 0) << what;
    EXPECT_EQ(std::accumulate(prepared.begin(), prepared.end(), std::int64_t{0}),
              2 * static_cast<std::int64_t>(g.rows.size()))
        << what;
    // Groups of one run went as subtrees, some of four groups or more where a thread's groups
    // fit in one run (under reduce_draws' 2,048 rows x draws) and are many.
    if (t == 1 && g.size() >= 16 && static_cast<std::int64_t>(g.rows.size()) * kSamples < 2048) {
      EXPECT_GT(deep.load(), 0) << what;
    }
    if (g.size() >= 4 && t == 1) {
      EXPECT_GT(nodes.load(), 0) << what;
    }
    ASSERT_EQ(d.sums.size(), ref.size());
    EXPECT_EQ(std::memcmp(d.sums.data(), ref.data(), sizeof(double) * ref.size()), 0)
        << what << " at " << world.size() << " ranks x " << t << " threads";
    EXPECT_EQ(d.dropped, 0);
  }
  omp_set_num_threads(threads);
  // Pairwise summation: within a few ulps of the long double sum of every row's value.
  const Groups all = groups_of({0, n});
  for (int s = 0; s < kSamples; ++s)
    for (std::int64_t j = 0; j < kWidth; ++j) {
      long double exact = 0, scale = 0;
      for (const std::int64_t r : all.rows) {
        exact += value(r, s, j);
        scale += std::abs(value(r, s, j));
      }
      EXPECT_NEAR(d.sums[std::size_t(s * kWidth + j)], static_cast<double>(exact),
                  1e-14 * static_cast<double>(scale))
          << what;
    }
}

TEST(DrawsMpi, FullPassSumsAreRankInvariant) {
  // 37 groups (not a power of two) over 1-4 ranks; the last group is short.
  const std::int64_t n = 36 * kBlockRows + 17;
  expect_invariant(
      n, [&](RowRange r) { return detail::all_groups(n, r); }, "full pass");
}

TEST(DrawsMpi, SparseMinibatchSumsAreRankInvariant) {
  // Stratified positions: ranks without any, and (batch 70,000) several positions per row. With
  // every rank's rows given, reduce_draws computes the ranks' node counts itself (a wrong count
  // ends the job); without, it exchanges them.
  const Comm world = Comm::world();
  for (const bool known : {false, true})
    for (const std::int64_t batch : {1, 7, 300, 70000}) {
      const std::int64_t n = 200 * kBlockRows + 5;
      std::vector<std::int64_t> rank_rows;
      if (known) {
        for (int p = 0; p < world.size(); ++p)
          rank_rows.push_back(partition_rows(n, world.size(), p).begin);
        rank_rows.push_back(n);
      }
      for (std::int64_t t = 0; t < 3; ++t)
        expect_invariant(
            n, [&](RowRange r) { return detail::minibatch_groups(n, r, batch, 42, t, rank_rows); },
            "batch " + std::to_string(batch) + " step " + std::to_string(t) +
                (known ? ", counts known" : ""));
    }
}

TEST(DrawsMpi, TreeNodesOfARangeAreThoseOfItsLeaves) {
  // nodes_of pushes a range as its largest aligned subtrees; reduce_draws pushes leaves, runs of
  // subtrees and threads' stacks: every way must leave the same number of nodes.
  for (const std::int64_t total : {1, 2, 3, 7, 8, 37, 64, 100}) {
    for (std::int64_t a = 0; a <= total; ++a)
      for (std::int64_t b = a; b <= total; ++b) {
        detail::TreeStack leaves(1, total);
        for (std::int64_t g = a; g < b; ++g) {
          *leaves.next() = 1;
          leaves.push(0, g);
        }
        EXPECT_EQ(detail::TreeStack::nodes_of(a, b, total),
                  static_cast<std::int64_t>(leaves.packed().size() / 3))
            << "groups " << a << " to " << b << " of " << total;
      }
  }
}

TEST(DrawsMpi, MinibatchGroupsAreTheStratifiedPositions) {
  // minibatch_groups against its definition, every position made: position j is
  // floor((j + u_j) n / B) with u_j from uniform2 at step 3, clamped to n - 1; a shard keeps
  // those inside it, one group each, and counts those before it. Shards of whole blocks as
  // partition_rows makes them, at the start, the middle and the end (and an empty one); one
  // position per 8 rows, per 977 or 9766, and several per row.
  for (const std::int64_t n : {std::int64_t{1000}, std::int64_t{1000003}, std::int64_t{10000000}})
    for (const std::int64_t batch : {1, 5, 1024, 70000}) {
      const CounterRng rng(42, Stream::kBbviBatch);
      std::vector<std::int64_t> pos;
      for (std::int64_t j = 0; j < batch; ++j) {
        const double u = rng.uniform2(std::uint64_t(j / 2), 3)[j % 2];
        pos.push_back(std::min<std::int64_t>(
            n - 1,
            static_cast<std::int64_t>((static_cast<double>(j) + u) *
                                      (static_cast<double>(n) / static_cast<double>(batch)))));
      }
      const std::int64_t third = n / 3 / kBlockRows * kBlockRows;
      // Every shard's first group, as each shard computes them all.
      const std::vector<std::int64_t> rank_rows{0, third, 2 * third, n, n};
      std::vector<std::int64_t> rank_first;
      for (const std::int64_t b : rank_rows)
        rank_first.push_back(
            std::count_if(pos.begin(), pos.end(), [&](std::int64_t p) { return p < b; }));
      for (const RowRange mine : {RowRange{0, third}, RowRange{third, 2 * third},
                                  RowRange{2 * third, n}, RowRange{n, n}}) {
        const Groups g = detail::minibatch_groups(n, mine, batch, 42, 3, rank_rows);
        EXPECT_EQ(g.rank_first, rank_first) << n << " " << batch << " " << mine.begin;
        std::vector<std::int64_t> rows, offsets{0};
        std::int64_t first = 0;
        for (const std::int64_t p : pos) {
          if (p < mine.begin) {
            ++first;
          } else if (p < mine.end) {
            rows.push_back(p - mine.begin);
            offsets.push_back(std::int64_t(rows.size()));
          }
        }
        const std::string what = "n " + std::to_string(n) + ", batch " + std::to_string(batch) +
                                 ", rows from " + std::to_string(mine.begin);
        EXPECT_EQ(g.rows, rows) << what;
        EXPECT_EQ(g.offsets, offsets) << what;
        EXPECT_EQ(g.first, first) << what;
        EXPECT_EQ(g.total, batch) << what;
      }
    }
}

TEST(DrawsMpi, StratifiedPositionsDrawEveryRowEquallyOften) {
  // Unbiasedness of the scale N / B: every row's expected count per step is B / N. Over 4,000
  // steps of B = 7 positions on N = 23 rows (strata of 3.29 rows, straddling rows), each row's
  // count is Binomial-like with mean 4000 * 7 / 23 = 1217.4 and sd below 35: within 6 sd.
  const std::int64_t n = 23, batch = 7, steps = 4000;
  std::vector<std::int64_t> count(static_cast<std::size_t>(n), 0);
  for (std::int64_t t = 0; t < steps; ++t) {
    const Groups g = detail::minibatch_groups(n, RowRange{0, n}, batch, 11, t);
    ASSERT_EQ(g.size(), batch);
    for (const std::int64_t r : g.rows) ++count[static_cast<std::size_t>(r)];
  }
  const double mean = static_cast<double>(steps * batch) / static_cast<double>(n);
  for (std::int64_t r = 0; r < n; ++r)
    EXPECT_NEAR(static_cast<double>(count[static_cast<std::size_t>(r)]), mean, 6 * 35.0)
        << "row " << r;
}

TEST(DrawsMpi, NonFiniteDrawIsDroppedOnEveryRank) {
  const Comm world = Comm::world();
  const std::int64_t n = 9 * kBlockRows;
  const RowRange mine = partition_rows(n, world.size(), world.rank());
  const Groups g = detail::all_groups(n, mine);
  const detail::DrawSums d = detail::reduce_draws(
      world, kSamples, kWidth, g, [&](std::span<const std::int64_t> rows, std::span<double> out) {
        block(mine.begin, rows, out);
        // Draw 1 is NaN in the last block only, which one rank holds.
        if (mine.begin + rows.back() == n - 1) out[kWidth + 2] = std::nan("");
      });
  EXPECT_EQ(d.dropped, 1);
  EXPECT_EQ(d.kept, (std::vector<std::uint8_t>{1, 0, 1}));
}

TEST(DrawsMpi, PollStrideTakesAboutKPollSecondsWithinOneAndKPollSteps) {
  // 16 steps of 0.2 ms: more than 16 would fit in kPollSeconds, so the cap.
  EXPECT_EQ(detail::poll_stride(16 * 0.2e-3, 16), detail::kPollSteps);
  // 1 ms a step: kPollSeconds / 1 ms = 10.
  EXPECT_EQ(detail::poll_stride(4 * 1e-3, 4), 10);
  // A second a step: every step, so that a SIGTERM waits one step, not sixteen.
  EXPECT_EQ(detail::poll_stride(3.0, 3), 1);
  // No pace yet (the first poll of a run) or no clock: every step until there is one.
  EXPECT_EQ(detail::poll_stride(0.0, 0), 1);
  EXPECT_EQ(detail::poll_stride(0.0, 5), 1);
}

TEST(DrawsMpi, StopPollCarriesRankZerosProposalToEveryRank) {
  // Every rank proposes its own value; every rank gets rank 0's (7), and no save or signal.
  const Comm world = Comm::world();
  ckpt::StopPoller poller(world, ckpt::Every{});
  const ckpt::StopPoller::Decision d = poller.poll(3, world.rank() == 0 ? 7 : 100 + world.rank());
  EXPECT_EQ(d.proposed, 7);
  EXPECT_EQ(d.signal, 0);
  EXPECT_FALSE(d.save);
  // Out of range: clamped on rank 0.
  EXPECT_EQ(poller.poll(4, -5).proposed, 0);
}

}  // namespace
}  // namespace caviar::engine
