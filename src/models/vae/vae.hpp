#pragma once
// The VAE of Kingma & Welling 2014 with the ReLU MLPs of Bruno 2022, section 4.3: an MLP encoder
// x -> ReLU hidden layers -> (mu, log sigma^2) (Kingma & Welling 2014, appendix C.2), S
// reparameterised samples, an MLP decoder z -> ReLU hidden layers -> Bernoulli logits (appendix
// C.1) or Gaussian mean and log-variance, and the ELBO with the analytic KL (appendix B, eq. 10).
// No MPI and no HDF5 here: the engine's gradient driver (engine/gradient.hpp, through
// models/vae/gradient.hpp) owns the minibatches, the reduction and the optimiser, and
// src/inference/vae_driver.cpp the files.
//
// All parameters live in one contiguous buffer, gradients in another of the same layout, so that
// the data-parallel driver reduces one buffer per step.
#include <Eigen/Core>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/gradient_sum.hpp"
#include "engine/optimizer.hpp"
#include "models/vae/layers.hpp"

namespace caviar::vae {

enum class Likelihood { kBernoulli, kGaussian };
Likelihood parse_likelihood(const std::string& s);
std::string to_string(Likelihood l);

// The encoder's Gaussian q(z | x): diagonal covariance (Kingma & Welling 2014, appendix C.2), or
// full, with the Cholesky factor L = M (.) L' + diag(sigma) (Kingma & Welling 2019, section 2.5.2;
// Bruno 2022, eqs. 4.22-4.26): the encoder also outputs the Z (Z - 1) / 2 entries of the strictly
// lower-triangular L'.
enum class Posterior { kDiagonal, kFull };
Posterior parse_posterior(const std::string& s);
std::string to_string(Posterior p);

struct Architecture {
  int input_dim = 0;
  std::vector<int> hidden;  // encoder hidden widths; the decoder uses them in reverse order
  int latent = 0;
  Likelihood likelihood = Likelihood::kBernoulli;
  Posterior posterior = Posterior::kDiagonal;
};

// One dense layer's place in the parameter buffer: W (out x in, row-major) at offset w, then b
// (out) at offset b. A layer with several parts (the encoder's mu, log-variance and, for a full
// posterior, lower-triangle heads) splits its rows between them, part k having rows[k] of them;
// each part is saved under its own name.
struct Dense {
  std::vector<std::string> parts;
  std::vector<int> rows;  // per part; they sum to out
  int in = 0, out = 0;
  std::int64_t w = 0, b = 0;
};

// Parameter and gradient buffers: aligned to Eigen's largest packet (64 bytes with AVX-512).
using ParamVec = engine::Params;

// Every W and b starts at a multiple of kParamAlign entries, so with an aligned buffer every
// layer's Map is aligned too. Eigen picks vectorised or scalar code paths (whose rounding differs)
// from the destination's alignment: equal alignment in every buffer on every rank is part of
// what makes the results bitwise reproducible. The padding entries stay zero.
inline constexpr std::int64_t kParamAlign = 16;

struct Layout {
  Architecture arch;
  std::vector<Dense> encoder;  // hidden layers, then the (mu, logvar) head
  std::vector<Dense> decoder;  // hidden layers, then the output layer
  std::int64_t n_params = 0;

