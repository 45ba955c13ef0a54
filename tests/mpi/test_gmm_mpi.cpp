// Distributed behaviour: results must not depend on the number of ranks, and errors must reach
// every rank. Each test compares the run on all ranks of COMM_WORLD with the same run on rank 0
// alone (COMM_SELF), so registering this binary at P = 1, 2, 3, 4 covers every rank count.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <limits>

#include "comm/comm.hpp"
#include "core/error.hpp"
#include "inference/generate.hpp"
#include "inference/gmm_driver.hpp"
#include "io/h5.hpp"

namespace caviar {
namespace {

const Comm& world() {
  static const Comm c = Comm::world();
  return c;
}

std::string tmp(const std::string& name) {
  return std::string(CAVIAR_TEST_TMPDIR) + "/np" + std::to_string(world().size()) + "_" + name;
}

// Norm-wise relative difference max|a - b| / max|a|: entries that are zero up to rounding
// (e.g. off-diagonals of an empty component's scale) must not dominate an elementwise ratio.
double max_rel_diff(const std::vector<double>& a, const std::vector<double>& b) {
  EXPECT_EQ(a.size(), b.size());
  double diff = 0, scale = 0;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) {
    diff = std::max(diff, std::abs(a[i] - b[i]));
    scale = std::max(scale, std::abs(a[i]));
  }
  return diff / std::max(scale, 1e-300);
}

// Generates data with all ranks; rank 0 also generates it alone; the bytes must match.
TEST(Generate, IdenticalForAnyRankCount) {
  const std::string a = tmp("gen_world.h5"), b = tmp("gen_self.h5");
  const auto spec = random_mixture(5, 4, 7);
  write_samples(world(), a, {{"/X", spec, 3000}}, 7);
  if (world().is_root()) {
    const Comm self = Comm::self();
    write_samples(self, b, {{"/X", spec, 3000}}, 7);
    io::FileReader ra(a), rb(b);
    EXPECT_EQ(ra.read("/X"), rb.read("/X"));
    EXPECT_EQ(ra.read("/labels"), rb.read("/labels"));
    io::Dims dims;
    ra.read("/X", &dims);
    EXPECT_EQ(dims, (io::Dims{3000, 5}));
  }
  world().barrier();
}

struct Case {
  const char* name;
  gmm::Covariance cov;
  const char* init;
  int k;
};

class FitInvariance : public ::testing::TestWithParam<Case> {};

TEST_P(FitInvariance, SameResultAsOneRank) {
  const Case c = GetParam();
  const std::string data = tmp(std::string("fit_") + c.name + ".h5");
  // 2600 rows: 11 blocks of 256, so 3 and 4 ranks get uneven shares.
  write_samples(world(), data, {{"/X", random_mixture(3, 3, 21), 2600}}, 21);
  gmm::FitOptions o;
  o.data = data + ":/X";
  o.components = c.k;
  o.covariance = c.cov;
  o.init = c.init;
  o.seed = 5;
  o.max_iter = 40;
  o.tol = 0;
  o.out = tmp(std::string("model_world_") + c.name + ".h5");
  const gmm::FitResult rw = gmm::fit(world(), o, nullptr);
  EXPECT_EQ(rw.iterations, 40);
  // CAVI never lowers the ELBO.
  for (std::size_t t = 1; t < rw.trace.size(); ++t)
    EXPECT_GE(rw.trace[t], rw.trace[t - 1] - 1e-10 * std::abs(rw.trace[t - 1]))
        << "iteration " << t;
  if (world().is_root()) {
    const Comm self = Comm::self();
    gmm::FitOptions os = o;
    os.out = tmp(std::string("model_self_") + c.name + ".h5");
    const gmm::FitResult rs = gmm::fit(self, os, nullptr);
    EXPECT_LT(max_rel_diff(rw.trace, rs.trace), 1e-10);
    io::FileReader fw(o.out), fs(os.out);
    for (const char* name :
         {"/weights", "/means", "/covariances", "/posterior/nu", "/posterior/W_inv", "/trace/elbo"})
      EXPECT_LT(max_rel_diff(fw.read(name), fs.read(name)), 1e-10) << name;
    EXPECT_EQ(fw.read_double_attr("ranks"), world().size());
  }
  world().barrier();
}

INSTANTIATE_TEST_SUITE_P(
    Cases, FitInvariance,
    ::testing::Values(Case{"full_kmeans", gmm::Covariance::kFull, "kmeans++", 3},
                      Case{"full_random", gmm::Covariance::kFull, "random", 5},
                      Case{"diag_kmeans", gmm::Covariance::kDiag, "kmeans++", 4}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(Errors, NonFiniteDataFailsOnEveryRank) {
  const std::string data = tmp("nan.h5");
  if (world().is_root()) {
    std::vector<double> x(600 * 2, 1.0);
    x[2 * 517 + 1] = std::numeric_limits<double>::quiet_NaN();  // row 517, column 1
    io::FileWriter w(data);
    w.write("X", x, {600, 2});
    w.commit();
  }
  world().barrier();
  gmm::FitOptions o;
  o.data = data + ":/X";
  o.components = 2;
  o.out = tmp("nan_model.h5");
  try {
    gmm::fit(world(), o, nullptr);
    ADD_FAILURE() << "no error on rank " << world().rank();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("row 517, column 1"), std::string::npos) << e.what();
  }
  // Nothing half-written.
  if (world().is_root()) {
    EXPECT_FALSE(std::ifstream(o.out).good());
    EXPECT_FALSE(std::ifstream(o.out + ".tmp-caviar").good());
  }
  world().barrier();
}

TEST(Errors, MoreComponentsThanRowsFailsOnEveryRank) {
  const std::string data = tmp("small.h5");
  write_samples(world(), data, {{"/X", random_mixture(2, 2, 1), 8}}, 1);
  gmm::FitOptions o;
  o.data = data + ":/X";
  o.components = 9;
  EXPECT_THROW(gmm::fit(world(), o, nullptr), Error);
  world().barrier();
}

}  // namespace
}  // namespace caviar
