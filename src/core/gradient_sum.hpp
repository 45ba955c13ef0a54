#pragma once
// Exact, order-independent summation of float32 gradients from many blocks of rows: each block's
// gradient is converted to int64 fixed point with one scale 2^k shared by every block, and integer
// sums are exact, so the total does not depend on which rank or thread added which block
// (docs/reproducibility.md). k is chosen from the largest |g| over all blocks so that n_terms such
// numbers cannot overflow. Used by the gradient driver (engine/gradient.hpp).
#include <cstdint>

namespace caviar {

int fixed_point_exponent(double max_abs, std::int64_t n_terms);
// acc += g on the grid 2^-exponent. Every g[i] must be finite and the exponent that of their
// finite maximum: callers refuse or drop non-finite values first.
void add_fixed_point(const float* g, std::int64_t n, int exponent, std::int64_t* acc);
void from_fixed_point(const std::int64_t* acc, std::int64_t n, int exponent, double divisor,
                      float* out);
double max_abs(const float* g, std::int64_t n);

}  // namespace caviar
