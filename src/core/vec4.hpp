#pragma once
// Four doubles as GCC's generic vector type: one AVX register, two SSE registers elsewhere.
// Arithmetic on it is element-wise, so a kernel written with it computes each lane exactly as the
// scalar code with the same operations would.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#if defined(__AVX__) && defined(__FMA__)
#include <immintrin.h>
#endif

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

// v to p, which need not be aligned: one vector store. (A loop of std::memcpy calls from an
// array of accumulators was compiled into a spill to the stack and a copy loop.)
template <class V>
inline void vstore(double* p, V v) {
  typedef V Unaligned __attribute__((aligned(8), may_alias));
  *reinterpret_cast<Unaligned*>(p) = v;
}

// a * b + c with one rounding per lane (IEEE 754's fusedMultiplyAdd), in every build. GCC
// contracts a * b + c into a fused multiply-add where it sees fit, and did so in one inlined copy
// of a kernel and not in another; a kernel whose lanes must equal those of another says so
// explicitly. Without FMA instructions std::fma gives the same bits, slowly.
inline Vec4 vfma(Vec4 a, Vec4 b, Vec4 c) {
#if defined(__AVX__) && defined(__FMA__)
  return _mm256_fmadd_pd(a, b, c);
#else
  return Vec4{std::fma(a[0], b[0], c[0]), std::fma(a[1], b[1], c[1]), std::fma(a[2], b[2], c[2]),
              std::fma(a[3], b[3], c[3])};
#endif
}

// The same for eight lanes, where they are one AVX-512 register (the width the HMM's kernels use
// there; other builds have no use for it).
#if defined(__AVX512F__)
inline Vec8 vfma(Vec8 a, Vec8 b, Vec8 c) {
  return _mm512_fmadd_pd(a, b, c);
}
#endif

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
