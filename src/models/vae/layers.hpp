#pragma once
// The building blocks of the VAE (Kingma & Welling 2014, eq. 10 and appendices B-C; Bruno 2022,
// section 4.3), templated on the scalar type: training runs in float32, the finite-difference
// tests in double.
//
// Activations are column-major matrices "features x rows": a row-major N x D data block is the
// same memory, so batches are used without transposing. Weights are row-major (out x in), the
// layout of PyTorch's Linear.weight, so that the heads of one layer (mu and log sigma^2) are
// contiguous row ranges of one matrix and one GEMM computes both.
#include <Eigen/Core>
#include <cmath>

namespace caviar::vae {

template <class T>
using Mat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic>;  // features x rows
template <class T>
using Vec = Eigen::Matrix<T, Eigen::Dynamic, 1>;
template <class T>
using WeightMap =
    Eigen::Map<const Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>;
template <class T>
using WeightMapMut = Eigen::Map<Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>;
template <class T>
using VecMap = Eigen::Map<const Vec<T>>;
template <class T>
using VecMapMut = Eigen::Map<Vec<T>>;

inline constexpr double kLog2Pi = 1.8378770664093454835606594728112;

// y = W x + b for every column of x. W is out x in (row-major at w), b has out entries.
template <class T>
void dense_forward(const T* w, const T* b, int out, int in, const Mat<T>& x, Mat<T>& y) {
  y.resize(out, x.cols());
  y.noalias() = WeightMap<T>(w, out, in) * x;
  y.colwise() += VecMap<T>(b, out);
}

// Given dL/dy: dL/dW = dy x^T and dL/db = sum over columns of dy, written (not added) to gw and
// gb; dL/dx = W^T dy if dx is given (the first layer does not need it).
template <class T>
void dense_backward(const T* w, int out, int in, const Mat<T>& x, const Mat<T>& dy, T* gw, T* gb,
                    Mat<T>* dx) {
  WeightMapMut<T>(gw, out, in).noalias() = dy * x.transpose();
  VecMapMut<T>(gb, out) = dy.rowwise().sum();
  if (dx) {
    dx->resize(in, dy.cols());
    dx->noalias() = WeightMap<T>(w, out, in).transpose() * dy;
  }
}

// ReLU in place; its backward masks dL/da by a > 0 (a is the activation after the ReLU, which is
// positive exactly where the input was).
template <class T>
void relu_forward(Mat<T>& a) {
  a = a.cwiseMax(T(0));
}
template <class T>
void relu_backward(const Mat<T>& a, Mat<T>& d) {
  d = (a.array() > T(0)).select(d, T(0));
}

// Bernoulli log-likelihood of x given logits l, per column (Kingma & Welling 2014, appendix C.1,
// with y = sigmoid(l)), in the stable "with logits" form:
//   x l - softplus(l),  softplus(l) = max(l, 0) + log1p(e^{-|l|}).
// Also writes dL/dl for L = -scale * sum(log p), i.e. scale * (sigmoid(l) - x), into dl if given.
template <class T>
void bernoulli_loglik(const Mat<T>& logits, const Mat<T>& x_rep, Eigen::VectorXd& ll, T scale,
                      Mat<T>* dl) {
  const auto l = logits.array();
  const auto e = (-l.abs()).exp().eval();  // in (0, 1]: never overflows
  const auto terms = (x_rep.array() * l - l.cwiseMax(T(0)) - e.log1p()).eval();
  ll = terms.colwise().sum().transpose().template cast<double>();
  if (dl) {
    // sigmoid(l) without overflow: 1 / (1 + e) for l >= 0, e / (1 + e) for l < 0.
    const auto sig = (l >= T(0)).select((T(1) + e).inverse(), e / (T(1) + e));
    *dl = scale * (sig - x_rep.array()).matrix();
  }
}

// Gaussian log-likelihood of x with mean m and log-variance v (rows [0, D) and [D, 2D) of out),
// per column: -1/2 (log 2 pi + v + (x - m)^2 e^{-v}). dL/d(out) for L = -scale * sum(log p).
template <class T>
void gaussian_loglik(const Mat<T>& out, const Mat<T>& x_rep, Eigen::VectorXd& ll, T scale,
                     Mat<T>* dout) {
  const Eigen::Index d = x_rep.rows();
  const auto m = out.topRows(d).array();
  const auto v = out.bottomRows(d).array();
  const auto prec = (-v).exp().eval();
  const auto r = (x_rep.array() - m).eval();
  const auto terms = (T(-0.5) * (T(kLog2Pi) + v + r.square() * prec)).eval();
  ll = terms.colwise().sum().transpose().template cast<double>();
  if (dout) {
    dout->resize(2 * d, out.cols());
    dout->topRows(d) = (-scale * r * prec).matrix();
    dout->bottomRows(d) = (T(0.5) * scale * (T(1) - r.square() * prec)).matrix();
  }
}

// KL(N(mu, diag e^lv) || N(0, I)) per column = 1/2 sum_j (mu^2 + e^lv - 1 - lv), the negative of
// Kingma & Welling 2014, appendix B. With gradients dKL/dmu = mu and dKL/dlv = (e^lv - 1) / 2 times
// scale, if asked.
template <class T, class MuExpr, class LvExpr>
void kl_standard_normal(const MuExpr& mu, const LvExpr& lv, Eigen::VectorXd& kl, T scale,
                        Mat<T>* dmu, Mat<T>* dlv) {
  const auto elv = lv.array().exp().eval();
  kl = (T(0.5) * (mu.array().square() + elv - T(1) - lv.array()))
           .colwise()
           .sum()
           .transpose()
           .template cast<double>();
  if (dmu) *dmu = scale * mu;
  if (dlv) *dlv = (T(0.5) * scale * (elv - T(1))).matrix();
}

// Reparameterisation z = mu + sigma * eps with sigma = exp(lv / 2) (Kingma & Welling eq. 10), S
// samples per row: column i * S + s of z and eps belongs to row i.
template <class T, class MuExpr, class LvExpr>
void reparameterise(const MuExpr& mu, const LvExpr& lv, const Mat<T>& eps, int s, Mat<T>& z) {
  const Eigen::Index n = mu.cols();
  z.resize(mu.rows(), n * s);
  for (Eigen::Index i = 0; i < n; ++i) {
    const auto sigma = (T(0.5) * lv.col(i).array()).exp().eval();
    for (int k = 0; k < s; ++k)
      z.col(i * s + k) = (mu.col(i).array() + sigma * eps.col(i * s + k).array()).matrix();
  }
}

// Backward of reparameterise: given dL/dz, accumulates dL/dmu = sum_s dz and
// dL/dlv = sum_s dz * eps * sigma / 2 into dmu and dlv.
template <class T, class LvExpr>
void reparameterise_backward(const LvExpr& lv, const Mat<T>& eps, const Mat<T>& dz, int s,
                             Mat<T>& dmu, Mat<T>& dlv) {
  const Eigen::Index n = lv.cols();
  for (Eigen::Index i = 0; i < n; ++i) {
    const auto half_sigma = (T(0.5) * (T(0.5) * lv.col(i).array()).exp()).eval();
    for (int k = 0; k < s; ++k) {
      dmu.col(i) += dz.col(i * s + k);
      dlv.col(i).array() += dz.col(i * s + k).array() * eps.col(i * s + k).array() * half_sigma;
    }
  }
}

}  // namespace caviar::vae
