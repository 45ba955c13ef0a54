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

Layout::Layout(const Architecture& a) : arch(a) {
  if (a.input_dim < 1) throw Error("the VAE input dimension must be >= 1");
  if (a.latent < 1) throw Error("--latent must be >= 1 (got " + std::to_string(a.latent) + ")");
  for (int h : a.hidden)
    if (h < 1) throw Error("--hidden widths must be >= 1 (got " + std::to_string(h) + ")");
  auto aligned = [](std::int64_t i) { return (i + kParamAlign - 1) / kParamAlign * kParamAlign; };
  auto add = [&](std::vector<Dense>& where, std::vector<std::string> parts, int in, int out) {
    Dense d;
    d.parts = std::move(parts);
    d.in = in;
    d.out = out;
    d.w = n_params;
    d.b = aligned(n_params + static_cast<std::int64_t>(in) * out);
    n_params = aligned(d.b + out);
    where.push_back(std::move(d));
  };
  int in = a.input_dim;
  for (std::size_t l = 0; l < a.hidden.size(); ++l) {
    add(encoder, {"encoder/hidden" + std::to_string(l)}, in, a.hidden[l]);
    in = a.hidden[l];
  }
  // mu and log sigma^2 as one layer (Kingma & Welling 2014, appendix C.2): rows [0, Z) and
  // [Z, 2Z).
  add(encoder, {"encoder/mu", "encoder/logvar"}, in, 2 * a.latent);
  in = a.latent;
  for (std::size_t l = a.hidden.size(); l-- > 0;) {
    add(decoder, {"decoder/hidden" + std::to_string(a.hidden.size() - 1 - l)}, in, a.hidden[l]);
    in = a.hidden[l];
  }
  if (a.likelihood == Likelihood::kBernoulli)
    add(decoder, {"decoder/logits"}, in, a.input_dim);
  else
    add(decoder, {"decoder/mean", "decoder/logvar"}, in, 2 * a.input_dim);
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
    // Each head of a split layer is its own Linear(in, out / parts) for the fan-out.
    const double fan_out = static_cast<double>(d->out) / static_cast<double>(d->parts.size());
    const double a = std::sqrt(6.0 / (d->in + fan_out));
    const std::int64_t n = static_cast<std::int64_t>(d->in) * d->out;
    for (std::int64_t i = 0; i < n; ++i) {
      const std::int64_t g = d->w + i;  // global parameter index: the key of the draw
      const double u = rng.uniform2(static_cast<std::uint64_t>(g / 2), 0)[g % 2];
      p[static_cast<std::size_t>(g)] = static_cast<float>(a * (2.0 * u - 1.0));
    }
  }
  return p;
}

void Adam::begin_step() {
  ++t_;
  const double bc1 = 1.0 - std::pow(cfg_.beta1, static_cast<double>(t_));
  const double bc2 = 1.0 - std::pow(cfg_.beta2, static_cast<double>(t_));
  step_size_ = static_cast<float>(cfg_.lr / bc1);
  inv_sqrt_bc2_ = static_cast<float>(1.0 / std::sqrt(bc2));
}

void Adam::update(float* p, const float* g, std::int64_t begin, std::int64_t end) {
  const float b1 = static_cast<float>(cfg_.beta1), b2 = static_cast<float>(cfg_.beta2);
  const float eps = static_cast<float>(cfg_.eps), wd = static_cast<float>(cfg_.weight_decay);
  // Eigen array expressions, so that sqrt and division are vectorised (element-wise IEEE
  // operations: the vector and scalar paths round identically).
  using Arr = Eigen::Map<Eigen::ArrayXf>;
  const Eigen::Index n = static_cast<Eigen::Index>(end - begin);
  Arr pa(p + begin, n), m(m_.data() + begin, n), v(v_.data() + begin, n);
  const Eigen::Map<const Eigen::ArrayXf> ga(g + begin, n);
  for (Eigen::Index k = 0; k < n; k += 1024) {  // 1024 at a time: the temporaries stay in L1
    const Eigen::Index len = std::min<Eigen::Index>(1024, n - k);
    auto pk = pa.segment(k, len);
    auto mk = m.segment(k, len);
    auto vk = v.segment(k, len);
    // L2 weight decay: the gradient of wd/2 |theta|^2 is added to g.
    const Eigen::ArrayXf gi = ga.segment(k, len) + wd * pk;
    mk = b1 * mk + (1.0f - b1) * gi;
    vk = b2 * vk + (1.0f - b2) * gi * gi;
    pk -= step_size_ * mk / (vk.sqrt() * inv_sqrt_bc2_ + eps);
  }
}

int fixed_point_exponent(double max_abs, std::int64_t n_terms) {
  if (!(max_abs > 0) || !std::isfinite(max_abs)) return 0;
  int e = 0;
  std::frexp(max_abs, &e);  // max_abs < 2^e
  int log2_terms = 0;
  while ((std::int64_t{1} << log2_terms) < std::max<std::int64_t>(1, n_terms)) ++log2_terms;
  // Each term is below 2^(61 - log2_terms) after scaling, so n_terms of them stay below 2^61.
  return 61 - log2_terms - e;
}

void add_fixed_point(const float* g, std::int64_t n, int exponent, std::int64_t* acc) {
  const double scale = std::ldexp(1.0, exponent);
  // Multiplying by a power of two is exact; the conversion truncates toward zero, the same way on
  // every rank, and the integer additions are exact and associative. Scaled values are below
  // 2^61 unless the gradient is not finite (an infinite or NaN maximum gives exponent 0):
  // converting those is undefined, so they are clamped to +-2^62 and NaN counts as 0. Such a
  // step has diverged: the trainer stops before summing it ("training diverged"), since two
  // clamped values would overflow the sum.
  constexpr double kMax = 0x1p62;
  for (std::int64_t i = 0; i < n; ++i) {
    const double x = static_cast<double>(g[i]) * scale;
    acc[i] += x == x ? static_cast<std::int64_t>(std::clamp(x, -kMax, kMax)) : 0;
  }
}

void from_fixed_point(const std::int64_t* acc, std::int64_t n, int exponent, double divisor,
                      float* out) {
  const double inv = std::ldexp(1.0, -exponent) / divisor;
  for (std::int64_t i = 0; i < n; ++i)
    out[i] = static_cast<float>(static_cast<double>(acc[i]) * inv);
}

double max_abs(const float* g, std::int64_t n) {
  // On the bits with the sign cleared, integer order is the order of |g| (NaN compares above
  // infinity and makes the result non-finite): an integer max, which the compiler vectorises.
  std::uint32_t m = 0;
  for (std::int64_t i = 0; i < n; ++i)
    m = std::max(m, std::bit_cast<std::uint32_t>(g[i]) & 0x7FFFFFFFu);
  return std::bit_cast<float>(m);
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
