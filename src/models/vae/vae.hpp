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
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/error.hpp"
#include "core/gradient_sum.hpp"
#include "core/rng.hpp"
#include "engine/optimizer.hpp"
#include "models/vae/conv.hpp"
#include "models/vae/layers.hpp"

namespace caviar::vae {

enum class Likelihood { kBernoulli, kGaussian };
Likelihood parse_likelihood(const std::string& s);
std::string to_string(Likelihood l);

// The encoder's Gaussian q(z | x): diagonal covariance (Kingma & Welling 2014, appendix C.2), or
// full, with a lower-triangular Cholesky factor L of diagonal sigma (Kingma & Welling 2019,
// section 2.5.2; Bruno 2022, eqs. 4.22-4.26): the encoder also outputs the Z (Z - 1) / 2 entries
// of a strictly lower-triangular L'. They are taken relative to sigma, L = diag(sigma) (I + M (.)
// L'), the same family as M (.) L' + diag(sigma) (row a of the triangle scaled by sigma_a): a step
// in L' then moves z in units of the posterior's own scale, as a step in log sigma does, rather
// than in absolute units. Measured on Fashion-MNIST, this closed most of the test-ELBO gap that the
// absolute triangle left against the diagonal encoder (docs/experiments/vae.md).
enum class Posterior { kDiagonal, kFull };
Posterior parse_posterior(const std::string& s);
std::string to_string(Posterior p);

struct Architecture {
  int input_dim = 0;
  std::vector<int> hidden;  // encoder hidden widths; the decoder uses them in reverse order
  int latent = 0;
  Likelihood likelihood = Likelihood::kBernoulli;
  Posterior posterior = Posterior::kDiagonal;
  // The convolutional VAE (Radford, Metz & Chintala 2016's pattern, as in Bruno 2022, section
  // 4.4): stride-2 4 x 4 convolutions (padding 1) with these output channels, each followed by a
  // ReLU and batch normalisation, then a dense layer to the posterior's parameters; the decoder
  // mirrors it (a dense layer back to the last feature map, ReLU and batch norm, then transposed
  // convolutions). Empty: the MLP. `hidden` is unused by a convolutional architecture.
  // The fully Bayesian decoder (Kingma & Welling 2014, appendix F): a mean-field Gaussian
  // q(w) = N(mu, sigma^2) over every decoder weight and bias, with the prior N(0, prior_scale^2);
  // MLP only.
  bool bayesian_decoder = false;
  double prior_scale = 1.0;
  // How training estimates the gradient of the encoder's KL term. false: in closed form (Kingma &
  // Welling 2014, eq. 10). true: the path derivative of log p(z) - log q(z | x) at the drawn z,
  // without the score term -d log q / d phi at fixed z, whose expectation is zero ("sticking the
  // landing", Roeder, Wu & Duvenaud 2017). Both are unbiased; the second vanishes, draw by draw,
  // where q equals the posterior, so its noise is lowest near the optimum. The value of the ELBO
  // is the same either way.
  bool stl = false;
  std::vector<int> channels{};
  int image_channels = 1, height = 0, width = 0;  // input_dim = image_channels height width
  bool conv() const { return !channels.empty(); }
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
  // A Bayesian decoder's layers: log sigma of W and of b, in W's and b's layouts (-1: none). The
  // means are at w and b.
  std::int64_t log_sigma_w = -1, log_sigma_b = -1;
};

// Parameter and gradient buffers: aligned to Eigen's largest packet (64 bytes with AVX-512).
using ParamVec = engine::Params;

// Every W and b starts at a multiple of kParamAlign entries, so with an aligned buffer every
// layer's Map is aligned too. Eigen picks vectorised or scalar code paths (whose rounding differs)
// from the destination's alignment: equal alignment in every buffer on every rank is part of
// what makes the results bitwise reproducible. The padding entries stay zero.
inline constexpr std::int64_t kParamAlign = 16;

// A convolution (or, if transposed, the adjoint of `shape`, conv.hpp), saved as name/W (in
// PyTorch's Conv2d or ConvTranspose2d weight shape) and name/b; followed by a ReLU if relu, and by
// batch norm `bn` if bn >= 0.
struct ConvLayer {
  std::string name;
  ConvShape shape;
  bool transposed = false, relu = true;
  int bn = -1;
  std::int64_t w = 0, b = 0;
  // Channels and positions of its output.
  int out_channels() const { return transposed ? shape.in_channels : shape.out_channels; }
  int out_positions() const {
    return transposed ? shape.height * shape.width : shape.out_positions();
  }
};

// Batch normalisation of `channels` channels of `positions` values each (Ioffe & Szegedy 2015),
// saved as name/gamma, name/beta, name/running_mean and name/running_var. Its running averages
// are not trained by the optimiser, so they live outside the parameter buffer: entries
// [running, running + channels) of the running-statistics vector hold the means, the next
// `channels` the variances.
struct BatchNormLayer {
  std::string name;
  int channels = 0, positions = 0;
  std::int64_t gamma = 0, beta = 0;
  int running = 0;
};

// Batch normalisation's constants, PyTorch's defaults: var + eps under the square root, and
// running = (1 - momentum) running + momentum batch (the unbiased variance for the running one).
inline constexpr double kBatchNormEps = 1e-5, kBatchNormMomentum = 0.1;

struct Layout {
  Architecture arch;
  std::vector<Dense> encoder;  // hidden layers, then the (mu, logvar) head
  std::vector<Dense> decoder;  // hidden layers, then the output layer (conv: the projection only)
  std::vector<ConvLayer> conv_encoder;     // conv: before the head
  std::vector<ConvLayer> conv_decoder;     // conv: after the projection, the last giving the output
  std::vector<BatchNormLayer> batch_norm;  // encoder's, then the projection's, then the decoder's
  std::int64_t n_params = 0;
  int n_running = 0;  // entries of the running statistics (2 per batch-norm channel)

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

// Xavier/Glorot uniform weights, U(-a, a) with a = sqrt(6 / (in + out)) (fan_in and fan_out
// times k^2 for a convolution), zero biases, batch norm's gamma 1 and beta 0. Draws are keyed by
// (seed, parameter index), so every rank builds the same initial buffer.
ParamVec xavier_init(const Layout& layout, std::uint64_t seed);
// The running statistics before training: means 0, variances 1.
std::vector<double> initial_running(const Layout& layout);

// A Bayesian decoder's log sigma at the start: the fit starts near the deterministic network.
inline constexpr float kInitialLogSigma = -6.0f;

// The Bayesian decoder's weights for one step (Blundell et al. 2015, section 3.2's
// reparameterisation, one draw per minibatch): sampled = params, except w = mu + exp(log sigma) eps
// for every decoder weight and bias, with eps keyed by (seed, parameter index, step)
// (Stream::kVaeWeights), so every rank and thread draws the same weights. eps is written at the
// means' indices (n_params entries).
template <class T>
void sample_decoder(const Layout& layout, const T* params, std::uint64_t seed, std::uint32_t step,
                    std::vector<T>& sampled, std::vector<T>& eps);

// Given grad = dL/d(sampled parameters) of L = -sum_b ELBO over a block, turns the decoder's
// entries into dL/dmu (unchanged) and dL/dlog sigma = dL/dw eps sigma, and adds the block's share
// `frac` = |block| / N of the weights' KL(q(w) || N(0, s^2)):
//   KL = sum_j log(s / sigma_j) + (sigma_j^2 + mu_j^2) / (2 s^2) - 1/2,
// with gradients mu_j / s^2 and sigma_j^2 / s^2 - 1. Over an epoch the shares sum to the KL once
// (Blundell et al. 2015, section 3.4's KL re-weighting with pi = |block| / N). Returns the KL;
// with grad = eps = null, only the KL.
template <class T>
double decoder_kl_backward(const Layout& layout, const T* params, const T* eps, double frac,
                           T* grad);

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
  // running: the batch-norm running statistics (Layout::n_running entries) that a convolutional
  // network uses outside training (evaluation, encoding, decoding); unused by the MLP.
  explicit Network(const Layout& layout, const double* running = nullptr)
      : layout_(&layout), running_(running) {}

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

