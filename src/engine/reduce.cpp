#include "engine/reduce.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "core/exact_sum.hpp"

namespace caviar::engine {

double exact_sum(const Comm& comm, std::span<const double> v) {
  double m = 0;
  for (double x : v) {
    if (!std::isfinite(x)) m = std::numeric_limits<double>::infinity();
    m = std::max(m, std::abs(x));
  }
  m = comm.allreduce_max(m);
  if (!std::isfinite(m)) return std::numeric_limits<double>::quiet_NaN();
  std::int64_t n = static_cast<std::int64_t>(v.size());
  comm.allreduce_sum(std::span<std::int64_t>(&n, 1));
  // core/exact_sum.hpp, as the mixtures' sums: one entry on the grid of a bound every rank
  // computes alike (twice n max|x|, above the sum of the magnitudes whatever the rounding of
  // the product), summed exactly as 128-bit integers over threads and ranks.
  const double bound = 2.0 * m * static_cast<double>(std::max<std::int64_t>(n, 1));
  if (!std::isfinite(bound)) return std::numeric_limits<double>::quiet_NaN();
  ExactSum acc({bound_exponent(bound)});
  for (double x : v) acc.add(std::span<const double>(&x, 1));
  comm.allreduce_sum(acc.raw());
  return acc.result()[0];
}

}  // namespace caviar::engine
