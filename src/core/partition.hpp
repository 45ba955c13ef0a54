#pragma once
// Which global rows a rank owns. Rows are grouped in fixed blocks of kBlockRows whose layout does
// not depend on the number of ranks; each rank owns a contiguous run of whole blocks. Per-block
// work (partial sums, random draws) is therefore the same whatever the rank count.
//
// What a new model must do to keep results bitwise identical over ranks and threads (details in
// docs/reproducibility.md):
//  - do per-row work in these blocks, each block by one thread, its rows in order;
//  - sum across blocks exactly: ExactSum (core/exact_sum.hpp) or BlockExactSum
//    (data/block_sum.hpp), on a grid every rank derives from the same global bounds;
//  - reduce those integers across ranks (never doubles), and combine threads by integer addition;
//  - key random draws by (seed, stream, global index) with CounterRng, never by rank or thread;
//  - let Eigen compute only on 64-byte aligned memory: Eigen's own matrices, or any heap buffer
//    (every operator new in caviar's programs is aligned: core/aligned_new.cpp), viewed at offsets
//    fixed by the problem's sizes. Never on a stack array or a buffer another library allocated
//    with malloc: Eigen chooses its scalar/vector split from the address, and the two paths round
//    differently, so results would change with the memory layout from run to run;
//  - add the model to tests/cli/test_bitwise.py and tests/determinism/test_heap_layout.py.
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