  // ---- Training a convolutional network: batch norm over the whole global minibatch ----
  // A training pass over one block of rows runs in stages k = 0 .. reductions(), split at each
  // batch-norm layer, forward and backward. Stage k < reductions() ends where a layer needs the
  // statistics of the whole minibatch: it writes its block's partial sums to `local`
  // (reduction_size(k) entries), which the caller gathers from every block of the minibatch and
  // combines in block order (combine()); stage k + 1 starts from the combined values. The last
  // stage returns the block's sum of ELBOs and has written the gradient of minus it into grad
  // (every stage may write to grad). x and eps must stay unchanged through the stages.
  static int reductions(const Layout& layout) {
    return 2 * static_cast<int>(layout.batch_norm.size());
  }
  static std::size_t reduction_size(const Layout& layout, int k);
  // The blocks' partial sums of reduction k (n_blocks x reduction_size(k), block-major) into
  // `out`: for a forward reduction the count, the per-channel means and the biased variances
  // (Chan, Golub & LeVeque 1983's pairwise update, in block order), also folded into `running`
  // if given; for a backward one the count and the summed partial sums.
  static void combine(const Layout& layout, int k, std::span<const double> blocks,
                      std::int64_t n_blocks, std::vector<double>& out, double* running);
  double stage(const T* params, int k, const Mat<T>& x, const Mat<T>& eps, int s,
               std::span<const double> combined, std::span<double> local, T* grad);

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
  const double* running_ = nullptr;
  std::vector<Mat<T>> enc_a_, dec_a_;
  // The likelihood, the KL and the per-row ELBOs of the current forward pass (out_, head_, z_),
  // and, with grad, dL/d(out) into d_ and the KL's gradients into dmu_, dlv_, dlow_.
  double loss(const Mat<T>& xr, int s, bool grad, Eigen::VectorXd* elbo_rows);
  const Mat<T>& repeat_columns(const Mat<T>& x, int s);

