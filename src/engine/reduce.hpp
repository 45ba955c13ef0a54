#pragma once
// The engine's reductions over ranks. Every one is exact, so its result is the same for any
// number of ranks and threads (docs/reproducibility.md).
#include <span>

#include "comm/comm.hpp"

namespace caviar::engine {

// Exact, order-independent global sum of doubles (one entry per local row, e.g. per-document
// objective terms): core/exact_sum.hpp's ExactSum on the grid of 2 n max|x|, with n and max|x|
// taken over every rank. NaN if any value is not finite.
double exact_sum(const Comm& comm, std::span<const double> v);

}  // namespace caviar::engine
