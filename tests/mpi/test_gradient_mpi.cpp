// The engine's gradient driver (engine/gradient.hpp) on a model other than the VAE: Bayesian
// linear regression's log joint, F(w) = sum_i -(y_i - x_i . w)^2 / 2 + g(w) with the global term
// g(w) = -lambda |w|^2 / 2 (a Gaussian prior), fitted by Robbins-Monro steps and by Adam. Each
// test compares the run on all ranks of COMM_WORLD with the same run on rank 0 alone (COMM_SELF),
// so registering this binary at P = 1, 2, 4 covers those rank counts; a stop signal in the
// middle of an epoch and a resume (at the same or another rank count) must give the same bits.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "comm/comm.hpp"
#include "core/signals.hpp"
#include "engine/checkpoint.hpp"
#include "engine/gradient.hpp"
#include "inference/checkpoint.hpp"

namespace caviar::engine {
namespace {

const Comm& world() {
  static const Comm c = Comm::world();
  return c;
}

std::string tmp(const std::string& name) {
  return std::string(CAVIAR_TEST_TMPDIR) + "/gradient_np" + std::to_string(world().size()) + "_" +
         name;
}

constexpr int kDim = 3;
constexpr std::int64_t kRows = 203;  // the last minibatch of an epoch is partial

class Regression {
 public:
  static constexpr bool kGlobalTerm = true;
  struct Workspace {};
  explicit Regression(double lambda) : lambda_(lambda), w_(16, 0.0f) {
    for (std::int64_t i = 0; i < kRows; ++i) {
      double y = 0.5;
      for (int j = 0; j < kDim; ++j) {
        x_.push_back(std::sin(0.37 * static_cast<double>(i * kDim + j + 1)));
        y += (j + 1) * x_.back();
      }
      y_.push_back(y + 0.1 * std::cos(1.7 * static_cast<double>(i)));
    }
  }
  Workspace make_workspace() const { return {}; }
  Params& params() { return w_; }
  double block(Workspace&, std::span<const std::int64_t> rows, std::int64_t step, float* g) const {
    if (step == stop_at_step) StopSignals::raise_for_test(SIGUSR1);
    std::fill(g, g + w_.size(), 0.0f);
    double f = 0;
    for (std::int64_t r : rows) {
      double res = y_[r];
      for (int j = 0; j < kDim; ++j) res -= x_[r * kDim + j] * w_[j];
      f -= res * res / 2;
      for (int j = 0; j < kDim; ++j) g[j] -= static_cast<float>(res * x_[r * kDim + j]);
    }
    return f;
  }
  double global_term(float* g) const {
    double f = 0;
    for (int j = 0; j < kDim; ++j) {
      f -= lambda_ * w_[j] * w_[j] / 2;
      if (g) g[j] = static_cast<float>(lambda_ * w_[j]);
    }
    if (g) std::fill(g + kDim, g + w_.size(), 0.0f);
    return f;
  }
  void save(StateWriter& w) const {
    w.array("w", std::vector<double>(w_.begin(), w_.end()), {w_.size()});
  }
  void load(const StateReader& r) {
    const std::vector<double> v = r.array("w", {w_.size()});
    std::copy(v.begin(), v.end(), w_.begin());
  }
  std::int64_t stop_at_step = -1;  // raise SIGUSR1 (as if sent) while computing this step

 private:
  double lambda_;
  Params w_;
  std::vector<double> x_, y_;
};
static_assert(GradientModel<Regression>);

struct Fit {
  Params w;
  Trace trace;
  std::int64_t steps = 0;
};

Fit fit(const Comm& comm, Method method, int epochs, CheckpointFiles files = {},
        std::int64_t stop_at_step = -1) {
  Regression model(0.5);
  model.stop_at_step = stop_at_step;
  Checkpointer ck(comm, files, {}, "");
  ckpt::Fingerprint fp("regression");
  fp.add("method", static_cast<std::int64_t>(method), "--optimizer");
  ck.open(fp);
  GradientRun run;
  run.comm = &comm;
  run.stop = {epochs, 0.0};
  run.checkpoint = &ck;
  run.global_rows = kRows;
  run.rows = {0, kRows};
  run.schedule.batch_size = 40;
  run.schedule.micro_blocks = 3;
  run.schedule.seed = 11;
  run.schedule.optimizer.method = method;
  run.schedule.optimizer.adam.lr = method == Method::kAdam ? 0.05 : 0.2;
  const RunResult r = fit_gradient(model, run);
  return {model.params(), r.trace, r.steps};
}

bool same_bits(const Params& a, const Params& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

void expect_same_on_self(Method method, const Fit& on_world, int threads) {
  if (world().is_root()) {
    omp_set_num_threads(threads);
    const Fit on_self = fit(Comm::self(), method, 6);
    EXPECT_TRUE(same_bits(on_world.w, on_self.w));
    EXPECT_EQ(on_world.trace.objective, on_self.trace.objective);
    EXPECT_EQ(on_world.steps, on_self.steps);
  }
  omp_set_num_threads(1);
  world().barrier();
}

TEST(GradientDriver, RankAndThreadInvariantWithAGlobalTerm) {
  for (Method m : {Method::kRobbinsMonro, Method::kAdam}) {
    const Fit f = fit(world(), m, 6);
    EXPECT_EQ(f.steps, 6 * 6);  // ceil(203 / 40) steps per epoch
    ASSERT_EQ(f.trace.objective.size(), 6u);
    // The fit moves towards the ridge solution (near w = (1, 2, 3)): the objective per row rises.
    EXPECT_GT(f.trace.objective.back(), f.trace.objective.front());
    expect_same_on_self(m, f, 3);
  }
}

TEST(GradientDriver, StopMidEpochThenResumeIsBitExact) {
  const std::string ck = tmp("ck.h5");
  const Fit straight = fit(world(), Method::kAdam, 6);
  // Stopped by a signal during step 15 (epoch 3, step 3): checkpointed at the next boundary.
  EXPECT_THROW(fit(world(), Method::kAdam, 6, {ck, "", ""}, 15), ckpt::Preempted);
  world().barrier();
  Fit resumed;
  if (world().is_root()) {  // resumed at another rank count (1)
    resumed = fit(Comm::self(), Method::kAdam, 6, {"", "", ck});
    EXPECT_TRUE(same_bits(straight.w, resumed.w));
    EXPECT_EQ(straight.trace.objective, resumed.trace.objective);
    EXPECT_EQ(straight.steps, resumed.steps);
  }
  world().barrier();
  // And at this rank count, from a checkpoint taken at an epoch's end (--checkpoint-every 2).
  fit(world(), Method::kAdam, 4, {ck, "2", ""});
  resumed = fit(world(), Method::kAdam, 6, {"", "", ck});
  EXPECT_TRUE(same_bits(straight.w, resumed.w));
  EXPECT_EQ(straight.trace.objective, resumed.trace.objective);
}

TEST(GradientDriver, RefusesAnotherModelsCheckpoint) {
  const std::string ck = tmp("ck_rm.h5");
  fit(world(), Method::kRobbinsMonro, 1, {ck, "1", ""});
  EXPECT_THROW(fit(world(), Method::kAdam, 2, {"", "", ck}), Error);
}

}  // namespace
}  // namespace caviar::engine
