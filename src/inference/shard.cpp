#include "inference/shard.hpp"

#include <cmath>

namespace caviar {

std::string find_non_finite(const io::RowMatrix& x, std::int64_t first, const io::DataRef& ref) {
  for (Eigen::Index i = 0; i < x.rows(); ++i)
    for (Eigen::Index j = 0; j < x.cols(); ++j)
      if (!std::isfinite(x(i, j)))
        return ref.str() + " has a non-finite value (" + std::to_string(x(i, j)) + ") at row " +
               std::to_string(first + i) + ", column " + std::to_string(j);
  return "";
}

Shard load_shard(const Comm& comm, const io::DataRef& ref) {
  Shard s;
  s.ref = ref;
  s.shape = io::inspect_matrix(comm, ref);
  if (s.shape.rows < comm.size())
    throw Error(ref.str() + " has " + std::to_string(s.shape.rows) + " rows, fewer than the " +
                std::to_string(comm.size()) + " MPI ranks");
  s.range = partition_rows(s.shape.rows, comm.size(), comm.rank());
  s.x = io::read_rows(comm, ref, s.shape, s.range);
  const std::string err = find_non_finite(s.x, s.range.begin, ref);
  // The lowest failing rank holds the lowest bad row, so every run reports the same row.
  comm.raise_if_any(err);
  return s;
}

}  // namespace caviar
