#pragma once
// Exact sums over 256-row blocks (docs/reproducibility.md, "How"), the pattern behind every
// rank-invariant sum that the drivers take outside the models' statistics (data bounds and moments,
// k-means++ potentials and Lloyd sums): each global block's vector is summed in double, in row
// order, then added to an ExactSum on a grid every rank agrees on, and the integers are summed over
// ranks. The result is the same for any split of the blocks over ranks.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "comm/comm.hpp"
#include "core/exact_sum.hpp"
#include "core/partition.hpp"

namespace caviar {

class BlockExactSum {
 public:
  // exponents[i] bounds entry i (ExactSum): every rank must pass the same ones.
  explicit BlockExactSum(std::vector<int> exponents)
      : sum_(std::move(exponents)), part_(sum_.size()) {}

  // Adds a run of `rows` local rows that starts on a global block boundary (a shard, or a chunk
  // of one): fill(r0, r1, out) adds rows [r0, r1) of the run to out, in row order.
  template <class Fill>
  void add_run(std::int64_t rows, Fill&& fill) {
    for (std::int64_t r0 = 0; r0 < rows; r0 += kBlockRows) {
      std::fill(part_.begin(), part_.end(), 0.0);
      fill(r0, std::min(rows, r0 + kBlockRows), part_.data());
      sum_.add(part_);
    }
  }

  // The sums over every rank's runs (collective).
  std::vector<double> finish(const Comm& comm) {
    comm.allreduce_sum(sum_.raw());
    return sum_.result();
  }

 private:
  ExactSum sum_;
  std::vector<double> part_;
};

}  // namespace caviar
