// Eigen's matrix-product blocking, fixed for every machine.
//
// Why: Eigen splits the inner (depth) dimension of a matrix product into panels of kc terms and
// adds each panel's partial sums into the result in turn, and it derives kc from the L1 data
// cache size it reads from CPUID at run time (evaluateProductBlockingSizesHeuristic in
// GeneralBlockPanelKernel.h). A product deeper than kc is therefore summed in a different order,
// and rounds differently, on a CPU with a 48 KiB L1 (Zen 4/5, Ice Lake and later) than on one
// with 32 KiB (Zen 1-3, Skylake): two machines with the same instruction set gave different bits
// for the same fit. Pinning the L1 size Eigen plans for makes the split depend only on the
// product's shape and the instruction set. The L2 and L3 sizes only choose the row and column
// blocks, which do not change any sum, so they stay as Eigen measured them.
//
// Linked as an object file into every program that uses caviar_core (CMakeLists.txt), like the
// aligned operator new, and run as a static constructor: before main, so before any product.
#include <Eigen/Core>

namespace {

// 32 KiB, the most common L1 data cache. On a larger L1 the panels are shorter than Eigen would
// choose (kc of 248 instead of 376 for double on AVX2); docs/reproducibility.md has what that
// costs.
constexpr std::ptrdiff_t kPlannedL1Bytes = 32 * 1024;

__attribute__((constructor)) void pin_eigen_blocking() {
  Eigen::setCpuCacheSizes(kPlannedL1Bytes, Eigen::l2CacheSize(), Eigen::l3CacheSize());
}

}  // namespace
