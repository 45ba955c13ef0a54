// Distributed behaviour: results must not depend on the number of ranks, and errors must reach
// every rank. Each test compares the run on all ranks of COMM_WORLD with the same run on rank 0
// alone (COMM_SELF), so registering this binary at P = 1, 2, 3, 4 covers every rank count.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <limits>
#include <string>

#include "comm/comm.hpp"
#include "core/error.hpp"
#include "inference/gmm_driver.hpp"
#include "io/h5.hpp"
#include "prep/generate.hpp"

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
    [](const auto& param_info) { return std::string(param_info.param.name); });

// ---------------------------------------------------------------------------------------------
// SVI, EM and the stick-breaking prior.

// 2600 rows (uneven shares at 3 and 4 ranks), 3 clusters in 3-D.
std::string svi_data(const std::string& name) {
  const std::string data = tmp(name);
  write_samples(world(), data, {{"/X", random_mixture(3, 3, 31), 2600}}, 31);
  return data + ":/X";
}

gmm::FitOptions svi_options(const std::string& data, const std::string& out) {
  gmm::FitOptions o;
  o.data = data;
  o.components = 4;
  o.algorithm = gmm::Algorithm::kSvi;
  o.init = "random";
  o.seed = 9;
  o.batch_size = 300;  // 9 steps per epoch, the last one short (200 rows)
  o.max_iter = 4;      // epochs
  o.tol = 0;
  o.out = out;
  return o;
}

struct SviCase {
  const char* name;
  gmm::Schedule schedule;
  gmm::WeightPrior weights;
  gmm::Covariance cov;
};

class SviInvariance : public ::testing::TestWithParam<SviCase> {};

// The minibatch indices are drawn globally, so the same seed gives the same fit at any P.
TEST_P(SviInvariance, SameResultAsOneRank) {
  const SviCase c = GetParam();
  const std::string data = svi_data(std::string("svi_") + c.name + ".h5");
  gmm::FitOptions o = svi_options(data, tmp(std::string("svi_world_") + c.name + ".h5"));
  o.schedule = c.schedule;
  o.weights = c.weights;
  o.covariance = c.cov;
  o.adaptive_memory = 5;
  const gmm::FitResult rw = gmm::fit(world(), o, nullptr);
  EXPECT_EQ(rw.steps, 4 * 9);
  EXPECT_EQ(rw.trace.size(), 36u);
  EXPECT_EQ(rw.epoch_trace.size(), 4u);
  for (double r : rw.rho_trace) {
    EXPECT_GT(r, 0.0);
    EXPECT_LE(r, 1.0);
  }
  if (c.schedule == gmm::Schedule::kRobbinsMonro) {  // rho_t = (t + 1)^-0.9
    EXPECT_NEAR(rw.rho_trace[9], std::pow(11.0, -0.9), 1e-15);
  }
  if (world().is_root()) {
    const Comm self = Comm::self();
    gmm::FitOptions os = o;
    os.out = tmp(std::string("svi_self_") + c.name + ".h5");
    const gmm::FitResult rs = gmm::fit(self, os, nullptr);
    EXPECT_LT(max_rel_diff(rw.trace, rs.trace), 1e-10);
    EXPECT_LT(max_rel_diff(rw.rho_trace, rs.rho_trace), 1e-10);
    EXPECT_NEAR(rw.elbo, rs.elbo, 1e-10 * std::abs(rs.elbo));
    io::FileReader fw(o.out), fs(os.out);
    for (const char* name : {"/weights", "/means", "/covariances", "/posterior/nu",
                             "/posterior/W_inv", "/trace/elbo", "/trace/epoch_elbo"})
      EXPECT_LT(max_rel_diff(fw.read(name), fs.read(name)), 1e-10) << name;
  }
  world().barrier();
}

INSTANTIATE_TEST_SUITE_P(
    Cases, SviInvariance,
    ::testing::Values(SviCase{"rm_full", gmm::Schedule::kRobbinsMonro, gmm::WeightPrior::kDirichlet,
                              gmm::Covariance::kFull},
                      SviCase{"adaptive_diag", gmm::Schedule::kAdaptive,
                              gmm::WeightPrior::kDirichlet, gmm::Covariance::kDiag},
                      SviCase{"rm_dp_full", gmm::Schedule::kRobbinsMonro,
                              gmm::WeightPrior::kStickBreaking, gmm::Covariance::kFull},
                      SviCase{"adaptive_dp_full", gmm::Schedule::kAdaptive,
                              gmm::WeightPrior::kStickBreaking, gmm::Covariance::kFull}),
    [](const auto& param) { return std::string(param.param.name); });