  // The convolutional network as a program of operations, run forward and, in training,
  // backward; output(i) is operation i's result, the input of operation i + 1.
  enum class OpKind { kConv, kBatchNorm, kHead, kSample, kProject, kDeconv, kLoss };
  struct Op {
    OpKind kind;
    int index;  // into conv_encoder, batch_norm or conv_decoder
  };
  void build_program();
  std::ptrdiff_t find_op(OpKind kind) const;
  Mat<T>& output(std::ptrdiff_t i);
  const Mat<T>& input(std::ptrdiff_t i, const Mat<T>& x) { return i == 0 ? x : output(i - 1); }
  // Operations [from, to) forward; a batch norm with the running statistics.
  void forward_ops(const T* p, std::ptrdiff_t from, std::ptrdiff_t to, const Mat<T>& x,
                   const Mat<T>& eps, int s);
  void forward_op(const T* p, std::ptrdiff_t i, const Mat<T>& x, const Mat<T>& eps, int s);
  void batch_norm_forward(const T* p, std::ptrdiff_t i, const Mat<T>& x, const double* mean,
                          const double* var);
  void backward_op(const T* p, std::ptrdiff_t i, const Mat<T>& x, const Mat<T>& eps, int s,
                   T* grad);
  std::vector<Op> ops_;
  std::vector<Mat<T>> act_, cols_, xhat_;
  std::vector<Eigen::VectorXd> inv_std_;
  std::ptrdiff_t pc_ = 0;  // the next operation of a staged pass
  bool backward_ = false;
  double objective_ = 0;

  // z += diag(sigma) (M (.) L') eps for a full posterior (the strictly lower triangle, row by row:
  // entry (a, b), b < a, at row a (a - 1) / 2 + b of the head's L' part), and its backward pass,
  // which adds dL/dL' into dlower and the term's share of dL/d log sigma^2 into dlv.
  void add_lower(const Mat<T>& eps, int s);
  // dL/dz += (z - L^-T eps) / S for the path derivative (Architecture::stl): the gradient of
  // -(log N(z; 0, I) - log q(z | x)) in z at fixed q, since z - mu = L eps gives
  // d log q / dz = -(L L^T)^-1 (z - mu) = -L^-T eps.
  void add_stl(const Mat<T>& eps, int s);
  void add_lower_backward(const Mat<T>& eps, const Mat<T>& dz, int s, Mat<T>& dlower,
                          Mat<T>& dlv) const;

