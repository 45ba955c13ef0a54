#include "models/vae/vae.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <numbers>

#include "core/error.hpp"
#include "core/rng.hpp"

namespace caviar::vae {

Likelihood parse_likelihood(const std::string& s) {
  if (s == "bernoulli") return Likelihood::kBernoulli;
  if (s == "gaussian") return Likelihood::kGaussian;
  throw Error("unknown likelihood '" + s + "' (expected bernoulli or gaussian)");
}

std::string to_string(Likelihood l) {
  return l == Likelihood::kBernoulli ? "bernoulli" : "gaussian";
}

Posterior parse_posterior(const std::string& s) {
  if (s == "diagonal") return Posterior::kDiagonal;
  if (s == "full") return Posterior::kFull;
  throw Error("unknown --posterior '" + s + "' (expected diagonal or full)");
}

std::string to_string(Posterior p) {
  return p == Posterior::kDiagonal ? "diagonal" : "full";
}

Layout::Layout(const Architecture& a) : arch(a) {
  if (a.input_dim < 1) throw Error("the VAE input dimension must be >= 1");
  if (a.latent < 1) throw Error("--latent must be >= 1 (got " + std::to_string(a.latent) + ")");
  for (int h : a.hidden)
    if (h < 1) throw Error("--hidden widths must be >= 1 (got " + std::to_string(h) + ")");
  auto aligned = [](std::int64_t i) { return (i + kParamAlign - 1) / kParamAlign * kParamAlign; };
  auto add = [&](std::vector<Dense>& where, std::vector<std::string> parts, std::vector<int> rows,
                 int in) {
    Dense d;
    d.parts = std::move(parts);
    d.rows = std::move(rows);
    d.in = in;
    for (int r : d.rows) d.out += r;
    d.w = n_params;
    d.b = aligned(n_params + static_cast<std::int64_t>(in) * d.out);
    n_params = aligned(d.b + d.out);
    where.push_back(std::move(d));
  };
  if (a.conv()) {
    if (a.image_channels < 1 || a.height < 1 || a.width < 1 ||
        static_cast<std::int64_t>(a.image_channels) * a.height * a.width != a.input_dim)
      throw Error("the convolutional VAE needs images of C x H x W = " +
                  std::to_string(a.input_dim) + " values");
    if (!a.hidden.empty()) throw Error("a convolutional VAE has no --hidden layers");
    if (a.bayesian_decoder) throw Error("--bayesian-decoder applies to --arch mlp only");
    auto add_bn = [&](const std::string& name, int channels, int positions) {
      BatchNormLayer b;
      b.name = name;
      b.channels = channels;
      b.positions = positions;
      b.gamma = n_params;
      b.beta = aligned(n_params + channels);
      n_params = aligned(b.beta + channels);
      b.running = n_running;
      n_running += 2 * channels;
      batch_norm.push_back(b);
      return static_cast<int>(batch_norm.size()) - 1;
    };
    auto add_conv = [&](std::vector<ConvLayer>& where, const std::string& name, ConvShape shape,
                        bool transposed) {
      ConvLayer c;
      c.name = name;
      c.shape = shape;
      c.transposed = transposed;
      c.w = n_params;
      c.b = aligned(n_params + shape.weights());
      n_params = aligned(c.b + c.out_channels());
      where.push_back(c);
      return &where.back();
    };
    // Stride-2 4 x 4 convolutions with padding 1 halve each side (rounding down).
    std::vector<ConvShape> shapes;
    int c = a.image_channels, h = a.height, w = a.width;
    for (std::size_t l = 0; l < a.channels.size(); ++l) {
      const ConvShape s{c, h, w, a.channels[l], 4, 2, 1};
      if (a.channels[l] < 1) throw Error("--channels must be >= 1");
      // The kernel must fit in the padded image (PyTorch's floor division refuses it too).
      if (h + 2 * s.pad < s.kernel || w + 2 * s.pad < s.kernel)
        throw Error("--channels has " + std::to_string(a.channels.size()) +
                    " stride-2 layers, too many for " + std::to_string(a.height) + " x " +
                    std::to_string(a.width) + " images");
      shapes.push_back(s);
      ConvLayer* cl = add_conv(conv_encoder, "encoder/conv" + std::to_string(l), s, false);
      cl->bn = add_bn("encoder/bn" + std::to_string(l), s.out_channels, s.out_positions());
      c = s.out_channels;
      h = s.out_height();
      w = s.out_width();
    }
    const int features = c * h * w;
    if (a.posterior == Posterior::kFull)
      add(encoder, {"encoder/mu", "encoder/logvar", "encoder/lower"},
          {a.latent, a.latent, a.latent * (a.latent - 1) / 2}, features);
    else
      add(encoder, {"encoder/mu", "encoder/logvar"}, {a.latent, a.latent}, features);
    add(decoder, {"decoder/project"}, {features}, a.latent);
    const int project_bn = add_bn("decoder/bn_project", c, h * w);
    (void)project_bn;
    // The mirror: the adjoint of encoder convolution l, for l = L-1 .. 0; the last one gives the
    // likelihood's parameters (logits, or Gaussian mean and log-variance channels).
    const int out_channels =
        a.likelihood == Likelihood::kBernoulli ? a.image_channels : 2 * a.image_channels;
    for (std::size_t l = shapes.size(); l-- > 0;) {
      ConvShape s = shapes[l];
      if (l == 0) s.in_channels = out_channels;
      const std::size_t j = shapes.size() - 1 - l;
      ConvLayer* cl = add_conv(conv_decoder, "decoder/deconv" + std::to_string(j), s, true);
      if (l > 0) {
        cl->bn = add_bn("decoder/bn" + std::to_string(j), s.in_channels, s.height * s.width);
      } else {
        cl->relu = false;
      }
    }
    return;
  }
  int in = a.input_dim;
  for (std::size_t l = 0; l < a.hidden.size(); ++l) {
    add(encoder, {"encoder/hidden" + std::to_string(l)}, {a.hidden[l]}, in);
    in = a.hidden[l];
  }
  // mu and log sigma^2 as one layer (Kingma & Welling 2014, appendix C.2): rows [0, Z) and
  // [Z, 2Z); a full posterior's L' entries follow.
  if (a.posterior == Posterior::kFull)
    add(encoder, {"encoder/mu", "encoder/logvar", "encoder/lower"},
        {a.latent, a.latent, a.latent * (a.latent - 1) / 2}, in);
  else
    add(encoder, {"encoder/mu", "encoder/logvar"}, {a.latent, a.latent}, in);
  in = a.latent;
  for (std::size_t l = a.hidden.size(); l-- > 0;) {
    add(decoder, {"decoder/hidden" + std::to_string(a.hidden.size() - 1 - l)}, {a.hidden[l]}, in);
    in = a.hidden[l];
  }
  if (a.likelihood == Likelihood::kBernoulli)
    add(decoder, {"decoder/logits"}, {a.input_dim}, in);
  else
    add(decoder, {"decoder/mean", "decoder/logvar"}, {a.input_dim, a.input_dim}, in);
  if (a.bayesian_decoder) {
    if (!(a.prior_scale > 0) || !std::isfinite(a.prior_scale))
      throw Error("--prior-scale must be > 0");
    // After every mean, so that the means keep the deterministic network's layout.
    for (Dense& d : decoder) {
      d.log_sigma_w = n_params;
      d.log_sigma_b = aligned(n_params + static_cast<std::int64_t>(d.in) * d.out);
      n_params = aligned(d.log_sigma_b + d.out);
    }
  }
}

std::vector<const Dense*> Layout::layers() const {
  std::vector<const Dense*> all;
  for (const auto& d : encoder) all.push_back(&d);
  for (const auto& d : decoder) all.push_back(&d);
  return all;
}

ParamVec xavier_init(const Layout& layout, std::uint64_t seed) {
  ParamVec p(static_cast<std::size_t>(layout.n_params), 0.0f);
  const CounterRng rng(seed, Stream::kVaeInit);
  for (const Dense* d : layout.layers()) {
    std::int64_t g = d->w;  // global parameter index: the key of the draw
    for (std::size_t k = 0; k < d->parts.size(); ++k) {
      // Each head of a split layer is its own Linear(in, rows) for the fan-out. The lower
      // triangle of a full posterior starts at zero: the fit starts from the diagonal posterior.
      const double a = std::sqrt(6.0 / (d->in + static_cast<double>(d->rows[k])));
      const bool zero = d->parts[k] == "encoder/lower";
      for (std::int64_t i = 0; i < static_cast<std::int64_t>(d->in) * d->rows[k]; ++i, ++g) {
        const double u = rng.uniform2(static_cast<std::uint64_t>(g / 2), 0)[g % 2];
        p[static_cast<std::size_t>(g)] = zero ? 0.0f : static_cast<float>(a * (2.0 * u - 1.0));
      }
    }
  }
  // Convolutions: Xavier with the receptive field in both fans; batch norm: gamma 1, beta 0.
  for (const auto* convs : {&layout.conv_encoder, &layout.conv_decoder})
    for (const ConvLayer& c : *convs) {
      const double k2 = static_cast<double>(c.shape.kernel) * c.shape.kernel;
      const double a =
          std::sqrt(6.0 / (k2 * (c.shape.in_channels + static_cast<double>(c.shape.out_channels))));
      for (std::int64_t g = c.w; g < c.w + c.shape.weights(); ++g) {
        const double u = rng.uniform2(static_cast<std::uint64_t>(g / 2), 0)[g % 2];
        p[static_cast<std::size_t>(g)] = static_cast<float>(a * (2.0 * u - 1.0));
      }
    }
  for (const BatchNormLayer& b : layout.batch_norm)
    std::fill_n(p.begin() + b.gamma, b.channels, 1.0f);
  for (const Dense& d : layout.decoder)
    if (d.log_sigma_w >= 0) {
      std::fill_n(p.begin() + d.log_sigma_w, static_cast<std::int64_t>(d.in) * d.out,
                  kInitialLogSigma);
      std::fill_n(p.begin() + d.log_sigma_b, d.out, kInitialLogSigma);
    }
  return p;
}

std::vector<double> initial_running(const Layout& layout) {
  std::vector<double> r(static_cast<std::size_t>(layout.n_running), 0.0);
  for (const BatchNormLayer& b : layout.batch_norm)
    std::fill_n(r.begin() + b.running + b.channels, b.channels, 1.0);
  return r;
}

namespace {
// Samples [first, first + count) of row `row`'s `total` into columns [col, col + count) of eps:
// the Z normals of sample k are pairs (row total + k) (Z + 1) / 2 + q of the (seed, step) stream.
void noise_into(Mat<float>& eps, std::int64_t col, std::int64_t row, std::int64_t first,
                std::int64_t count, std::int64_t total, int z, const CounterRng& rng,
                std::uint32_t step) {
  const std::int64_t pairs = (z + 1) / 2;
  for (std::int64_t k = 0; k < count; ++k)
    for (std::int64_t q = 0; q < pairs; ++q) {
      const auto e =
          rng.normal2(static_cast<std::uint64_t>((row * total + first + k) * pairs + q), step);
      eps(2 * q, col + k) = static_cast<float>(e[0]);
      if (2 * q + 1 < z) eps(2 * q + 1, col + k) = static_cast<float>(e[1]);
    }
}
}  // namespace

void fill_noise(Mat<float>& eps, const std::int64_t* rows, std::int64_t n, int s, int z,
                std::uint64_t seed, std::uint32_t step) {
  const CounterRng rng(seed, Stream::kVaeNoise);
  eps.resize(z, n * s);
  for (std::int64_t c = 0; c < n; ++c) noise_into(eps, c * s, rows[c], 0, s, s, z, rng, step);
}

void fill_noise_samples(Mat<float>& eps, std::int64_t row, std::int64_t first, int count,
                        std::int64_t total, int z, std::uint64_t seed, std::uint32_t step) {
  const CounterRng rng(seed, Stream::kVaeNoise);
  eps.resize(z, count);
  noise_into(eps, 0, row, first, count, total, z, rng, step);
}

double normal_quantile(double p) {
  if (!(p > 0.0 && p < 1.0)) throw Error("normal_quantile: p must be in (0, 1)");
  // Acklam's rational approximation (relative error 1.15e-9), then one Halley step on
  // Phi(x) - p using erfc, which brings it to double precision.
  static const double a[] = {-3.969683028665376e+01, 2.209460984245205e+02,  -2.759285104469687e+02,
                             1.383577518672690e+02,  -3.066479806614716e+01, 2.506628277459239e+00};
  static const double b[] = {-5.447609879822406e+01, 1.615858368580409e+02, -1.556989798598866e+02,
                             6.680131188771972e+01, -1.328068155288572e+01};
  static const double c[] = {-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e+00,
                             -2.549732539343734e+00, 4.374664141464968e+00,  2.938163982698783e+00};
  static const double d[] = {7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e+00,
                             3.754408661907416e+00};
  const double p_low = 0.02425;
  double x;
  if (p < p_low || p > 1.0 - p_low) {
    const double q = std::sqrt(-2.0 * std::log(p < p_low ? p : 1.0 - p));
    x = (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) /
        ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1.0);
    if (p > 1.0 - p_low) x = -x;
  } else {
    const double q = p - 0.5, r = q * q;
    x = (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q /
        (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1.0);
  }
  const double e = 0.5 * std::erfc(-x / std::numbers::sqrt2) - p;
  const double u = e * std::sqrt(2.0 * std::numbers::pi) * std::exp(0.5 * x * x);
  return x - u / (1.0 + 0.5 * x * u);
}

}  // namespace caviar::vae
