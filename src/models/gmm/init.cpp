#include "models/gmm/init.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.hpp"
#include "core/exact_sum.hpp"
#include "core/parallel.hpp"
#include "core/rng.hpp"
#include "data/block_sum.hpp"

namespace caviar {

RowMatrix random_responsibilities(std::int64_t row_begin, std::int64_t n_rows, int k,
                                  std::uint64_t seed) {
  const CounterRng rng(seed, Stream::kInitResponsibilities);
  RowMatrix r(n_rows, k);
  for (std::int64_t i = 0; i < n_rows; ++i) {
    for (int j = 0; j < k; j += 2) {
      const auto u = rng.uniform2(static_cast<std::uint64_t>(row_begin + i), j / 2);
      r(i, j) = u[0];
      if (j + 1 < k) r(i, j + 1) = u[1];
    }
    r.row(i) /= r.row(i).sum();
  }
  return r;
}

std::vector<std::int64_t> random_rows_from_data(std::int64_t n_global, int k, std::uint64_t seed) {
  if (n_global < k)
    throw Error("--init random-from-data needs at least K = " + std::to_string(k) +
                " rows (the data has " + std::to_string(n_global) + ")");
  // Component j draws u_j,step until floor(u n) is a row no earlier component took. Rejection
  // keeps every K-subset equally likely in every order; with n >= K it ends, on average in under
  // n / (n - K + 1) draws per component.
  const CounterRng rng(seed, Stream::kInitFromData);
  std::vector<std::int64_t> rows;
  rows.reserve(static_cast<std::size_t>(k));
  for (int j = 0; j < k; ++j) {
    for (std::uint32_t step = 0;; ++step) {
      const double u = rng.uniform2(static_cast<std::uint64_t>(j), step)[0];
      const auto row = std::min<std::int64_t>(
          n_global - 1, static_cast<std::int64_t>(u * static_cast<double>(n_global)));
      if (std::find(rows.begin(), rows.end(), row) == rows.end()) {
        rows.push_back(row);
        break;
      }
    }
  }
  return rows;
}

namespace {

// The global row that maximises key, ties to the lowest row; every rank gets the same answer.
std::int64_t global_argmax(const Comm& comm, double key, std::int64_t row) {
  const auto keys = comm.allgather(key);
  const auto rows = comm.allgather(row);
  std::int64_t best = -1;
  double best_key = -std::numeric_limits<double>::infinity();
  for (std::size_t p = 0; p < keys.size(); ++p) {
    if (rows[p] < 0) continue;
    if (best < 0 || keys[p] > best_key || (keys[p] == best_key && rows[p] < best)) {
      best = rows[p];
      best_key = keys[p];
    }
  }
  return best;
}

// Candidates per center in greedy k-means++: 2 + floor(ln K), as Arthur & Vassilvitskii suggest.
int c_trials(int k) {
  return std::min(128, 2 + static_cast<int>(std::log(static_cast<double>(k))));
}

// Sums a vector over this rank's rows (x starts at a global block boundary) and then over all
// ranks, exactly (BlockExactSum): add_row(i, out) adds local row i's contribution to out.
template <class AddRow>
std::vector<double> exact_row_sum(const Comm& comm, std::int64_t n, std::vector<int> exponents,
                                  AddRow&& add_row) {
  BlockExactSum sum(std::move(exponents));
  sum.add_run(n, [&](std::int64_t r0, std::int64_t r1, double* out) {
    for (std::int64_t i = r0; i < r1; ++i) add_row(i, out);
  });
  return sum.finish(comm);
}

int owner_of(std::int64_t row, std::int64_t n_global, int n_ranks) {
  for (int p = 0; p < n_ranks; ++p) {
    const RowRange r = partition_rows(n_global, n_ranks, p);
    if (row >= r.begin && row < r.end) return p;
  }
  return n_ranks - 1;
}

}  // namespace

Eigen::VectorXi kmeans_labels(const Comm& comm, const RowMatrix& x, RowRange range,
                              std::int64_t n_global, int k, std::uint64_t seed, int lloyd_iters) {
  const std::int64_t n = x.rows();
  const Eigen::Index d = x.cols();
  const CounterRng rng(seed, Stream::kKmeansPlusPlus);
  // Rows are independent: threads take 256-row blocks, and every per-row value is computed as on
  // one thread, so the labels do not depend on the thread count.
  const int threads = max_threads();
  // Bounds for the exact sums below: |x_nj| <= a_j, and every squared distance <= sum_j (2 a_j)^2.
  Eigen::VectorXd a = n > 0 ? Eigen::VectorXd(x.cwiseAbs().colwise().maxCoeff().transpose())
                            : Eigen::VectorXd(Eigen::VectorXd::Zero(d));
  comm.allreduce_max(std::span<double>(a.data(), static_cast<std::size_t>(d)));
  const double n2 = 2.0 * static_cast<double>(n_global);
  const int potential_exponent = bound_exponent(n2 * 4.0 * a.squaredNorm());
  RowMatrix centers(k, d);
  Eigen::VectorXd dist2 = Eigen::VectorXd::Constant(n, std::numeric_limits<double>::infinity());

  // Greedy k-means++ (as scikit-learn): draw 2 + ln K candidates per center and keep the one that
  // lowers the potential sum_n d_n^2 the most.
  const int n_trials = c_trials(k);
  for (int c = 0; c < k; ++c) {
    const int trials = c == 0 ? 1 : n_trials;
    std::vector<Eigen::VectorXd> cand(static_cast<std::size_t>(trials), Eigen::VectorXd(d));
    for (int t = 0; t < trials; ++t) {
      // Each thread keeps the first row with its largest key; merged in thread order, that is
      // the first row with the largest key of the shard, whatever the thread count.
      std::vector<double> t_key(std::size_t(threads), -std::numeric_limits<double>::infinity());
      std::vector<std::int64_t> t_row(std::size_t(threads), -1);
      parallel_blocks(n, kBlockRows, threads, [&](int th, std::int64_t i0, std::int64_t i1) {
        double& best_key = t_key[std::size_t(th)];
        std::int64_t& best_row = t_row[std::size_t(th)];
        for (std::int64_t i = i0; i < i1; ++i) {
          // Draw (center c, trial t) of row n: counter (n, 64 c + t / 2), lane t % 2.
          const double u = rng.uniform2(static_cast<std::uint64_t>(range.begin + i),
                                        static_cast<std::uint32_t>(64 * c + t / 2))[t % 2];
          const double w = c == 0 ? 1.0 : dist2[i];
          // Reservoir key ln(u)/w; with every weight zero (duplicates) fall back to uniform.
          const double key = w > 0 ? std::log(u) / w : -1e300 + std::log(u);
          if (best_row < 0 || key > best_key) {
            best_key = key;
            best_row = range.begin + i;
          }
        }
      });
      double best_key = -std::numeric_limits<double>::infinity();
      std::int64_t best_row = -1;
      for (int th = 0; th < threads; ++th) {
        const std::int64_t r = t_row[std::size_t(th)];
        const double key = t_key[std::size_t(th)];
        if (r >= 0 && (best_row < 0 || key > best_key || (key == best_key && r < best_row))) {
          best_key = key;
          best_row = r;
        }
      }
      const std::int64_t chosen = global_argmax(comm, best_key, best_row);
      if (chosen >= range.begin && chosen < range.end) cand[t] = x.row(chosen - range.begin);
      comm.broadcast(std::span<double>(cand[t].data(), d), owner_of(chosen, n_global, comm.size()));
    }
    int best = 0;
    if (trials > 1) {
      // Each row's new distance under each candidate (threads over rows), then their exact sums.
      RowMatrix near(n, trials);
      parallel_blocks(n, kBlockRows, threads, [&](int, std::int64_t i0, std::int64_t i1) {
        for (std::int64_t i = i0; i < i1; ++i)
          for (int t = 0; t < trials; ++t)
            near(i, t) = std::min(dist2[i], (x.row(i).transpose() - cand[t]).squaredNorm());
      });
      const std::vector<double> potential = exact_row_sum(
          comm, n, std::vector<int>(static_cast<std::size_t>(trials), potential_exponent),
          [&](std::int64_t i, double* out) {
            for (int t = 0; t < trials; ++t) out[t] += near(i, t);
          });
      for (int t = 1; t < trials; ++t)
        if (potential[t] < potential[best]) best = t;
    }
    centers.row(c) = cand[best].transpose();
    parallel_blocks(n, kBlockRows, threads, [&](int, std::int64_t i0, std::int64_t i1) {
      for (std::int64_t i = i0; i < i1; ++i)
        dist2[i] = std::min(dist2[i], (x.row(i) - centers.row(c)).squaredNorm());
    });
  }

  Eigen::VectorXi label(n);
  auto assign = [&] {
    parallel_blocks(n, kBlockRows, threads, [&](int, std::int64_t i0, std::int64_t i1) {
      for (std::int64_t i = i0; i < i1; ++i) {
        Eigen::Index best;
        (centers.rowwise() - x.row(i)).rowwise().squaredNorm().minCoeff(&best);
        label[i] = static_cast<int>(best);
      }
    });
  };
  assign();
  // Lloyd sums: per-cluster sums then counts, one buffer, one allreduce.
  std::vector<int> lloyd_exponents(static_cast<std::size_t>(k * (d + 1)), bound_exponent(n2));
  for (int c = 0; c < k; ++c)
    for (Eigen::Index j = 0; j < d; ++j) lloyd_exponents[c * d + j] = bound_exponent(n2 * a[j]);
  for (int it = 0; it < lloyd_iters; ++it) {
    const std::vector<double> buf =
        exact_row_sum(comm, n, lloyd_exponents, [&](std::int64_t i, double* out) {
          double* s = out + label[i] * d;
          for (Eigen::Index j = 0; j < d; ++j) s[j] += x(i, j);
          out[k * d + label[i]] += 1.0;
        });
    for (int c = 0; c < k; ++c) {
      const double cnt = buf[k * d + c];
      if (cnt > 0)  // an empty cluster keeps its center
        for (Eigen::Index j = 0; j < d; ++j) centers(c, j) = buf[c * d + j] / cnt;
    }
    assign();
  }
  return label;
}

}  // namespace caviar