  Mat<T> head_, z_, out_, x_rep_, d_, d2_, dhead_, dmu_, dlv_, dlow_;
  Eigen::VectorXd ll_, kl_;
};

// ---- implementation ----

template <class T>
const Mat<T>& Network<T>::encoder_forward(const T* p, const Mat<T>& x) {
  if (layout_->arch.conv()) {
    build_program();
    forward_ops(p, 0, find_op(OpKind::kHead) + 1, x, x, 1);
    return head_;
  }
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
  if (layout_->arch.conv()) {
    build_program();
    if (&z != &z_) z_ = z;
    const std::ptrdiff_t from = find_op(OpKind::kProject);
    forward_ops(p, from, static_cast<std::ptrdiff_t>(ops_.size()) - 1, z_, z_, 1);
    return out_;
  }
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
  if (layout_->lower()) add_lower(eps, s);
  decoder_forward(p, z_);
  return repeat_columns(x, s);
}

template <class T>
const Mat<T>& Network<T>::repeat_columns(const Mat<T>& x, int s) {
  if (s == 1) return x;
  x_rep_.resize(x.rows(), x.cols() * s);
  for (Eigen::Index i = 0; i < x.cols(); ++i)
    for (int k = 0; k < s; ++k) x_rep_.col(i * s + k) = x.col(i);
  return x_rep_;
}

template <class T>
double Network<T>::loss(const Mat<T>& xr, int s, bool grad, Eigen::VectorXd* elbo_rows) {
  const int zdim = layout_->latent(), nl = layout_->lower();
  const Eigen::Index n = head_.cols();
  const auto mu = head_.topRows(zdim);
  const auto lv = head_.middleRows(zdim, zdim);
  // The likelihood term is averaged over the S samples (Kingma & Welling 2014, eq. 10), hence the
  // 1/S scale.
  const T inv_s = T(1) / T(s);
  Mat<T>* dout = grad ? &d_ : nullptr;
  if (layout_->arch.likelihood == Likelihood::kBernoulli)
    bernoulli_loglik<T>(out_, xr, ll_, inv_s, dout);
  else
    gaussian_loglik<T>(out_, xr, ll_, inv_s, dout);
  // With the path derivative (Architecture::stl) the KL's gradients come from add_stl in the
  // backward pass, not from its closed form: only the KL's value is needed here, and the
  // buffers that the backward pass accumulates into start at zero.
  const bool kl_grad = grad && !layout_->arch.stl;
  kl_standard_normal<T>(mu, lv, kl_, T(1), kl_grad ? &dmu_ : nullptr, kl_grad ? &dlv_ : nullptr);
  if (grad && !kl_grad) {
    dmu_.setZero(zdim, n);
    dlv_.setZero(zdim, n);
    if (nl) dlow_.setZero(nl, n);
  }
  if (nl) {
    // KL(N(mu, L L^T) || N(0, I)) = 1/2 (tr(L L^T) + mu^T mu - Z - log det(L L^T)). With
    // L = diag(sigma) (I + M (.) L'), tr(L L^T) = sum_a sigma_a^2 (1 + r_a), r_a = sum_b L'_ab^2,
    // and det L = prod sigma: the diagonal KL plus 1/2 sum_a sigma_a^2 r_a, whose gradients are
    // sigma_a^2 L'_ab in L'_ab and sigma_a^2 r_a / 2 in log sigma_a^2.
    const auto low = head_.bottomRows(nl);
    if (kl_grad) dlow_.resize(nl, n);
    for (Eigen::Index i = 0; i < n; ++i) {
      double extra = 0;
      for (int a = 1, e = 0; a < zdim; ++a) {
        const T s2 = std::exp(lv(a, i));
        T r = 0;
        for (int b = 0; b < a; ++b, ++e) {
          r += low(e, i) * low(e, i);
          if (kl_grad) dlow_(e, i) = s2 * low(e, i);
        }
        extra += 0.5 * static_cast<double>(s2) * static_cast<double>(r);
        if (kl_grad) dlv_(a, i) += T(0.5) * s2 * r;
      }
      kl_(i) += extra;
    }
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
  return total;
}

template <class T>
double Network<T>::run(const T* p, const Mat<T>& x, const Mat<T>& eps, int s, T* grad,
                       Eigen::VectorXd* elbo_rows) {
  if (grad && layout_->arch.conv())
    throw Error("internal: a convolutional VAE trains through Network::stage");
  const int zdim = layout_->latent(), nl = layout_->lower();
  const Eigen::Index n = x.cols();
  const double total = loss(sample_forward(p, x, eps, s), s, grad != nullptr, elbo_rows);
  if (!grad) return total;
  const auto lv = head_.middleRows(zdim, zdim);

  // Backward through the decoder: d_ holds dL/d(output layer) for L = -sum_i ELBO_i.
  const auto& dec = layout_->decoder;
  for (std::size_t l = dec.size(); l-- > 0;) {
    const Mat<T>& in = l == 0 ? z_ : dec_a_[l - 1];
    dense_backward(p + dec[l].w, dec[l].out, dec[l].in, in, d_, grad + dec[l].w, grad + dec[l].b,
                   &d2_);
    d_.swap(d2_);
    if (l > 0) relu_backward(dec_a_[l - 1], d_);
  }
  // d_ = dL/dz. Through the reparameterisation into dL/dmu, dL/dlv (KL gradients already there,
  // or the path derivative's added to dL/dz).
  if (layout_->arch.stl) add_stl(eps, s);
  reparameterise_backward<T>(lv, eps, d_, s, dmu_, dlv_);
  if (nl) add_lower_backward(eps, d_, s, dlow_, dlv_);
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
void Network<T>::add_lower(const Mat<T>& eps, int s) {
  const int zdim = layout_->latent();
  for (Eigen::Index i = 0; i < head_.cols(); ++i) {
    const T* lv = head_.data() + i * head_.rows() + zdim;
    const T* low = lv + zdim;
    for (int k = 0; k < s; ++k) {
      const Eigen::Index c = i * s + k;
      for (int a = 1, e = 0; a < zdim; ++a) {
        T v = 0;
        for (int b = 0; b < a; ++b, ++e) v += low[e] * eps(b, c);
        z_(a, c) += std::exp(T(0.5) * lv[a]) * v;
      }
    }
  }
}

// With z_a = mu_a + sigma_a (eps_a + v_a), v_a = sum_b L'_ab eps_b: dz_a/dL'_ab = sigma_a eps_b,
// and the triangle's share of dz_a/d log sigma_a^2 is sigma_a v_a / 2 (reparameterise_backward has
// the sigma_a eps_a / 2).
template <class T>
void Network<T>::add_lower_backward(const Mat<T>& eps, const Mat<T>& dz, int s, Mat<T>& dlower,
                                    Mat<T>& dlv) const {
  const int zdim = layout_->latent();
  for (Eigen::Index i = 0; i < dlower.cols(); ++i) {
    const T* lv = head_.data() + i * head_.rows() + zdim;
    const T* low = lv + zdim;
    for (int k = 0; k < s; ++k) {
      const Eigen::Index c = i * s + k;
      for (int a = 1, e = 0; a < zdim; ++a) {
        const T g = dz(a, c) * std::exp(T(0.5) * lv[a]);
        T v = 0;
        for (int b = 0; b < a; ++b, ++e) {
          dlower(e, i) += g * eps(b, c);
          v += low[e] * eps(b, c);
        }
        dlv(a, i) += T(0.5) * g * v;
      }
    }
  }
}

template <class T>
void Network<T>::add_stl(const Mat<T>& eps, int s) {
  const int zdim = layout_->latent(), nl = layout_->lower();
  const T inv_s = T(1) / T(s);
  std::vector<T> u(zdim);
  for (Eigen::Index i = 0; i < head_.cols(); ++i) {
    const T* lv = head_.data() + i * head_.rows() + zdim;
    const T* low = lv + zdim;
    for (int k = 0; k < s; ++k) {
      const Eigen::Index c = i * s + k;
      // L^T = (I + M (.) L')^T diag(sigma): u = (I + M (.) L')^-T eps by back substitution, then
      // L^-T eps = u / sigma.
      for (int b = zdim - 1; b >= 0; --b) {
        T v = eps(b, c);
        if (nl)
          for (int a = b + 1; a < zdim; ++a) v -= low[a * (a - 1) / 2 + b] * u[a];
        u[b] = v;
      }
      for (int a = 0; a < zdim; ++a)
        d_(a, c) += inv_s * (z_(a, c) - u[a] * std::exp(T(-0.5) * lv[a]));
    }
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

// ---- the convolutional network ----

template <class T>
void Network<T>::build_program() {
  if (!ops_.empty()) return;
  const Layout& L = *layout_;
  for (std::size_t l = 0; l < L.conv_encoder.size(); ++l) {
    ops_.push_back({OpKind::kConv, static_cast<int>(l)});
    ops_.push_back({OpKind::kBatchNorm, L.conv_encoder[l].bn});
  }
  ops_.push_back({OpKind::kHead, 0});
  ops_.push_back({OpKind::kSample, 0});
  ops_.push_back({OpKind::kProject, 0});
  ops_.push_back({OpKind::kBatchNorm, static_cast<int>(L.conv_encoder.size())});
  for (std::size_t j = 0; j < L.conv_decoder.size(); ++j) {
    ops_.push_back({OpKind::kDeconv, static_cast<int>(j)});
    if (L.conv_decoder[j].bn >= 0) ops_.push_back({OpKind::kBatchNorm, L.conv_decoder[j].bn});
  }
  ops_.push_back({OpKind::kLoss, 0});
  act_.resize(ops_.size());
  cols_.resize(L.conv_encoder.size());
  xhat_.resize(L.batch_norm.size());
  inv_std_.resize(L.batch_norm.size());
}

template <class T>
std::ptrdiff_t Network<T>::find_op(OpKind kind) const {
  for (std::size_t i = 0; i < ops_.size(); ++i)
    if (ops_[i].kind == kind) return static_cast<std::ptrdiff_t>(i);
  return -1;
}

template <class T>
Mat<T>& Network<T>::output(std::ptrdiff_t i) {
  switch (ops_[i].kind) {
    case OpKind::kHead:
      return head_;
    case OpKind::kSample:
      return z_;
    default:
      // The last convolution's output is the likelihood's parameters.
      return i + 2 == static_cast<std::ptrdiff_t>(ops_.size()) ? out_ : act_[i];
  }
}

template <class T>
void Network<T>::forward_ops(const T* p, std::ptrdiff_t from, std::ptrdiff_t to, const Mat<T>& x,
                             const Mat<T>& eps, int s) {
  for (std::ptrdiff_t i = from; i < to; ++i) {
    if (ops_[i].kind == OpKind::kBatchNorm) {
      if (!running_)
        throw Error("internal: a convolutional VAE outside training needs the running statistics");
      const BatchNormLayer& b = layout_->batch_norm[ops_[i].index];
      batch_norm_forward(p, i, x, running_ + b.running, running_ + b.running + b.channels);
    } else {
      forward_op(p, i, x, eps, s);
    }
  }
}

template <class T>
void Network<T>::forward_op(const T* p, std::ptrdiff_t i, const Mat<T>& x, const Mat<T>& eps,
                            int s) {
  const Layout& L = *layout_;
  const int idx = ops_[i].index, zdim = L.latent();
  switch (ops_[i].kind) {
    case OpKind::kConv: {
      const ConvLayer& c = L.conv_encoder[idx];
      conv_forward(c.shape, p + c.w, p + c.b, input(i, x), cols_[idx], output(i));
      relu_forward(output(i));
      break;
    }
    case OpKind::kDeconv: {
      const ConvLayer& c = L.conv_decoder[idx];
      conv_transpose_forward(c.shape, p + c.w, p + c.b, input(i, x), output(i));
      if (c.relu) relu_forward(output(i));
      break;
    }
    case OpKind::kHead: {
      const Dense& h = L.encoder.back();
      dense_forward(p + h.w, p + h.b, h.out, h.in, input(i, x), head_);
      break;
    }
    case OpKind::kSample:
      reparameterise<T>(head_.topRows(zdim), head_.middleRows(zdim, zdim), eps, s, z_);
      if (L.lower()) add_lower(eps, s);
      break;
    case OpKind::kProject: {
      const Dense& d = L.decoder.front();
      dense_forward(p + d.w, p + d.b, d.out, d.in, input(i, x), output(i));
      relu_forward(output(i));
      break;
    }
    case OpKind::kBatchNorm:
    case OpKind::kLoss:
      throw Error("internal: not a plain forward operation");
  }
}

template <class T>
void Network<T>::batch_norm_forward(const T* p, std::ptrdiff_t i, const Mat<T>& x,
                                    const double* mean, const double* var) {
  const BatchNormLayer& b = layout_->batch_norm[ops_[i].index];
  const Eigen::Map<const Eigen::VectorXd> m(mean, b.channels), v(var, b.channels);
  bn_forward(input(i, x), b.channels, b.positions, Eigen::VectorXd(m), Eigen::VectorXd(v),
             kBatchNormEps, p + b.gamma, p + b.beta, xhat_[ops_[i].index], inv_std_[ops_[i].index],
             output(i));
}

template <class T>
void Network<T>::backward_op(const T* p, std::ptrdiff_t i, const Mat<T>& x, const Mat<T>& eps,
                             int s, T* grad) {
  const Layout& L = *layout_;
  const int idx = ops_[i].index, zdim = L.latent(), nl = L.lower();
  // d_ holds dL/d(output(i)); leaves dL/d(input(i)) there.
  switch (ops_[i].kind) {
    case OpKind::kDeconv: {
      const ConvLayer& c = L.conv_decoder[idx];
      if (c.relu) relu_backward(output(i), d_);
      conv_transpose_backward(c.shape, p + c.w, input(i, x), d_, grad + c.w, grad + c.b, &d2_);
      d_.swap(d2_);
      break;
    }
    case OpKind::kProject: {
      const Dense& d = L.decoder.front();
      relu_backward(output(i), d_);
      dense_backward(p + d.w, d.out, d.in, input(i, x), d_, grad + d.w, grad + d.b, &d2_);
      d_.swap(d2_);
      break;
    }
    case OpKind::kSample: {
      const auto lv = head_.middleRows(zdim, zdim);
      if (layout_->arch.stl) add_stl(eps, s);
      reparameterise_backward<T>(lv, eps, d_, s, dmu_, dlv_);
      if (nl) add_lower_backward(eps, d_, s, dlow_, dlv_);
      dhead_.resize(2 * zdim + nl, head_.cols());
      dhead_.topRows(zdim) = dmu_;
      dhead_.middleRows(zdim, zdim) = dlv_;
      if (nl) dhead_.bottomRows(nl) = dlow_;
      d_.swap(dhead_);
      break;
    }
    case OpKind::kHead: {
      const Dense& h = L.encoder.back();
      dense_backward(p + h.w, h.out, h.in, input(i, x), d_, grad + h.w, grad + h.b, &d2_);
      d_.swap(d2_);
      break;
    }
    case OpKind::kConv: {
      const ConvLayer& c = L.conv_encoder[idx];
      relu_backward(output(i), d_);
      conv_backward(c.shape, p + c.w, cols_[idx], d_, grad + c.w, grad + c.b,
                    idx == 0 ? nullptr : &d2_);
      if (idx > 0) d_.swap(d2_);
      break;
    }
    case OpKind::kBatchNorm:
    case OpKind::kLoss:
      throw Error("internal: not a plain backward operation");
  }
}

template <class T>
std::size_t Network<T>::reduction_size(const Layout& layout, int k) {
  const int nb = static_cast<int>(layout.batch_norm.size());
  const int b = k < nb ? k : 2 * nb - 1 - k;
  return 1 + 2 * static_cast<std::size_t>(layout.batch_norm[b].channels);
}

template <class T>
void Network<T>::combine(const Layout& layout, int k, std::span<const double> blocks,
                         std::int64_t n_blocks, std::vector<double>& out, double* running) {
  const int nb = static_cast<int>(layout.batch_norm.size());
  const std::size_t m = reduction_size(layout, k);
  const int c = static_cast<int>((m - 1) / 2);
  out.assign(m, 0.0);
  if (k >= nb) {  // backward: plain sums, in block order
    for (std::int64_t j = 0; j < n_blocks; ++j)
      for (std::size_t e = 0; e < m; ++e) out[e] += blocks[j * m + e];
    return;
  }
  // Forward: each block sent (count, sum, M2 about its own mean); merged pairwise in block order
  // (Chan, Golub & LeVeque 1983): n = na + nb, delta = mean_b - mean_a,
  // mean = mean_a + delta nb / n, M2 = M2_a + M2_b + delta^2 na nb / n.
  double n = 0;
  std::vector<double> mean(c, 0.0), m2(c, 0.0);
  for (std::int64_t j = 0; j < n_blocks; ++j) {
    const double* v = blocks.data() + j * m;
    const double nj = v[0], n_new = n + nj;
    for (int ch = 0; ch < c; ++ch) {
      const double mj = v[1 + ch] / nj, delta = mj - mean[ch];
      mean[ch] += delta * nj / n_new;
      m2[ch] += v[1 + c + ch] + delta * delta * n * nj / n_new;
    }
    n = n_new;
  }
  out[0] = n;
  for (int ch = 0; ch < c; ++ch) {
    out[1 + ch] = mean[ch];
    out[1 + c + ch] = m2[ch] / n;
  }
  if (running) {
    const BatchNormLayer& b = layout.batch_norm[k];
    const double mo = kBatchNormMomentum, unbiased = n > 1 ? n / (n - 1) : 1.0;
    for (int ch = 0; ch < c; ++ch) {
      double& rm = running[b.running + ch];
      double& rv = running[b.running + c + ch];
      rm = (1 - mo) * rm + mo * out[1 + ch];
      rv = (1 - mo) * rv + mo * out[1 + c + ch] * unbiased;
    }
  }
}

template <class T>
double Network<T>::stage(const T* p, int k, const Mat<T>& x, const Mat<T>& eps, int s,
                         std::span<const double> combined, std::span<double> local, T* grad) {
  build_program();
  const Layout& L = *layout_;
  if (k == 0) {
    pc_ = 0;
    backward_ = false;
  } else {
    // Finish the batch norm that waited for reduction k - 1.
    const BatchNormLayer& b = L.batch_norm[ops_[pc_].index];
    if (!backward_) {
      batch_norm_forward(p, pc_, x, combined.data() + 1, combined.data() + 1 + b.channels);
      ++pc_;
    } else {
      bn_backward(d_, xhat_[ops_[pc_].index], b.channels, b.positions, p + b.gamma,
                  inv_std_[ops_[pc_].index],
                  Eigen::Map<const Eigen::VectorXd>(combined.data() + 1, 2 * b.channels),
                  combined[0], d2_);
      d_.swap(d2_);
      --pc_;
    }
  }
  while (!backward_) {
    if (ops_[pc_].kind == OpKind::kLoss) {
      objective_ = loss(repeat_columns(x, s), s, true, nullptr);
      backward_ = true;
      --pc_;
      break;
    }
    if (ops_[pc_].kind == OpKind::kBatchNorm) {
      // This block's count, per-channel sums and sums of squares about its own mean.
      const BatchNormLayer& b = L.batch_norm[ops_[pc_].index];
      const Mat<T>& in = input(pc_, x);
      const double n = static_cast<double>(in.cols()) * b.positions;
      const Eigen::VectorXd sum = bn_channel_sums(in, b.channels, b.positions);
      const Eigen::VectorXd mean = sum / n;
      const Eigen::VectorXd m2 = bn_channel_sums(in, b.channels, b.positions, &mean);
      local[0] = n;
      for (int c = 0; c < b.channels; ++c) {
        local[1 + c] = sum[c];
        local[1 + b.channels + c] = m2[c];
      }
      return 0;
    }
    forward_op(p, pc_, x, eps, s);
    ++pc_;
  }
  for (; pc_ >= 0; --pc_) {
    if (ops_[pc_].kind == OpKind::kBatchNorm) {
      // dL/dbeta and dL/dgamma of this block's share; their sums over blocks are the gradient.
      const BatchNormLayer& b = L.batch_norm[ops_[pc_].index];
      const Eigen::VectorXd sums =
          bn_backward_sums(d_, xhat_[ops_[pc_].index], b.channels, b.positions);
      local[0] = static_cast<double>(d_.cols()) * b.positions;
      for (int c = 0; c < 2 * b.channels; ++c) local[1 + c] = sums[c];
      for (int c = 0; c < b.channels; ++c) {
        grad[b.beta + c] = static_cast<T>(sums[c]);
        grad[b.gamma + c] = static_cast<T>(sums[b.channels + c]);
      }
      return 0;
    }
    backward_op(p, pc_, x, eps, s, grad);
  }
  return objective_;
}

// ---- the Bayesian decoder ----

template <class T>
void sample_decoder(const Layout& layout, const T* params, std::uint64_t seed, std::uint32_t step,
                    std::vector<T>& sampled, std::vector<T>& eps) {
  sampled.assign(params, params + layout.n_params);
  eps.assign(static_cast<std::size_t>(layout.n_params), T(0));
  const CounterRng rng(seed, Stream::kVaeWeights);
  auto draw = [&](std::int64_t mean, std::int64_t log_sigma, std::int64_t count) {
    for (std::int64_t j = 0; j < count; ++j) {
      const std::int64_t g = mean + j;  // the key: the mean's parameter index
      const T e = static_cast<T>(rng.normal2(static_cast<std::uint64_t>(g / 2), step)[g % 2]);
      eps[g] = e;
      sampled[g] = params[g] + std::exp(params[log_sigma + j]) * e;
    }
  };
  for (const Dense& d : layout.decoder) {
    if (d.log_sigma_w < 0) continue;
    draw(d.w, d.log_sigma_w, static_cast<std::int64_t>(d.in) * d.out);
    draw(d.b, d.log_sigma_b, d.out);
  }
}

template <class T>
double decoder_kl_backward(const Layout& layout, const T* params, const T* eps, double frac,
                           T* grad) {
  const double s2 = layout.arch.prior_scale * layout.arch.prior_scale;
  const double log_s = std::log(layout.arch.prior_scale);
  double kl = 0;
  auto one = [&](std::int64_t mean, std::int64_t log_sigma, std::int64_t count) {
    for (std::int64_t j = 0; j < count; ++j) {
      const double mu = params[mean + j], ls = params[log_sigma + j], sigma2 = std::exp(2 * ls);
      kl += log_s - ls + (sigma2 + mu * mu) / (2 * s2) - 0.5;
      if (!grad) continue;
      const double dw = grad[mean + j];
      grad[log_sigma + j] =
          static_cast<T>(dw * eps[mean + j] * std::exp(ls) + frac * (sigma2 / s2 - 1));
      grad[mean + j] = static_cast<T>(dw + frac * mu / s2);
    }
  };
  for (const Dense& d : layout.decoder) {
    if (d.log_sigma_w < 0) continue;
    one(d.w, d.log_sigma_w, static_cast<std::int64_t>(d.in) * d.out);
    one(d.b, d.log_sigma_b, d.out);
  }
  return kl;
}

}  // namespace caviar::vae
