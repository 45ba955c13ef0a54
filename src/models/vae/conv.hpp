#pragma once
// Convolution, transposed convolution and batch normalisation for the convolutional VAE
// (Radford, Metz & Chintala 2016's stride-2 pattern; Bruno 2022, section 4.4), templated on the
// scalar type like layers.hpp: float32 in training, double in the finite-difference tests.
//
// Layout. As in layers.hpp, activations are column-major "features x rows" matrices; an image's
// column holds its C x H x W values channel-major (index c H W + h W + w), the memory order of a
// PyTorch NCHW tensor, so a prepared image file is used as it is. Weights are row-major
// C_out x (C_in k k), the layout of PyTorch's Conv2d.weight (out, in, kh, kw).
//
// Method: im2col plus one GEMM per layer and batch (Chellapilla, Puri & Simard 2006). The rows of
// the patch matrix are (image, output position) pairs, its columns (input channel, kernel row,
// kernel column): one GEMM covers the whole block of images. The result is a function of the
// block's contents and shape alone, which the gradient driver fixes from the batch size and
// --micro-blocks, never from the rank or thread count. It is not independent of the block size:
// Eigen's GEMM blocks its rows by panel, so an image's outputs can round differently in a block of
// another size or at another position (bench/conv_onednn.cpp measured up to 2.7e-7 relative).
//
// A transposed convolution is the adjoint of a convolution: with the same weights (PyTorch's
// ConvTranspose2d.weight is (in, out, kh, kw), which is the adjoint convolution's (out, in, kh,
// kw)), its forward pass is the convolution's backward pass to its input and vice versa. It is
// described here by the shape of the convolution it is the adjoint of, which fixes its output
// size without PyTorch's output_padding.
#include <Eigen/Core>
#include <algorithm>
#include <cmath>

#include "models/vae/layers.hpp"

namespace caviar::vae {

// A convolution of an in_channels x height x width image with out_channels k x k kernels.
struct ConvShape {
  int in_channels = 1, height = 1, width = 1;
  int out_channels = 1, kernel = 1, stride = 1, pad = 0;

