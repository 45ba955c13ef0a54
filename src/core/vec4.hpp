#pragma once
// Four doubles as GCC's generic vector type: one AVX register, two SSE registers elsewhere.
// Arithmetic on it is element-wise, so a kernel written with it computes each lane exactly as the
// scalar code with the same operations would.
#include <cstdint>
#include <cstring>

namespace caviar {

using Vec4 = double __attribute__((vector_size(32)));
using Vec4u = std::uint64_t __attribute__((vector_size(32)));
// Eight doubles: one AVX-512 register, two AVX ones.
using Vec8 = double __attribute__((vector_size(64)));
using Vec8u = std::uint64_t __attribute__((vector_size(64)));

// Four doubles from p, which need not be aligned.
inline Vec4 load4(const double* p) {
  Vec4 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

}  // namespace caviar
