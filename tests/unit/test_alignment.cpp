// Heap blocks are 64-byte aligned in every caviar program (core/aligned_new.cpp), whatever their
// size and whatever was allocated before: Eigen's vectorised kernels then take the same path, and
// give the same bits, wherever a buffer lands (docs/reproducibility.md).
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace {

bool aligned64(const void* p) {
  return reinterpret_cast<std::uintptr_t>(p) % 64 == 0;
}

TEST(HeapAlignment, EveryOperatorNewIs64ByteAligned) {
  std::vector<std::unique_ptr<char[]>> keep;  // interleaved odd sizes move glibc's placement
  for (std::size_t n = 1; n < 3000; n += 7) {
    keep.emplace_back(new char[n % 97 + 1]);
    std::vector<double> v(n);
    EXPECT_TRUE(aligned64(v.data())) << "std::vector<double>(" << n << ")";
    std::vector<float> f(n);
    EXPECT_TRUE(aligned64(f.data())) << "std::vector<float>(" << n << ")";
    auto u = std::make_unique<double[]>(n);
    EXPECT_TRUE(aligned64(u.get())) << "new double[" << n << "]";
    std::string s(n + 20, 'x');  // beyond the small-string buffer
    EXPECT_TRUE(aligned64(s.data())) << "std::string(" << n + 20 << ")";
  }
}

}  // namespace