// With rho = 1 (kappa = 0) and B = N, one SVI step is one CAVI step: lambda_1 = prior + S(all).
TEST(Svi, FullBatchUnitStepIsOneCaviStep) {
  for (const auto weights : {gmm::WeightPrior::kDirichlet, gmm::WeightPrior::kStickBreaking}) {
    const std::string data = svi_data("svi_rho1.h5");
    gmm::FitOptions s = svi_options(data, tmp("svi_rho1_svi.h5"));
    s.weights = weights;
    s.batch_size = 2600;
    s.kappa = 0;
    s.max_iter = 1;
    const gmm::FitResult rs = gmm::fit(world(), s, nullptr);
    ASSERT_EQ(rs.steps, 1);
    EXPECT_EQ(rs.rho_trace[0], 1.0);
    gmm::FitOptions c = s;
    c.algorithm = gmm::Algorithm::kCavi;
    c.out = tmp("svi_rho1_cavi.h5");
    const gmm::FitResult rc = gmm::fit(world(), c, nullptr);
    ASSERT_EQ(rc.trace.size(), 2u);
    // The stochastic ELBO of the full batch is the full ELBO of lambda_0; the final full ELBO is
    // CAVI's after one update.
    EXPECT_NEAR(rs.trace[0], rc.trace[0], 1e-12 * std::abs(rc.trace[0]));
    EXPECT_NEAR(rs.elbo, rc.trace[1], 1e-12 * std::abs(rc.trace[1]));
    EXPECT_GT(rc.trace[1], rc.trace[0]);  // the update did something
    if (world().is_root()) {
      io::FileReader fs(s.out), fc(c.out);
      for (const char* name : {"/weights", "/means", "/covariances", "/posterior/beta",
                               "/posterior/nu", "/posterior/m", "/posterior/W_inv"})
        EXPECT_LT(max_rel_diff(fs.read(name), fc.read(name)), 1e-12) << name;
    }
    world().barrier();
  }
}

// The epoch average of the stochastic ELBO (Bruno 2022, eq. 2.52) is an average over the epoch's
// rows. With rho ~ 1e-14 lambda stays at lambda_0, so every epoch's average must be the full ELBO
// of lambda_0, which the final full pass also computes. B = 1200 leaves a short last step (200 of
// 2600 rows, scaled by 13): a plain mean of the three steps' estimates missed by 12.8 and 47.5
// nats in the two epochs (measured with the old formula put back).
TEST(Svi, EpochAverageIsTheFullElboWhenLambdaIsFrozen) {
  gmm::FitOptions o = svi_options(svi_data("svi_frozen.h5"), "");
  o.batch_size = 1200;
  o.tau0 = 1e15;  // Robbins-Monro rho_t = (1e15 + t)^-0.9 ~ 3e-14
  o.max_iter = 2;
  const gmm::FitResult r = gmm::fit(world(), o, nullptr);
  ASSERT_EQ(r.steps, 2 * 3);
  ASSERT_EQ(r.epoch_trace.size(), 2u);
  for (double avg : r.epoch_trace) EXPECT_NEAR(avg, r.elbo, 1e-9 * std::abs(r.elbo));
  // The steps' own estimates are noisy, or this would test nothing.
  double spread = 0;
  for (double e : r.trace) spread = std::max(spread, std::abs(e - r.elbo));
  EXPECT_GT(spread, 1e-4 * std::abs(r.elbo));
}

