#pragma once
// Which global rows a rank owns. Rows are grouped in fixed blocks of kBlockRows whose layout does
// not depend on the number of ranks; each rank owns a contiguous run of whole blocks. Per-block
// work (partial sums, random draws) is therefore the same whatever the rank count.
#include <algorithm>
#include <cstdint>

namespace caviar {

inline constexpr std::int64_t kBlockRows = 256;

struct RowRange {
  std::int64_t begin = 0;
  std::int64_t end = 0;
  std::int64_t size() const { return end - begin; }
};

inline RowRange partition_rows(std::int64_t n_rows, int n_parts, int part) {
  const std::int64_t n_blocks = (n_rows + kBlockRows - 1) / kBlockRows;
  const std::int64_t b0 = n_blocks * part / n_parts;
  const std::int64_t b1 = n_blocks * (part + 1) / n_parts;
  return {std::min(n_rows, b0 * kBlockRows), std::min(n_rows, b1 * kBlockRows)};
}

}  // namespace caviar
