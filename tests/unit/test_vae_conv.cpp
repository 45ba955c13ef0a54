// The convolutional layers and batch normalisation of models/vae/conv.hpp: against a direct
// loop-nest convolution, adjoint identities, and finite differences (in double).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "models/vae/conv.hpp"
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

}  // namespace
}  // namespace caviar::vae
