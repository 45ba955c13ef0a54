#pragma once
// Four doubles as GCC's generic vector type: one AVX register, two SSE registers elsewhere.
// Arithmetic on it is element-wise, so a kernel written with it computes each lane exactly as the
// scalar code with the same operations would.
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace caviar {

using Vec4 = double __attribute__((vector_size(32)));
using Vec4u = std::uint64_t __attribute__((vector_size(32)));
// Eight doubles: one AVX-512 register, two AVX ones.
using Vec8 = double __attribute__((vector_size(64)));
using Vec8u = std::uint64_t __attribute__((vector_size(64)));

// A vector of V's width from p, which need not be aligned.
template <class V>
inline V vload(const double* p) {
  V v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// x in every lane (x itself for V = double). As x - 0, which is x exactly (also for -0, unlike
// 0 + x) and which the compiler folds to a plain broadcast; a lane-by-lane fill was compiled into
// stack traffic inside the HMM's kernels (three times slower).
template <class V>
inline V splat(double x) {
  if constexpr (std::is_same_v<V, double>)
    return x;
  else
    return x - V{};
}

}  // namespace caviar
