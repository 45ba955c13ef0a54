// Heap blocks are 64-byte aligned in every caviar program (core/aligned_new.cpp), whatever their
// size and whatever was allocated before: Eigen's vectorised kernels then take the same path, and
// give the same bits, wherever a buffer lands (docs/reproducibility.md).
#include <gtest/gtest.h>

#include <Eigen/Core>
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

// Eigen's product blocking is planned for a 32 KiB L1 whatever the CPU (core/eigen_blocking.cpp).
TEST(EigenBlocking, PlannedL1IsPinned) {
  EXPECT_EQ(Eigen::l1CacheSize(), 32 * 1024);
}

// Why the pin matters: a product deeper than the depth panel is summed panel by panel, and the
// panel depth follows the L1 size, so planning for a 48 KiB L1 (as Eigen would on Zen 4/5 or Ice
// Lake) gives other bits than planning for 32 KiB. Should the two plans ever agree, Eigen no
// longer derives the order of its sums from the cache size, and the pin can go.
TEST(EigenBlocking, L1SizeChangesTheBitsOfADeepProduct) {
#ifdef EIGEN_USE_BLAS
  GTEST_SKIP() << "products go to an external BLAS, which does not read Eigen's cache sizes";
#endif
  const std::ptrdiff_t l1 = Eigen::l1CacheSize(), l2 = Eigen::l2CacheSize(),
                       l3 = Eigen::l3CacheSize();
  Eigen::MatrixXd a(64, 4000), b(4000, 64);
  std::uint64_t x = 88172645463325252ull;  // xorshift: fixed values of mixed sign and size
  auto next = [&x] {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    return static_cast<double>(static_cast<std::int64_t>(x >> 11) - (std::int64_t{1} << 52)) *
           0x1p-40;
  };
  for (Eigen::Index i = 0; i < a.size(); ++i) a.data()[i] = next();
  for (Eigen::Index i = 0; i < b.size(); ++i) b.data()[i] = next();
  const Eigen::MatrixXd pinned = a * b;
  Eigen::setCpuCacheSizes(48 * 1024, l2, l3);
  const Eigen::MatrixXd wide = a * b;
  Eigen::setCpuCacheSizes(l1, l2, l3);
  const Eigen::MatrixXd again = a * b;
  EXPECT_TRUE((again.array() == pinned.array()).all()) << "the same plan gives the same bits";
  EXPECT_FALSE((wide.array() == pinned.array()).all())
      << "a 48 KiB plan summed a depth of 4000 in the same order as the pinned one";
}

}  // namespace
