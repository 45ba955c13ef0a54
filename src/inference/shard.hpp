#pragma once
// A rank's rows of a dataset, read from HDF5 and checked. Shared by every model driver.
#include "comm/comm.hpp"
#include "core/partition.hpp"
#include "io/h5.hpp"

namespace caviar {

struct Shard {
  io::DataRef ref;
  io::MatrixShape shape;  // global rows x features
  RowRange range;         // this rank's rows
  io::RowMatrix x;        // range.size() x features
};

// Collective: reads this rank's block-aligned rows, and fails on every rank (one agreed message)
// if there are fewer rows than ranks or any value is NaN or infinite.
Shard load_shard(const Comm& comm, const io::DataRef& ref);

// "" if every value of x (global rows first, first + 1, ...) is finite, else the message naming
// the first bad row and column.
std::string find_non_finite(const io::RowMatrix& x, std::int64_t first, const io::DataRef& ref);

}  // namespace caviar