  int out_height() const { return (height + 2 * pad - kernel) / stride + 1; }
  int out_width() const { return (width + 2 * pad - kernel) / stride + 1; }
  int in_size() const { return in_channels * height * width; }      // features of an input
  int out_positions() const { return out_height() * out_width(); }  // P
  int out_size() const { return out_channels * out_positions(); }   // features of an output
  int patch() const { return in_channels * kernel * kernel; }       // columns of the patch matrix
  int weights() const { return out_channels * patch(); }
};

// The output columns [lo, hi) of a row whose kernel column kj reads inside the image: those with
// 0 <= ow stride - pad + kj < width.
inline void valid_columns(const ConvShape& s, int kj, int& lo, int& hi) {
  const int wo = s.out_width(), first = s.pad - kj;  // ow stride >= first
  lo = first <= 0 ? 0 : (first + s.stride - 1) / s.stride;
  const int last = s.width - 1 + s.pad - kj;  // ow stride <= last
  hi = last < 0 ? 0 : std::min(wo, last / s.stride + 1);
  lo = std::min(lo, hi);
}

// The patch matrix of x (in_size x N): N P x patch, row n P + p holding the input values under
// output position p of image n (zero where the kernel overlaps the padding).
template <class T>
void im2col(const ConvShape& s, const Mat<T>& x, Mat<T>& cols) {
  const int ho = s.out_height(), wo = s.out_width(), k = s.kernel, p = s.out_positions();
  cols.resize(Eigen::Index(x.cols()) * p, s.patch());
  for (int c = 0; c < s.in_channels; ++c)
    for (int ki = 0; ki < k; ++ki)
      for (int kj = 0; kj < k; ++kj) {
        const int col = (c * k + ki) * k + kj;
        int lo, hi;
        valid_columns(s, kj, lo, hi);
        for (Eigen::Index n = 0; n < x.cols(); ++n) {
          T* dst = &cols(n * p, col);
          const T* img = x.col(n).data() + Eigen::Index(c) * s.height * s.width;
          for (int oh = 0; oh < ho; ++oh, dst += wo) {
            const int ih = oh * s.stride - s.pad + ki;
            if (ih < 0 || ih >= s.height) {
              std::fill(dst, dst + wo, T(0));
              continue;
            }
            const int base = ih * s.width - s.pad + kj;  // + ow stride: inside for ow in [lo, hi)
            std::fill(dst, dst + lo, T(0));
            for (int ow = lo; ow < hi; ++ow) dst[ow] = img[base + ow * s.stride];
            std::fill(dst + hi, dst + wo, T(0));
          }
        }
      }
}

// The adjoint of im2col: adds each patch-matrix entry to the input value it was read from.
// x must be in_size x N (it is added to, not overwritten).
template <class T>
void col2im_add(const ConvShape& s, const Mat<T>& cols, Mat<T>& x) {
  const int ho = s.out_height(), wo = s.out_width(), k = s.kernel, p = s.out_positions();
  for (Eigen::Index n = 0; n < x.cols(); ++n)
    for (int c = 0; c < s.in_channels; ++c)
      for (int ki = 0; ki < k; ++ki)
        for (int kj = 0; kj < k; ++kj) {
          const int col = (c * k + ki) * k + kj;
          int lo, hi;
          valid_columns(s, kj, lo, hi);
          const T* src = &cols(n * p, col);
          T* img = x.col(n).data() + Eigen::Index(c) * s.height * s.width;
          for (int oh = 0; oh < ho; ++oh, src += wo) {
            const int ih = oh * s.stride - s.pad + ki;
            if (ih < 0 || ih >= s.height) continue;
            const int base = ih * s.width - s.pad + kj;
            for (int ow = lo; ow < hi; ++ow) img[base + ow * s.stride] += src[ow];
          }
        }
}

// Between the GEMM's layout (N P x C: row n P + p, column c) and the activations' (C P x N).
template <class T>
void positions_to_columns(const Mat<T>& m, int channels, int p, Mat<T>& y) {
  const Eigen::Index n = m.rows() / p;
  y.resize(Eigen::Index(channels) * p, n);
  for (Eigen::Index i = 0; i < n; ++i)
    for (int c = 0; c < channels; ++c)
      y.col(i).segment(Eigen::Index(c) * p, p) = m.col(c).segment(i * p, p);
}
template <class T>
void columns_to_positions(const Mat<T>& y, int channels, int p, Mat<T>& m) {
  m.resize(y.cols() * p, channels);
  for (Eigen::Index i = 0; i < y.cols(); ++i)
    for (int c = 0; c < channels; ++c)
      m.col(c).segment(i * p, p) = y.col(i).segment(Eigen::Index(c) * p, p);
}

// y = conv(x; W) + b: x is in_size x N, y out_size x N; `cols` keeps the patch matrix for the
// backward pass.
template <class T>
void conv_forward(const ConvShape& s, const T* w, const T* b, const Mat<T>& x, Mat<T>& cols,
                  Mat<T>& y) {
  im2col(s, x, cols);
  Mat<T> out = cols * WeightMap<T>(w, s.out_channels, s.patch()).transpose();  // N P x C_out
  out.rowwise() += VecMap<T>(b, s.out_channels).transpose();
  positions_to_columns(out, s.out_channels, s.out_positions(), y);
}

// Given dL/dy: dL/dW and dL/db written (not added) to gw and gb, and dL/dx if dx is given.
template <class T>
void conv_backward(const ConvShape& s, const T* w, const Mat<T>& cols, const Mat<T>& dy, T* gw,
                   T* gb, Mat<T>* dx) {
  Mat<T> d;  // N P x C_out
  columns_to_positions(dy, s.out_channels, s.out_positions(), d);
  WeightMapMut<T>(gw, s.out_channels, s.patch()).noalias() = d.transpose() * cols;
  VecMapMut<T>(gb, s.out_channels) = d.colwise().sum().transpose();
  if (dx) {
    const Mat<T> dcols = d * WeightMap<T>(w, s.out_channels, s.patch());
    dx->setZero(s.in_size(), dy.cols());
    col2im_add(s, dcols, *dx);
  }
}

// The transposed convolution of `s` (the adjoint of conv_forward without its bias): x is
// out_size x N (s.out_channels channels), y is in_size x N plus the bias b (s.in_channels
// entries, one per output channel).
template <class T>
void conv_transpose_forward(const ConvShape& s, const T* w, const T* b, const Mat<T>& x,
                            Mat<T>& y) {
  Mat<T> xp;  // N P x C_out of s
  columns_to_positions(x, s.out_channels, s.out_positions(), xp);
  const Mat<T> cols = xp * WeightMap<T>(w, s.out_channels, s.patch());
  y.setZero(s.in_size(), x.cols());
  col2im_add(s, cols, y);
  const int hw = s.height * s.width;
  for (int c = 0; c < s.in_channels; ++c) y.middleRows(Eigen::Index(c) * hw, hw).array() += b[c];
}

// Its backward pass: dL/dW, dL/db written to gw, gb; dL/dx if dx is given.
template <class T>
void conv_transpose_backward(const ConvShape& s, const T* w, const Mat<T>& x, const Mat<T>& dy,
                             T* gw, T* gb, Mat<T>* dx) {
  Mat<T> dcols, xp;
  im2col(s, dy, dcols);  // N P x patch
  columns_to_positions(x, s.out_channels, s.out_positions(), xp);
  WeightMapMut<T>(gw, s.out_channels, s.patch()).noalias() = xp.transpose() * dcols;
  const int hw = s.height * s.width;
  for (int c = 0; c < s.in_channels; ++c) gb[c] = dy.middleRows(Eigen::Index(c) * hw, hw).sum();
  if (dx) {
    const Mat<T> d = dcols * WeightMap<T>(w, s.out_channels, s.patch()).transpose();
    positions_to_columns(d, s.out_channels, s.out_positions(), *dx);
  }
}

// Batch normalisation (Ioffe & Szegedy 2015, Algorithm 1) of `channels` channels of `positions`
// values each (positions = 1 after a dense layer), normalised with the statistics of the whole
// global minibatch: the per-channel sums below are local, and the caller sums them over every
// rank's share of the batch (exactly) before the next call. So the layer's output does not depend
// on how the minibatch is split. The variance is computed in two passes (the sum of squared
// deviations from the reduced mean) because the one-pass E[x^2] - E[x]^2 cancels for channels
// with a large mean; it is the biased variance, as in training mode of the reference.

// Per-channel sum of x (shift = null) or of (x - shift_c)^2, accumulated in double.
template <class T>
Eigen::VectorXd bn_channel_sums(const Mat<T>& x, int channels, int positions,
                                const Eigen::VectorXd* shift = nullptr) {
  Eigen::VectorXd s = Eigen::VectorXd::Zero(channels);
  for (Eigen::Index n = 0; n < x.cols(); ++n)
    for (int c = 0; c < channels; ++c) {
      const auto v =
          x.col(n).segment(Eigen::Index(c) * positions, positions).template cast<double>();
      s[c] += shift ? (v.array() - (*shift)[c]).square().sum() : v.sum();
    }
  return s;
}

// y = gamma_c xhat + beta_c with xhat = (x - mean_c) / sqrt(var_c + eps); keeps xhat and
// inv_std = 1 / sqrt(var + eps) for the backward pass.
template <class T>
void bn_forward(const Mat<T>& x, int channels, int positions, const Eigen::VectorXd& mean,
                const Eigen::VectorXd& var, double eps, const T* gamma, const T* beta, Mat<T>& xhat,
                Eigen::VectorXd& inv_std, Mat<T>& y) {
  inv_std = (var.array() + eps).rsqrt();
  xhat.resize(x.rows(), x.cols());
  y.resize(x.rows(), x.cols());
  for (int c = 0; c < channels; ++c) {
    const auto rows = Eigen::seqN(Eigen::Index(c) * positions, positions);
    for (Eigen::Index n = 0; n < x.cols(); ++n) {
      xhat.col(n)(rows) = ((x.col(n)(rows).array() - T(mean[c])) * T(inv_std[c])).matrix();
      y.col(n)(rows) = (gamma[c] * xhat.col(n)(rows).array() + beta[c]).matrix();
    }
  }
}

// The local per-channel sums of dL/dy and of dL/dy * xhat (the first `channels` entries and the
// next ones), which the caller sums over ranks: summed, they are dL/dbeta and dL/dgamma.
template <class T>
Eigen::VectorXd bn_backward_sums(const Mat<T>& dy, const Mat<T>& xhat, int channels,
                                 int positions) {
  Eigen::VectorXd s = Eigen::VectorXd::Zero(2 * Eigen::Index(channels));
  for (Eigen::Index n = 0; n < dy.cols(); ++n)
    for (int c = 0; c < channels; ++c) {
      const auto rows = Eigen::seqN(Eigen::Index(c) * positions, positions);
      const auto d = dy.col(n)(rows).template cast<double>();
      s[c] += d.sum();
      s[channels + c] += d.dot(xhat.col(n)(rows).template cast<double>());
    }
  return s;
}

// dL/dx from the summed `sums` of bn_backward_sums over the global minibatch of `count` values
// per channel (Ioffe & Szegedy 2015, section 3, with the mean and variance terms collected):
//   dx = gamma inv_std (dy - sum(dy) / count - xhat sum(dy xhat) / count).
template <class T>
void bn_backward(const Mat<T>& dy, const Mat<T>& xhat, int channels, int positions, const T* gamma,
                 const Eigen::VectorXd& inv_std, const Eigen::VectorXd& sums, double count,
                 Mat<T>& dx) {
  dx.resize(dy.rows(), dy.cols());
  for (int c = 0; c < channels; ++c) {
    const auto rows = Eigen::seqN(Eigen::Index(c) * positions, positions);
    const T scale = T(gamma[c] * inv_std[c]);
    const T m1 = T(sums[c] / count), m2 = T(sums[channels + c] / count);
    for (Eigen::Index n = 0; n < dy.cols(); ++n)
      dx.col(n)(rows) =
          (scale * (dy.col(n)(rows).array() - m1 - xhat.col(n)(rows).array() * m2)).matrix();
  }
}

}  // namespace caviar::vae