  // Throws caviar::Error for an impossible architecture (dims < 1).
  explicit Layout(const Architecture& a);
  std::vector<const Dense*> layers() const;
  int latent() const { return arch.latent; }
  // Entries of the strictly lower-triangular L' (0 for a diagonal posterior).
  int lower() const {
    return arch.posterior == Posterior::kFull ? arch.latent * (arch.latent - 1) / 2 : 0;
  }
  int input_dim() const { return arch.input_dim; }
};

// Xavier/Glorot uniform weights, U(-a, a) with a = sqrt(6 / (in + out)), zero biases. Draws are
// keyed by (seed, parameter index), so every rank builds the same initial buffer.
ParamVec xavier_init(const Layout& layout, std::uint64_t seed);

// The optimiser (engine/optimizer.hpp: Adam, Kingma & Ba 2015) and the exact sum of the blocks'
// gradients (core/gradient_sum.hpp) are the gradient driver's; the names stay visible here.
using engine::Adam;
using engine::AdamConfig;

// eps for rows `rows` (global indices), S samples each: column c * S + s holds the Z normals
// keyed by (seed, row, step) (Stream::kVaeNoise), so a row's noise does not depend on who
// computes it.
void fill_noise(Mat<float>& eps, const std::int64_t* rows, std::int64_t n, int s, int z,
                std::uint64_t seed, std::uint32_t step);

// Samples [first, first + count) of the `total` samples of one row, keyed as fill_noise keys
// sample k of that row with S = total: a row's k draws are the same whatever piece size they are
// computed in.
void fill_noise_samples(Mat<float>& eps, std::int64_t row, std::int64_t first, int count,
                        std::int64_t total, int z, std::uint64_t seed, std::uint32_t step);

// The standard normal quantile Phi^{-1}(p), 0 < p < 1 (for the manifold grid, Bruno 2022,
// Figure 4.6).
double normal_quantile(double p);

// Forward and backward passes over a block of rows, with workspaces reused between calls. One
// instance per thread.
template <class T>
class Network {
 public:
  explicit Network(const Layout& layout) : layout_(&layout) {}

  // x: D x n (one row per column); eps: Z x (n S), column i S + s is row i's sample s. Returns
  // sum_i ELBO_i (Kingma & Welling 2014, eq. 10), writes per-row ELBOs to elbo_rows if given, and
  // if grad is given writes the gradient of -sum_i ELBO_i into it (every entry, same layout as
  // params).
  double run(const T* params, const Mat<T>& x, const Mat<T>& eps, int s, T* grad,
             Eigen::VectorXd* elbo_rows = nullptr);

  // The importance weights of S samples z_s ~ q(z | x) per row (Burda, Grosse & Salakhutdinov
  // 2016, eq. 8): logw(s, i) = log p(x_i | z) + log N(z; 0, I) - log q(z | x_i) at
  // z = mu_i + sigma_i eps(:, i S + s), with log q = -1/2 sum_j (log 2 pi + lv_j + eps_j^2).
  void log_weights(const T* params, const Mat<T>& x, const Mat<T>& eps, int s,
                   Eigen::MatrixXd& logw);

  // Encoder only: mu and log sigma^2, Z x n each.
  void encode(const T* params, const Mat<T>& x, Mat<T>& mu, Mat<T>& logvar);
  // Decoder only: the mean of p(x | z) for each column of z (sigmoid of the logits, or the
  // Gaussian mean).
  void decode_mean(const T* params, const Mat<T>& z, Mat<T>& mean);

 private:
  const Mat<T>& encoder_forward(const T* params, const Mat<T>& x);
  // The encoder, the S samples z = mu + L eps of each row and the decoder on them (out_); returns
  // x with each column repeated S times (x itself when S = 1), the likelihood's target.
  const Mat<T>& sample_forward(const T* params, const Mat<T>& x, const Mat<T>& eps, int s);
  const Mat<T>& decoder_forward(const T* params, const Mat<T>& z);

  const Layout* layout_;
  std::vector<Mat<T>> enc_a_, dec_a_;
  // z += L' eps for a full posterior (the strictly lower triangle, row by row: entry (i, j), j < i,
  // at row i (i - 1) / 2 + j of lower), and its backward pass into dL/dL'.
  void add_lower(const T* lower, const Mat<T>& eps, int s);
  void add_lower_backward(const Mat<T>& eps, const Mat<T>& dz, int s, Mat<T>& dlower) const;

