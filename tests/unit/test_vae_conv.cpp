// The convolutional layers and batch normalisation of models/vae/conv.hpp: against a direct
// loop-nest convolution, adjoint identities, and finite differences (in double); and the
// convolutional VAE built from them, trained in stages around batch norm's reductions.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "models/vae/conv.hpp"
#include "models/vae/vae.hpp"
#include "vae_fd.hpp"

namespace caviar::vae {
namespace {

using namespace testing;

// Odd sizes, stride 2 and padding 1: the cases where an index slip shows.
const ConvShape kShapes[] = {
    {.in_channels = 2,
     .height = 7,
     .width = 6,
     .out_channels = 3,
     .kernel = 4,
     .stride = 2,
     .pad = 1},
    {.in_channels = 3,
     .height = 5,
     .width = 5,
     .out_channels = 2,
     .kernel = 3,
     .stride = 1,
     .pad = 0},
    {.in_channels = 1,
     .height = 8,
     .width = 8,
     .out_channels = 4,
     .kernel = 4,
     .stride = 2,
     .pad = 1},
};

TEST(VaeConv, ShapesFollowTheConvolutionArithmetic) {
  // 28 x 28 -> 14 -> 7 with k = 4, s = 2, p = 1 (the Fashion-MNIST encoder).
  ConvShape s{.in_channels = 1,
              .height = 28,
              .width = 28,
              .out_channels = 32,
              .kernel = 4,
              .stride = 2,
              .pad = 1};
  EXPECT_EQ(s.out_height(), 14);
  s.height = s.width = 14;
  EXPECT_EQ(s.out_width(), 7);
  EXPECT_EQ(kShapes[0].out_height(), 3);  // floor((7 + 2 - 4) / 2) + 1
  EXPECT_EQ(kShapes[0].out_width(), 3);   // floor((6 + 2 - 4) / 2) + 1
}

TEST(VaeConv, ForwardMatchesADirectLoopNest) {
  for (const ConvShape& s : kShapes) {
    const int n = 3;
    const MatD x = random_mat(s.in_size(), n, 1);
    const std::vector<double> w = to_vec(random_mat(s.weights(), 1, 2));
    const std::vector<double> b = to_vec(random_mat(s.out_channels, 1, 3));
    MatD cols, y;
    conv_forward(s, w.data(), b.data(), x, cols, y);
    ASSERT_EQ(y.rows(), s.out_size());
    ASSERT_EQ(y.cols(), n);
    double worst = 0;
    for (int i = 0; i < n; ++i)
      for (int o = 0; o < s.out_channels; ++o)
        for (int oh = 0; oh < s.out_height(); ++oh)
          for (int ow = 0; ow < s.out_width(); ++ow) {
            double acc = b[o];
            for (int c = 0; c < s.in_channels; ++c)
              for (int ki = 0; ki < s.kernel; ++ki)
                for (int kj = 0; kj < s.kernel; ++kj) {
                  const int ih = oh * s.stride - s.pad + ki, iw = ow * s.stride - s.pad + kj;
                  if (ih < 0 || iw < 0 || ih >= s.height || iw >= s.width) continue;
                  acc += w[((o * s.in_channels + c) * s.kernel + ki) * s.kernel + kj] *
                         x((c * s.height + ih) * s.width + iw, i);
                }
            const double got = y((o * s.out_height() + oh) * s.out_width() + ow, i);
            worst = std::max(worst, std::abs(got - acc));
          }
    EXPECT_LT(worst, 1e-13);
  }
}

TEST(VaeConv, Col2imIsTheAdjointOfIm2col) {
  for (const ConvShape& s : kShapes) {
    const MatD x = random_mat(s.in_size(), 2, 4);
    MatD cols;
    im2col(s, x, cols);
    const MatD c = random_mat(cols.rows(), cols.cols(), 5);
    MatD back = MatD::Zero(s.in_size(), 2);
    col2im_add(s, c, back);
    // <im2col(x), c> = <x, col2im(c)>
    EXPECT_NEAR((cols.array() * c.array()).sum(), (x.array() * back.array()).sum(), 1e-12);
  }
}

TEST(VaeConv, TransposedConvolutionIsTheAdjointOfConvolution) {
  for (const ConvShape& s : kShapes) {
    const std::vector<double> w = to_vec(random_mat(s.weights(), 1, 6));
    const std::vector<double> zero_out(s.out_channels, 0.0), zero_in(s.in_channels, 0.0);
    const MatD u = random_mat(s.in_size(), 3, 7), v = random_mat(s.out_size(), 3, 8);
    MatD cols, conv_u, convt_v;
    conv_forward(s, w.data(), zero_out.data(), u, cols, conv_u);
    conv_transpose_forward(s, w.data(), zero_in.data(), v, convt_v);
    ASSERT_EQ(convt_v.rows(), s.in_size());
    // <conv(u), v> = <u, conv^T(v)>
    EXPECT_NEAR((conv_u.array() * v.array()).sum(), (u.array() * convt_v.array()).sum(), 1e-12);
  }
}

TEST(VaeConv, ConvBackwardMatchesFiniteDifferences) {
  for (const ConvShape& s : kShapes) {
    const int n = 2;
    std::vector<double> w = to_vec(random_mat(s.weights(), 1, 9));
    std::vector<double> b = to_vec(random_mat(s.out_channels, 1, 10));
    std::vector<double> x = to_vec(random_mat(s.in_size(), n, 11));
    const MatD r = random_mat(s.out_size(), n, 12);  // L = sum(r .* y)
    auto loss = [&] {
      MatD cols, y;
      conv_forward(s, w.data(), b.data(), from_vec(x, s.in_size(), n), cols, y);
      return (r.array() * y.array()).sum();
    };
    MatD cols, y, dx;
    conv_forward(s, w.data(), b.data(), from_vec(x, s.in_size(), n), cols, y);
    std::vector<double> gw(w.size()), gb(b.size());
    conv_backward(s, w.data(), cols, r, gw.data(), gb.data(), &dx);
    expect_gradient(w, loss, gw, 1e-7, "conv dW");
    expect_gradient(b, loss, gb, 1e-7, "conv db");
    expect_gradient(x, loss, to_vec(dx), 1e-7, "conv dx");
  }
}

TEST(VaeConv, TransposedBackwardMatchesFiniteDifferences) {
  for (const ConvShape& s : kShapes) {
    const int n = 2;
    std::vector<double> w = to_vec(random_mat(s.weights(), 1, 13));
    std::vector<double> b = to_vec(random_mat(s.in_channels, 1, 14));
    std::vector<double> x = to_vec(random_mat(s.out_size(), n, 15));
    const MatD r = random_mat(s.in_size(), n, 16);
    auto loss = [&] {
      MatD y;
      conv_transpose_forward(s, w.data(), b.data(), from_vec(x, s.out_size(), n), y);
      return (r.array() * y.array()).sum();
    };
    MatD dx;
    std::vector<double> gw(w.size()), gb(b.size());
    conv_transpose_backward(s, w.data(), from_vec(x, s.out_size(), n), r, gw.data(), gb.data(),
                            &dx);
    expect_gradient(w, loss, gw, 1e-7, "convT dW");
    expect_gradient(b, loss, gb, 1e-7, "convT db");
    expect_gradient(x, loss, to_vec(dx), 1e-7, "convT dx");
  }
}

// Batch norm with the statistics of the whole batch, computed as the layer's callers will: the
// mean from the summed channel sums, the variance from the summed squared deviations.
struct BnResult {
  MatD y, xhat;
  Eigen::VectorXd inv_std;
};
BnResult bn_whole_batch(const MatD& x, int channels, int positions, const double* gamma,
                        const double* beta) {
  const double count = double(positions) * double(x.cols());
  const Eigen::VectorXd mean = bn_channel_sums(x, channels, positions) / count;
  const Eigen::VectorXd var = bn_channel_sums(x, channels, positions, &mean) / count;
  BnResult r;
  bn_forward(x, channels, positions, mean, var, 1e-5, gamma, beta, r.xhat, r.inv_std, r.y);
  return r;
}

TEST(VaeBatchNorm, NormalisesEachChannelOverTheBatch) {
  const int channels = 3, positions = 5, n = 4;
  const MatD x = (random_mat(channels * positions, n, 17, 2, 9)).eval();  // a large mean
  const std::vector<double> gamma(channels, 1.0), beta(channels, 0.0);
  const BnResult r = bn_whole_batch(x, channels, positions, gamma.data(), beta.data());
  for (int c = 0; c < channels; ++c) {
    double s = 0, ss = 0;
    for (int i = 0; i < n; ++i)
      for (int p = 0; p < positions; ++p) {
        const double v = r.y(c * positions + p, i);
        s += v;
        ss += v * v;
      }
    const double m = s / (positions * n), var = ss / (positions * n) - m * m;
    EXPECT_NEAR(m, 0, 1e-12);
    EXPECT_NEAR(var, 1, 1e-3);  // var / (var + eps), eps = 1e-5
  }
}

TEST(VaeBatchNorm, SumsOfSharesAreTheSumsOfTheBatch) {
  // What makes the layer independent of the rank count: the sums of two shares of a batch are the
  // batch's sums (up to rounding of the double accumulation).
  const int channels = 2, positions = 6, n = 5;
  const MatD x = random_mat(channels * positions, n, 18);
  const Eigen::VectorXd whole = bn_channel_sums(x, channels, positions);
  const Eigen::VectorXd parts = bn_channel_sums<double>(x.leftCols(2), channels, positions) +
                                bn_channel_sums<double>(x.rightCols(3), channels, positions);
  EXPECT_LT((whole - parts).cwiseAbs().maxCoeff(), 1e-13);
}

TEST(VaeBatchNorm, BackwardMatchesFiniteDifferences) {
  const int channels = 3, positions = 4, n = 3;
  std::vector<double> gamma = to_vec(random_mat(channels, 1, 19, 0.5, 1.5));
  std::vector<double> beta = to_vec(random_mat(channels, 1, 20));
  std::vector<double> x = to_vec(random_mat(channels * positions, n, 21));
  const MatD r = random_mat(channels * positions, n, 22);
  auto loss = [&] {
    const BnResult b = bn_whole_batch(from_vec(x, channels * positions, n), channels, positions,
                                      gamma.data(), beta.data());
    return (r.array() * b.y.array()).sum();
  };
  const BnResult b = bn_whole_batch(from_vec(x, channels * positions, n), channels, positions,
                                    gamma.data(), beta.data());
  const Eigen::VectorXd sums = bn_backward_sums(r, b.xhat, channels, positions);
  MatD dx;
  bn_backward(r, b.xhat, channels, positions, gamma.data(), b.inv_std, sums, double(positions) * n,
              dx);
  const std::vector<double> gbeta(sums.data(), sums.data() + channels);
  const std::vector<double> ggamma(sums.data() + channels, sums.data() + 2 * channels);
  expect_gradient(beta, loss, gbeta, 1e-7, "bn dbeta");
  expect_gradient(gamma, loss, ggamma, 1e-7, "bn dgamma");
  expect_gradient(x, loss, to_vec(dx), 1e-6, "bn dx");
}

// ---- The convolutional VAE as a whole (models/vae/vae.hpp) ----

Architecture conv_architecture(Likelihood lik, Posterior post) {
  Architecture a;
  a.input_dim = 64;
  a.latent = 3;
  a.likelihood = lik;
  a.posterior = post;
  a.channels = {3, 4};  // 8 x 8 -> 4 x 4 -> 2 x 2
  a.image_channels = 1;
  a.height = 8;
  a.width = 8;
  return a;
}

// One training pass over the columns of x cut into blocks of the given sizes, run stage by stage
// as the gradient driver runs it (each block's partial sums gathered in block order, combined,
// handed to every block's next stage). Returns the sum of the ELBOs; the blocks' gradients are
// summed into grad if given. forward_stats, if given, receives each forward reduction's combined
// (count, means, variances).
double staged_pass(const Layout& layout, const std::vector<double>& p, const MatD& x,
                   const MatD& eps, int s, const std::vector<int>& blocks,
                   std::vector<double>* grad, std::vector<std::vector<double>>* forward_stats) {
  const int n_red = Network<double>::reductions(layout);
  std::vector<Network<double>> nets(blocks.size(), Network<double>(layout));
  std::vector<MatD> xs, es;
  for (std::size_t b = 0, c = 0; b < blocks.size(); c += blocks[b], ++b) {
    xs.push_back(x.middleCols(c, blocks[b]));
    es.push_back(eps.middleCols(c * s, blocks[b] * s));
  }
  std::vector<std::vector<double>> g(blocks.size(), std::vector<double>(p.size(), 0.0));
  std::vector<double> combined;
  double total = 0;
  for (int k = 0; k <= n_red; ++k) {
    const std::size_t m = k < n_red ? Network<double>::reduction_size(layout, k) : 0;
    std::vector<double> all(blocks.size() * m);
    for (std::size_t b = 0; b < blocks.size(); ++b) {
      const double f = nets[b].stage(p.data(), k, xs[b], es[b], s, combined,
                                     std::span<double>(all.data() + b * m, m), g[b].data());
      if (k == n_red) total += f;
    }
    if (k < n_red) {
      Network<double>::combine(layout, k, all, static_cast<std::int64_t>(blocks.size()), combined,
                               nullptr);
      if (forward_stats && k < n_red / 2) forward_stats->push_back(combined);
    }
  }
  if (grad) {
    grad->assign(p.size(), 0.0);
    for (const auto& gb : g)
      for (std::size_t i = 0; i < p.size(); ++i) (*grad)[i] += gb[i];
  }
  return total;
}

std::vector<double> conv_params(const Layout& layout) {
  const ParamVec pf = xavier_init(layout, 3);
  std::vector<double> p(pf.begin(), pf.end());
  // Batch norm's gamma and beta away from 1 and 0, so that their gradients are exercised.
  for (const BatchNormLayer& b : layout.batch_norm)
    for (int c = 0; c < b.channels; ++c) {
      p[b.gamma + c] = 1 + 0.2 * std::sin(1.0 + c + b.gamma);
      p[b.beta + c] = 0.1 * std::cos(2.0 + c + b.beta);
    }
  return p;
}

// Every parameter's gradient of L = -sum_i ELBO_i through convolutions, ReLUs, batch norm over the
// whole minibatch (here cut into two blocks), the head, the samples and the transposed
// convolutions, against central differences of the same staged pass.
void check_conv_network(Likelihood lik, Posterior post, int s) {
  const Layout layout(conv_architecture(lik, post));
  ASSERT_EQ(layout.batch_norm.size(), 4u);  // two encoder layers, the projection, one decoder
  std::vector<double> p = conv_params(layout);
  const int n = 5;
  const MatD x =
      lik == Likelihood::kBernoulli ? random_mat(64, n, 21, 0, 1) : random_mat(64, n, 21);
  const MatD eps = random_mat(layout.latent(), n * s, 22, -1.5, 1.5);
  const std::vector<int> blocks{2, 3};
  std::vector<double> g;
  staged_pass(layout, p, x, eps, s, blocks, &g, nullptr);
  auto loss = [&] { return -staged_pass(layout, p, x, eps, s, blocks, nullptr, nullptr); };
  expect_gradient(p, loss, g, 1e-6, "conv network " + to_string(lik));
}

TEST(VaeConvNetwork, GradientMatchesFiniteDifferencesBernoulli) {
  check_conv_network(Likelihood::kBernoulli, Posterior::kDiagonal, 2);
}
TEST(VaeConvNetwork, GradientMatchesFiniteDifferencesGaussianFullPosterior) {
  check_conv_network(Likelihood::kGaussian, Posterior::kFull, 1);
}

// The path-derivative gradient of the KL term (Architecture::stl; Roeder, Wu & Duvenaud 2017)
// through the convolutional encoder and decoder and batch norm, with the full-covariance head: it
// is not the gradient of the objective's value, so no finite differences, but it is unbiased for
// the same gradient as the closed-form KL's. Over M draws of the minibatch's noise (batch norm
// couples its rows), the mean per-draw difference of the two is within 5 standard errors of zero
// in every parameter, as test_vae.cpp checks for the MLP.
TEST(VaeConvNetwork, StlGradientIsUnbiasedFullPosterior) {
  Architecture a = conv_architecture(Likelihood::kBernoulli, Posterior::kFull);
  const Layout rep_layout(a);
  a.stl = true;
  const Layout stl_layout(a);
  const std::vector<double> p = conv_params(rep_layout);
  const int n = 3, m = 20000;
  const MatD x = random_mat(64, n, 31, 0, 1);
  std::mt19937_64 noise(32);
  std::normal_distribution<double> normal;
  MatD eps(rep_layout.latent(), n);
  expect_same_mean(
      p.size(), m,
      [&](std::vector<double>& g_stl, std::vector<double>& g_rep) {
        for (Eigen::Index j = 0; j < eps.size(); ++j) eps.data()[j] = normal(noise);
        staged_pass(rep_layout, p, x, eps, 1, {n}, &g_rep, nullptr);
        staged_pass(stl_layout, p, x, eps, 1, {n}, &g_stl, nullptr);
      },
      "conv");
}

// Batch norm normalises with the statistics of the whole minibatch: how it is cut into blocks
// changes only rounding. Normalising each block with its own statistics (one-block passes) gives
// a different objective, so the check can fail.
TEST(VaeConvNetwork, BatchStatisticsDoNotDependOnTheBlocks) {
  const Layout layout(conv_architecture(Likelihood::kBernoulli, Posterior::kDiagonal));
  const std::vector<double> p = conv_params(layout);
  const int n = 7, s = 1;
  const MatD x = random_mat(64, n, 31, 0, 1);
  const MatD eps = random_mat(layout.latent(), n, 32);
  std::vector<double> g1, g3;
  const double f1 = staged_pass(layout, p, x, eps, s, {7}, &g1, nullptr);
  const double f3 = staged_pass(layout, p, x, eps, s, {3, 1, 3}, &g3, nullptr);
  EXPECT_NEAR(f1, f3, 1e-10 * std::abs(f1));
  for (std::size_t i = 0; i < g1.size(); ++i) EXPECT_NEAR(g1[i], g3[i], 1e-9) << i;
  const double own =
      staged_pass(layout, p, x.leftCols(3), eps.leftCols(3), s, {3}, nullptr, nullptr) +
      staged_pass(layout, p, x.middleCols(3, 1), eps.middleCols(3, 1), s, {1}, nullptr, nullptr) +
      staged_pass(layout, p, x.rightCols(3), eps.rightCols(3), s, {3}, nullptr, nullptr);
  EXPECT_GT(std::abs(own - f1), 1e-3);
}

// Outside training (Network::run with running statistics) batch norm uses the stored means and
// variances: given the minibatch's own statistics, the evaluation pass gives the training pass's
// ELBO.
TEST(VaeConvNetwork, EvaluationWithTheBatchStatisticsMatchesTraining) {
  const Layout layout(conv_architecture(Likelihood::kGaussian, Posterior::kDiagonal));
  const std::vector<double> p = conv_params(layout);
  const int n = 6, s = 2;
  const MatD x = random_mat(64, n, 41);
  const MatD eps = random_mat(layout.latent(), n * s, 42);
  std::vector<std::vector<double>> stats;
  const double f = staged_pass(layout, p, x, eps, s, {4, 2}, nullptr, &stats);
  ASSERT_EQ(stats.size(), layout.batch_norm.size());
  std::vector<double> running(static_cast<std::size_t>(layout.n_running));
  for (std::size_t b = 0; b < stats.size(); ++b) {
    const int c = layout.batch_norm[b].channels;
    for (int ch = 0; ch < 2 * c; ++ch)
      running[layout.batch_norm[b].running + ch] = stats[b][1 + ch];
  }
  Network<double> net(layout, running.data());
  EXPECT_NEAR(net.run(p.data(), x, eps, s, nullptr), f, 1e-10 * std::abs(f));
  // With the initial running statistics (means 0, variances 1) it differs.
  const std::vector<double> init = initial_running(layout);
  Network<double> fresh(layout, init.data());
  EXPECT_GT(std::abs(fresh.run(p.data(), x, eps, s, nullptr) - f), 1e-3);
}

// combine(): the pairwise merge of per-block (count, sum, M2) gives the two-pass mean and biased
// variance of the whole batch, and folds them into the running averages with momentum 0.1 and
// the unbiased variance.
TEST(VaeConvNetwork, CombinedStatisticsAreThoseOfTheWholeBatch) {
  const Layout layout(conv_architecture(Likelihood::kBernoulli, Posterior::kDiagonal));
  const BatchNormLayer& b = layout.batch_norm[0];  // 3 channels of 16 positions
  const MatD a = random_mat(b.channels * b.positions, 5, 51, -2, 3);
  const std::vector<int> cut{2, 3};
  std::vector<double> all;
  for (std::size_t j = 0, c0 = 0; j < cut.size(); c0 += cut[j], ++j) {
    const MatD part = a.middleCols(c0, cut[j]);
    const double n = static_cast<double>(cut[j]) * b.positions;
    const Eigen::VectorXd sum = bn_channel_sums(part, b.channels, b.positions);
    const Eigen::VectorXd mean = sum / n;
    const Eigen::VectorXd m2 = bn_channel_sums(part, b.channels, b.positions, &mean);
    all.push_back(n);
    for (int c = 0; c < b.channels; ++c) all.push_back(sum[c]);
    for (int c = 0; c < b.channels; ++c) all.push_back(m2[c]);
  }
  std::vector<double> out, running = initial_running(layout);
  Network<double>::combine(layout, 0, all, 2, out, running.data());
  const double n = 5.0 * b.positions;
  EXPECT_EQ(out[0], n);
  for (int c = 0; c < b.channels; ++c) {
    const auto v = a.middleRows(c * b.positions, b.positions).array();
    const double mean = v.sum() / n, var = (v - mean).square().sum() / n;
    EXPECT_NEAR(out[1 + c], mean, 1e-12);
    EXPECT_NEAR(out[1 + b.channels + c], var, 1e-12);
    EXPECT_NEAR(running[b.running + c], 0.1 * mean, 1e-12);
    EXPECT_NEAR(running[b.running + b.channels + c], 0.9 + 0.1 * var * n / (n - 1), 1e-12);
  }
}

}  // namespace
}  // namespace caviar::vae
