#pragma once
// Streaming reads of a 2-D dataset (or of a 1-D one as rows of one column, ndims 1) that stays
// open over many collective reads: chunks of a
// rank's row range (full passes) and arbitrary sorted rows (SVI minibatches), so that no rank
// ever holds the whole dataset. Separate from h5.hpp only to keep that file's interface small.
#include <cstdint>
#include <memory>
#include <span>

#include "io/h5.hpp"

namespace caviar::io {

class RowStream {
 public:
  // Collective: opens ref over MPI-IO (shape from inspect_matrix). Errors are agreed by all.
  RowStream(const Comm& comm, const DataRef& ref, MatrixShape shape);
  ~RowStream();
  RowStream(const RowStream&) = delete;
  RowStream& operator=(const RowStream&) = delete;

  const DataRef& ref() const { return ref_; }
  const MatrixShape& shape() const { return shape_; }

  // Collective: rows [range.begin, range.end) (may be empty on some ranks), as double.
  RowMatrix read_range(RowRange range) const;
  // Collective: the given global rows, strictly increasing (may be empty on some ranks), in that
  // order, in a single collective H5Dread of a point selection.
  RowMatrix read_rows(std::span<const std::int64_t> rows) const;

 private:
  const Comm& comm_;
  DataRef ref_;
  MatrixShape shape_;
  std::int64_t file_ = -1, dset_ = -1;
};

}  // namespace caviar::io