  Mat<T> head_, z_, out_, x_rep_, d_, d2_, dhead_, dmu_, dlv_, dlow_;
  Eigen::VectorXd ll_, kl_;
};

// ---- implementation ----

template <class T>
const Mat<T>& Network<T>::encoder_forward(const T* p, const Mat<T>& x) {
  const auto& enc = layout_->encoder;
  enc_a_.resize(enc.size() - 1);
  const Mat<T>* in = &x;
  for (std::size_t l = 0; l + 1 < enc.size(); ++l) {
    dense_forward(p + enc[l].w, p + enc[l].b, enc[l].out, enc[l].in, *in, enc_a_[l]);
    relu_forward(enc_a_[l]);
    in = &enc_a_[l];
  }
  const Dense& h = enc.back();
  dense_forward(p + h.w, p + h.b, h.out, h.in, *in, head_);
  return head_;
}

template <class T>
const Mat<T>& Network<T>::decoder_forward(const T* p, const Mat<T>& z) {
  const auto& dec = layout_->decoder;
  dec_a_.resize(dec.size() - 1);
  const Mat<T>* in = &z;
  for (std::size_t l = 0; l + 1 < dec.size(); ++l) {
    dense_forward(p + dec[l].w, p + dec[l].b, dec[l].out, dec[l].in, *in, dec_a_[l]);
    relu_forward(dec_a_[l]);
    in = &dec_a_[l];
  }
  const Dense& o = dec.back();
  dense_forward(p + o.w, p + o.b, o.out, o.in, *in, out_);
  return out_;
}

template <class T>
const Mat<T>& Network<T>::sample_forward(const T* p, const Mat<T>& x, const Mat<T>& eps, int s) {
  const int zdim = layout_->latent();
  encoder_forward(p, x);
  reparameterise<T>(head_.topRows(zdim), head_.middleRows(zdim, zdim), eps, s, z_);
  if (layout_->lower()) add_lower(head_.data() + 2 * zdim, eps, s);
  decoder_forward(p, z_);
  if (s == 1) return x;
  x_rep_.resize(x.rows(), x.cols() * s);
  for (Eigen::Index i = 0; i < x.cols(); ++i)
    for (int k = 0; k < s; ++k) x_rep_.col(i * s + k) = x.col(i);
  return x_rep_;
}

template <class T>
double Network<T>::run(const T* p, const Mat<T>& x, const Mat<T>& eps, int s, T* grad,
                       Eigen::VectorXd* elbo_rows) {
  const int zdim = layout_->latent(), nl = layout_->lower();
  const Eigen::Index n = x.cols();
  const Mat<T>* xr = &sample_forward(p, x, eps, s);
  const auto mu = head_.topRows(zdim);
  const auto lv = head_.middleRows(zdim, zdim);
  // The likelihood term is averaged over the S samples (Kingma & Welling 2014, eq. 10), hence the
  // 1/S scale.
  const T inv_s = T(1) / T(s);
  Mat<T>* dout = grad ? &d_ : nullptr;
  if (layout_->arch.likelihood == Likelihood::kBernoulli)
    bernoulli_loglik<T>(out_, *xr, ll_, inv_s, dout);
  else
    gaussian_loglik<T>(out_, *xr, ll_, inv_s, dout);
  kl_standard_normal<T>(mu, lv, kl_, T(1), grad ? &dmu_ : nullptr, grad ? &dlv_ : nullptr);
  if (nl) {
    // KL(N(mu, L L^T) || N(0, I)) = 1/2 (tr(L L^T) + mu^T mu - Z - log det(L L^T)), and
    // tr(L L^T) = sum sigma^2 + sum L'^2, det L = prod sigma: the diagonal KL plus 1/2 sum L'^2,
    // whose gradient is L'.
    const auto low = head_.bottomRows(nl);
    kl_ += (T(0.5) * low.array().square())
               .colwise()
               .sum()
               .transpose()
               .template cast<double>()
               .matrix();
    if (grad) dlow_ = low;
  }

  // Per-row ELBO in double: -KL + (1/S) sum_s log p(x | z_s).
  double total = 0;
  if (elbo_rows) elbo_rows->resize(n);
  for (Eigen::Index i = 0; i < n; ++i) {
    double lik = 0;
    for (int k = 0; k < s; ++k) lik += ll_(i * s + k);
    const double e = lik / s - kl_(i);
    if (elbo_rows) (*elbo_rows)(i) = e;
    total += e;
  }
  if (!grad) return total;

  // Backward through the decoder: d_ holds dL/d(output layer) for L = -sum_i ELBO_i.
  const auto& dec = layout_->decoder;
  for (std::size_t l = dec.size(); l-- > 0;) {
    const Mat<T>& in = l == 0 ? z_ : dec_a_[l - 1];
    dense_backward(p + dec[l].w, dec[l].out, dec[l].in, in, d_, grad + dec[l].w, grad + dec[l].b,
                   &d2_);
    d_.swap(d2_);
    if (l > 0) relu_backward(dec_a_[l - 1], d_);
  }
  // d_ = dL/dz. Through the reparameterisation into dL/dmu, dL/dlv (KL gradients already there).
  reparameterise_backward<T>(lv, eps, d_, s, dmu_, dlv_);
  if (nl) add_lower_backward(eps, d_, s, dlow_);
  dhead_.resize(2 * zdim + nl, n);
  dhead_.topRows(zdim) = dmu_;
  dhead_.middleRows(zdim, zdim) = dlv_;
  if (nl) dhead_.bottomRows(nl) = dlow_;
  d_.swap(dhead_);
  const auto& enc = layout_->encoder;
  for (std::size_t l = enc.size(); l-- > 0;) {
    const Mat<T>& in = l == 0 ? x : enc_a_[l - 1];
    dense_backward(p + enc[l].w, enc[l].out, enc[l].in, in, d_, grad + enc[l].w, grad + enc[l].b,
                   l == 0 ? nullptr : &d2_);
    if (l > 0) {
      d_.swap(d2_);
      relu_backward(enc_a_[l - 1], d_);
    }
  }
  return total;
}

template <class T>
void Network<T>::log_weights(const T* p, const Mat<T>& x, const Mat<T>& eps, int s,
                             Eigen::MatrixXd& logw) {
  const int zdim = layout_->latent();
  const Eigen::Index n = x.cols();
  const Mat<T>* xr = &sample_forward(p, x, eps, s);
  const auto lv = head_.middleRows(zdim, zdim);
  // log q(z | x) below is the same for a full posterior: det L = prod sigma.
  if (layout_->arch.likelihood == Likelihood::kBernoulli)
    bernoulli_loglik<T>(out_, *xr, ll_, T(1), nullptr);
  else
    gaussian_loglik<T>(out_, *xr, ll_, T(1), nullptr);
  logw.resize(s, n);
  for (Eigen::Index i = 0; i < n; ++i) {
    const double sum_lv = lv.col(i).template cast<double>().sum();
    for (int k = 0; k < s; ++k) {
      const Eigen::Index c = i * s + k;
      // log N(z; 0, I) - log q(z | x): the log 2 pi terms cancel.
      const double log_prior = -0.5 * z_.col(c).template cast<double>().squaredNorm();
      const double log_q = -0.5 * (sum_lv + eps.col(c).template cast<double>().squaredNorm());
      logw(k, i) = ll_(c) + log_prior - log_q;
    }
  }
}

template <class T>
void Network<T>::add_lower(const T* lower, const Mat<T>& eps, int s) {
  const int zdim = layout_->latent();
  const Eigen::Index n = head_.cols();
  for (Eigen::Index i = 0; i < n; ++i) {
    const T* l = lower + i * head_.rows();  // column i of head_, rows [2Z, 2Z + nl)
    for (int k = 0; k < s; ++k) {
      const Eigen::Index c = i * s + k;
      for (int a = 1, e = 0; a < zdim; ++a)
        for (int b = 0; b < a; ++b, ++e) z_(a, c) += l[e] * eps(b, c);
    }
  }
}

template <class T>
void Network<T>::add_lower_backward(const Mat<T>& eps, const Mat<T>& dz, int s,
                                    Mat<T>& dlower) const {
  const int zdim = layout_->latent();
  for (Eigen::Index i = 0; i < dlower.cols(); ++i)
    for (int k = 0; k < s; ++k) {
      const Eigen::Index c = i * s + k;
      for (int a = 1, e = 0; a < zdim; ++a)
        for (int b = 0; b < a; ++b, ++e) dlower(e, i) += dz(a, c) * eps(b, c);
    }
}

template <class T>
void Network<T>::encode(const T* p, const Mat<T>& x, Mat<T>& mu, Mat<T>& logvar) {
  const int zdim = layout_->latent();
  encoder_forward(p, x);
  mu = head_.topRows(zdim);
  logvar = head_.middleRows(zdim, zdim);
}

template <class T>
void Network<T>::decode_mean(const T* p, const Mat<T>& z, Mat<T>& mean) {
  decoder_forward(p, z);
  const Eigen::Index d = layout_->input_dim();
  if (layout_->arch.likelihood == Likelihood::kBernoulli)
    mean = (T(1) + (-out_.array()).exp()).inverse().matrix();
  else
    mean = out_.topRows(d);
}

}  // namespace caviar::vae
