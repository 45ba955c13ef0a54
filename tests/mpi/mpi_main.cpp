// gtest main for MPI tests: every rank runs every test; the run fails if any rank fails
// (MAX-reduce of the failure flag), and only rank 0 prints.
#include <gtest/gtest.h>

#include "comm/comm.hpp"

int main(int argc, char** argv) {
  caviar::Environment env(argc, argv);
  ::testing::InitGoogleTest(&argc, argv);
  const caviar::Comm world = caviar::Comm::world();
  if (!world.is_root()) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  const int local = RUN_ALL_TESTS();
  const std::int64_t any = world.allreduce_max(static_cast<std::int64_t>(local != 0));
  if (world.is_root() && any && local == 0) std::fprintf(stderr, "a test failed on another rank\n");
  return any ? 1 : 0;
}
