// The 128-bit allreduce of ExactSum: the total over ranks equals, bit for bit, the sum of the same
// addends on one rank, whatever the rank count.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "comm/comm.hpp"
#include "core/exact_sum.hpp"
#include "core/partition.hpp"

namespace caviar {
namespace {

// Addend n, entry i: a function of the global index only, spread over many binades.
double addend(std::int64_t n, int i) {
  const double u = std::sin(0.37 * static_cast<double>(n) + i);
  return std::ldexp(u, static_cast<int>((n * 7 + i * 13) % 70) - 50);
}

TEST(ExactSumMpi, AllreduceEqualsSerialBitForBit) {
  const Comm world = Comm::world();
  constexpr std::int64_t kN = 10007;
  constexpr int kEntries = 4;
  const std::vector<int> e(kEntries, bound_exponent(kN * std::ldexp(1.0, 20)));

  ExactSum serial(e);
  for (std::int64_t n = 0; n < kN; ++n) {
    std::vector<double> v(kEntries);
    for (int i = 0; i < kEntries; ++i) v[i] = addend(n, i);
    serial.add(v);
  }
  ExactSum mine(e);
  const RowRange r = partition_rows(kN, world.size(), world.rank());
  for (std::int64_t n = r.begin; n < r.end; ++n) {
    std::vector<double> v(kEntries);
    for (int i = 0; i < kEntries; ++i) v[i] = addend(n, i);
    mine.add(v);
  }
  world.allreduce_sum(mine.raw());
  const auto a = serial.result(), b = mine.result();
  EXPECT_EQ(std::memcmp(a.data(), b.data(), sizeof(double) * kEntries), 0);
  for (int i = 0; i < kEntries; ++i) EXPECT_EQ(a[i], b[i]) << "entry " << i;
}

}  // namespace
}  // namespace caviar
