// The data-parallel VAE: parameters must be bitwise identical whatever the rank and thread count,
// resuming from a checkpoint must continue exactly, bad input must fail on every rank. Each test
// compares the run on all ranks of COMM_WORLD with the same run on rank 0 alone (COMM_SELF), so
// registering this binary at P = 1, 2, 4 covers those rank counts.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <random>

#include "comm/comm.hpp"
#include "core/error.hpp"
#include "inference/vae_driver.hpp"
#include "io/h5.hpp"

namespace caviar::vae {
namespace {

const Comm& world() {
  static const Comm c = Comm::world();
  return c;
}

std::string tmp(const std::string& name) {
  return std::string(CAVIAR_TEST_TMPDIR) + "/vae_np" + std::to_string(world().size()) + "_" + name;
}

// Binary-ish images: three prototypes of 20 pixels with 10% of the pixels flipped and grey
// levels; written once by rank 0.
const std::string& data_file() {
  static const std::string path = [] {
    const std::string p = tmp("data.h5");
    if (world().is_root()) {
      std::mt19937_64 gen(42);
      std::uniform_real_distribution<double> u(0, 1);
      auto make = [&](int n) {
        std::vector<double> x(static_cast<std::size_t>(n) * 20);
        for (int i = 0; i < n; ++i)
          for (int j = 0; j < 20; ++j) {
            const bool on = (j * 3 / 20) == (i % 3);
            const double v = on ? 0.9 : 0.1;
            x[i * 20 + j] = u(gen) < 0.1 ? 1 - v : v;
          }
        return x;
      };
      io::FileWriter w(p);
      w.write("X", make(600), {600, 20});
      w.write("T", make(200), {200, 20});
      std::vector<double> bad = make(100);
      bad[57 * 20 + 3] = 1.5;
      w.write("Bad", bad, {100, 20});
      w.write("Wide", make(50), {100, 10});  // the wrong number of columns
      w.commit();
    }
    world().barrier();
    return p;
  }();
  return path;
}

TrainOptions small_options() {
  TrainOptions o;
  o.data = data_file() + ":/X";
  o.test = data_file() + ":/T";
  o.hidden = {16, 8};
  o.latent = 3;
  o.epochs = 2;
  o.batch_size = 64;  // 600 rows: the last batch of each epoch is partial (24 rows)
  o.micro_blocks = 4;
  o.samples = 2;
  o.lr = 3e-3;
  o.weight_decay = 1e-4;
  o.seed = 7;
  return o;
}

bool bitwise_equal(const ParamVec& a, const ParamVec& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::size_t count_different(const ParamVec& a, const ParamVec& b) {
  std::size_t n = 0;
  for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i) n += a[i] != b[i];
  return n;
}

void expect_same_on_self(const TrainOptions& o, const TrainResult& r_world, int self_threads) {
  if (world().is_root()) {
    const Comm self = Comm::self();
    omp_set_num_threads(self_threads);
    const TrainResult r_self = train(self, o, nullptr);
    EXPECT_TRUE(bitwise_equal(r_world.params, r_self.params))
        << count_different(r_world.params, r_self.params) << " of " << r_self.params.size()
        << " parameters differ between " << world().size() << " ranks and 1";
    EXPECT_EQ(r_world.running, r_self.running);  // batch norm's (conv); empty for the MLP
    EXPECT_EQ(r_world.train_trace, r_self.train_trace);
    EXPECT_EQ(r_world.test_trace, r_self.test_trace);
  }
  omp_set_num_threads(1);
  world().barrier();
}

TEST(VaeMpi, ParametersIdenticalForAnyRankCount) {
  const TrainOptions o = small_options();
  omp_set_num_threads(1);
  const TrainResult r = train(world(), o, nullptr);
  EXPECT_EQ(r.steps, 2 * 10);
  ASSERT_EQ(r.train_trace.size(), 2u);
  EXPECT_TRUE(std::isfinite(r.test_elbo));
  // Rank 0 alone with two threads: neither the rank count nor the thread count may matter.
  expect_same_on_self(o, r, 2);
}

TEST(VaeMpi, ParametersIdenticalWithTwoThreadsPerRankAndGaussian) {
  TrainOptions o = small_options();
  o.likelihood = "gaussian";
  o.hidden = {12};
  o.micro_blocks = 8;
  o.samples = 1;
  o.lr = 1e-3;
  omp_set_num_threads(2);
  const TrainResult r = train(world(), o, nullptr);
  expect_same_on_self(o, r, 1);
}

TEST(VaeMpi, ResumeContinuesIdentically) {
  TrainOptions o = small_options();
  o.epochs = 2;
  o.out = tmp("full.h5");
  const TrainResult full = train(world(), o, nullptr);

  TrainOptions first = small_options();
  first.epochs = 1;
  first.checkpoint = tmp("ck.h5");
  train(world(), first, nullptr);
  TrainOptions second = small_options();
  second.epochs = 2;
  second.resume = tmp("ck.h5");
  second.out = tmp("resumed.h5");
  const TrainResult resumed = train(world(), second, nullptr);
  EXPECT_TRUE(bitwise_equal(full.params, resumed.params))
      << count_different(full.params, resumed.params) << " parameters differ after resuming";
  EXPECT_EQ(full.train_trace, resumed.train_trace);
  EXPECT_EQ(full.test_trace, resumed.test_trace);
  EXPECT_EQ(full.steps, resumed.steps);

  // The model file holds the same weights, by layer name.
  const LoadedModel a = load_model(world(), tmp("full.h5"));
  const LoadedModel b = load_model(world(), tmp("resumed.h5"));
  EXPECT_TRUE(bitwise_equal(a.params, full.params));
  EXPECT_TRUE(bitwise_equal(b.params, full.params));

  // Resuming with another batch size cannot continue identically: refused on every rank.
  TrainOptions wrong = second;
  wrong.batch_size = 32;
  wrong.out = tmp("wrong.h5");
  EXPECT_THROW(train(world(), wrong, nullptr), Error);
}

// The convolutional VAE: batch norm normalises over the whole global minibatch, so each step
// has mid-pass reductions; the parameters and the running statistics must still be the same bits
// at any rank and thread count (4 ranks leave some ranks without a block in the partial last
// batch), and a resumed run must continue exactly, running statistics included.
TrainOptions conv_options() {
  TrainOptions o = small_options();
  o.arch = "conv";
  o.channels = {3, 4};  // 4 x 5 images -> 2 x 2 -> 1 x 1
  o.image = "1x4x5";
  o.samples = 2;
  return o;
}

TEST(VaeMpi, ConvParametersAndRunningStatisticsIdenticalForAnyRankCount) {
  const TrainOptions o = conv_options();
  omp_set_num_threads(1);
  const TrainResult r = train(world(), o, nullptr);
  ASSERT_EQ(r.train_trace.size(), 2u);
  EXPECT_TRUE(std::isfinite(r.test_elbo));
  EXPECT_EQ(r.running.size(), 2u * (3 + 4 + 4 + 3));
  expect_same_on_self(o, r, 2);
}

TEST(VaeMpi, ConvResumeContinuesIdentically) {
  TrainOptions o = conv_options();
  o.out = tmp("conv_full.h5");
  const TrainResult full = train(world(), o, nullptr);
  TrainOptions first = conv_options();
  first.epochs = 1;
  first.checkpoint = tmp("conv_ck.h5");
  train(world(), first, nullptr);
  TrainOptions second = conv_options();
  second.resume = tmp("conv_ck.h5");
  const TrainResult resumed = train(world(), second, nullptr);
  EXPECT_TRUE(bitwise_equal(full.params, resumed.params))
      << count_different(full.params, resumed.params) << " parameters differ after resuming";
  EXPECT_EQ(full.running, resumed.running);
  EXPECT_EQ(full.test_trace, resumed.test_trace);
  // The model file holds the weights and the running statistics.
  const LoadedModel m = load_model(world(), tmp("conv_full.h5"));
  EXPECT_TRUE(bitwise_equal(m.params, full.params));
  EXPECT_EQ(m.running, full.running);
  // A checkpoint of the MLP cannot resume a convolutional run: refused on every rank.
  TrainOptions mlp = small_options();
  mlp.epochs = 1;
  mlp.checkpoint = tmp("mlp_ck.h5");
  train(world(), mlp, nullptr);
  TrainOptions wrong = conv_options();
  wrong.resume = tmp("mlp_ck.h5");
  EXPECT_THROW(train(world(), wrong, nullptr), Error);
}

// A full-covariance encoder trained with the path-derivative gradient: the same bits at any rank
// and thread count, and a different fit from the closed-form KL's gradient (the option reaches
// the network).
TEST(VaeMpi, FullPosteriorWithStlIdenticalForAnyRankCount) {
  TrainOptions o = small_options();
  o.posterior = "full";
  o.estimator = "reparam";
  omp_set_num_threads(2);
  const TrainResult reparam = train(world(), o, nullptr);
  o.estimator = "auto";  // stl for a full posterior
  const TrainResult r = train(world(), o, nullptr);
  EXPECT_FALSE(bitwise_equal(r.params, reparam.params));
  expect_same_on_self(o, r, 1);
}

// The Bayesian decoder draws its weights once per step, keyed by (seed, parameter, step), and
// adds each block's share of their KL: the same bits at any rank and thread count.
TEST(VaeMpi, BayesianDecoderIdenticalForAnyRankCount) {
  TrainOptions o = small_options();
  o.bayesian_decoder = true;
  o.prior_scale = 0.5;
  omp_set_num_threads(2);
  const TrainResult r = train(world(), o, nullptr);
  EXPECT_GT(r.decoder_kl, 0);
  expect_same_on_self(o, r, 1);
}

TEST(VaeMpi, ElboIncreasesOnASmallProblem) {
  TrainOptions o = small_options();
  o.epochs = 10;
  o.batch_size = 32;
  o.lr = 1e-2;
  o.hidden = {32};
  o.latent = 2;
  o.samples = 1;
  o.weight_decay = 0;
  const TrainResult r = train(world(), o, nullptr);
  ASSERT_EQ(r.test_trace.size(), 10u);
  // 20 pixels of grey level 0.9 or 0.1, 10% swapped, three prototypes. An untrained decoder
  // (sigmoid(0) = 1/2) scores 20 log(1/2) = -13.9 nats; the best decoder (q = 0.82 or 0.18 per
  // pixel, about 0.47 nats each) plus the ~log 3 nats of KL to pick a prototype is about -10.6.
  EXPECT_LT(r.test_trace.front(), -12.5);
  EXPECT_GT(r.test_trace.back(), -11.5);
  EXPECT_GT(r.train_trace.back(), r.train_trace.front() + 1.5);
}

TEST(VaeMpi, EncodeMatchesTheModelOnEveryRow) {
  TrainOptions o = small_options();
  o.epochs = 1;
  o.out = tmp("enc_model.h5");
  train(world(), o, nullptr);
  const std::string codes = tmp("codes.h5");
  EXPECT_EQ(encode(world(), o.out, data_file() + ":/T", codes), 200);
  if (world().is_root()) {
    const Comm self = Comm::self();
    const LoadedModel m = load_model(self, o.out);
    io::FileReader r(codes), d(data_file());
    io::Dims dims;
    const auto mu = r.read("/mu", &dims);
    EXPECT_EQ(dims, (io::Dims{200, 3}));
    const auto lv = r.read("/logvar");
    const auto t = d.read("/T");
    Mat<float> x(20, 200);
    for (int i = 0; i < 200; ++i)
      for (int j = 0; j < 20; ++j) x(j, i) = static_cast<float>(t[i * 20 + j]);
    Network<float> net(m.layout);
    Mat<float> emu, elv;
    net.encode(m.params.data(), x, emu, elv);
    for (int i = 0; i < 200; ++i)
      for (int k = 0; k < 3; ++k) {
        EXPECT_NEAR(mu[i * 3 + k], emu(k, i), 1e-5 * (1 + std::abs(emu(k, i))));
        EXPECT_NEAR(lv[i * 3 + k], elv(k, i), 1e-5 * (1 + std::abs(elv(k, i))));
      }
  }
  world().barrier();
}

// Each failure must be thrown on every rank (the test's own gtest main would otherwise hang or
// report the rank that did not throw).
void expect_error(TrainOptions o, const std::string& fragment) {
  try {
    train(world(), o, nullptr);
    ADD_FAILURE() << "no error; expected one mentioning '" << fragment << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

TEST(VaeMpi, BadInputFailsOnEveryRank) {
  TrainOptions o = small_options();
  o.data = data_file() + ":/Bad";
  o.test = "";
  expect_error(o, "row 57, column 3");
  o = small_options();
  o.latent = 0;
  expect_error(o, "--latent");
  o = small_options();
  o.test = data_file() + ":/Wide";
  expect_error(o, "columns");
  o = small_options();
  o.batch_size = 601;
  expect_error(o, "--batch-size");
  o = small_options();
  o.data = data_file() + ":/Missing";
  expect_error(o, "Missing");
}

}  // namespace
}  // namespace caviar::vae