// --stream reads each step's rows from the file: the same fit as in memory.
TEST(Svi, StreamMatchesInMemory) {
  const std::string data = svi_data("svi_stream.h5");
  for (const auto schedule : {gmm::Schedule::kRobbinsMonro, gmm::Schedule::kAdaptive}) {
    gmm::FitOptions m = svi_options(data, tmp("svi_mem.h5"));
    m.schedule = schedule;
    m.adaptive_memory = 4;
    m.heldout = data;
    const gmm::FitResult rm = gmm::fit(world(), m, nullptr);
    gmm::FitOptions s = m;
    s.stream = true;
    s.chunk_rows = 512;  // several chunks per rank in the full passes
    s.out = tmp("svi_stream_out.h5");
    const gmm::FitResult rs = gmm::fit(world(), s, nullptr);
    EXPECT_LT(max_rel_diff(rm.trace, rs.trace), 1e-12);
    EXPECT_NEAR(rm.elbo, rs.elbo, 1e-12 * std::abs(rm.elbo));
    ASSERT_TRUE(rm.heldout && rs.heldout);
    EXPECT_NEAR(*rm.heldout, *rs.heldout, 1e-12 * std::abs(*rm.heldout));
    if (world().is_root()) {
      io::FileReader fm(m.out), fs(s.out);
      for (const char* name : {"/weights", "/means", "/covariances", "/posterior/W_inv"})
        EXPECT_LT(max_rel_diff(fm.read(name), fs.read(name)), 1e-12) << name;
    }
    world().barrier();
  }
}

// EM never lowers the log-likelihood, and is rank-count invariant.
TEST(Em, LogLikelihoodNeverDecreasesAndInvariant) {
  const std::string data = svi_data("em.h5");
  for (const auto cov : {gmm::Covariance::kFull, gmm::Covariance::kDiag}) {
    gmm::FitOptions o;
    o.data = data;
    o.components = 5;
    o.algorithm = gmm::Algorithm::kEm;
    o.covariance = cov;
    o.init = "random";
    o.seed = 3;
    o.max_iter = 60;
    o.tol = 0;
    o.out = tmp("em_world.h5");
    const gmm::FitResult rw = gmm::fit(world(), o, nullptr);
    ASSERT_EQ(rw.trace.size(), 61u);
    for (std::size_t t = 1; t < rw.trace.size(); ++t)
      EXPECT_GE(rw.trace[t], rw.trace[t - 1] - 1e-12 * std::abs(rw.trace[t - 1])) << t;
    EXPECT_GT(rw.trace.back(), rw.trace.front() + 1.0);
    if (world().is_root()) {
      const Comm self = Comm::self();
      gmm::FitOptions os = o;
      os.out = tmp("em_self.h5");
      const gmm::FitResult rs = gmm::fit(self, os, nullptr);
      EXPECT_LT(max_rel_diff(rw.trace, rs.trace), 1e-10);
      io::FileReader fw(o.out), fs(os.out);
      for (const char* name : {"/weights", "/means", "/covariances", "/precisions_cholesky"})
        EXPECT_LT(max_rel_diff(fw.read(name), fs.read(name)), 1e-10) << name;
    }
    world().barrier();
  }
}

// A component collapsed onto repeated points has a singular covariance: the error names it and
// suggests --reg-covar, on every rank.
TEST(Em, SingularCovarianceNamesComponentAndRegCovar) {
  const std::string data = tmp("em_singular.h5");
  if (world().is_root()) {
    std::vector<double> x;
    for (int i = 0; i < 600; ++i) {
      const bool dup = i % 2 == 0;  // every even row is the same point
      x.push_back(dup ? 5.0 : std::sin(i) * 3);
      x.push_back(dup ? -1.0 : std::cos(1.7 * i) * 3);
    }
    std::vector<double> r;  // component 1 owns exactly the duplicated rows
    for (int i = 0; i < 600; ++i) {
      r.push_back(i % 2 == 0 ? 0.0 : 1.0);
      r.push_back(i % 2 == 0 ? 1.0 : 0.0);
    }
    io::FileWriter w(data);
    w.write("X", x, {600, 2});
    w.write("resp", r, {600, 2});
    w.commit();
  }
  world().barrier();
  gmm::FitOptions o;
  o.data = data + ":/X";
  o.components = 2;
  o.algorithm = gmm::Algorithm::kEm;
  o.init = data + ":/resp";
  o.reg_covar = 0;
  try {
    gmm::fit(world(), o, nullptr);
    ADD_FAILURE() << "no error on rank " << world().rank();
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("component 1"), std::string::npos) << m;
    EXPECT_NE(m.find("--reg-covar"), std::string::npos) << m;
  }
  o.reg_covar = 1e-6;  // and the suggestion works
  EXPECT_NO_THROW(gmm::fit(world(), o, nullptr));
  world().barrier();
}

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
