// The VAE's layers and network against finite differences (in double) and closed forms.
#include <gtest/gtest.h>

#include <Eigen/Cholesky>
#include <Eigen/LU>

#include <cmath>
#include <functional>
#include <limits>
#include <numbers>
#include <random>

#include "core/error.hpp"
#include "models/vae/vae.hpp"
#include "vae_fd.hpp"

namespace caviar::vae {
namespace {

using namespace testing;

TEST(VaeLayers, DenseBackwardMatchesFiniteDifferences) {
  const int in = 5, out = 4, n = 3;
  std::vector<double> w = to_vec(random_mat(out * in, 1, 1)), b = to_vec(random_mat(out, 1, 2));
  std::vector<double> x = to_vec(random_mat(in, n, 3));
  const MatD r = random_mat(out, n, 4);  // L = sum(r .* y)
  auto loss = [&] {
    MatD y;
    dense_forward(w.data(), b.data(), out, in, from_vec(x, in, n), y);
    return (r.array() * y.array()).sum();
  };
  std::vector<double> gw(w.size()), gb(b.size());
  MatD dx;
  dense_backward(w.data(), out, in, from_vec(x, in, n), r, gw.data(), gb.data(), &dx);
  expect_gradient(w, loss, gw, 1e-7, "dW");
  expect_gradient(b, loss, gb, 1e-7, "db");
  expect_gradient(x, loss, to_vec(dx), 1e-7, "dx");
}

TEST(VaeLayers, ReluBackwardMatchesFiniteDifferences) {
  // Inputs kept away from the kink at 0, where the derivative does not exist.
  MatD in = random_mat(6, 4, 5, 0.1, 1.0);
  for (int i = 0; i < in.size(); i += 2) in.data()[i] = -in.data()[i];
  std::vector<double> x = to_vec(in);
  const MatD r = random_mat(6, 4, 6);
  auto loss = [&] {
    MatD a = from_vec(x, 6, 4);
    relu_forward(a);
    return (r.array() * a.array()).sum();
  };
  MatD a = in;
  relu_forward(a);
  MatD d = r;
  relu_backward(a, d);
  expect_gradient(x, loss, to_vec(d), 1e-7, "relu");
}

TEST(VaeLayers, BernoulliLogLikelihoodClosedFormAndGradient) {
  const int dim = 7, n = 3;
  const MatD l = random_mat(dim, n, 7, -4, 4), x = random_mat(dim, n, 8, 0, 1);
  Eigen::VectorXd ll;
  MatD dl;
  bernoulli_loglik<double>(l, x, ll, 0.5, &dl);
  for (int j = 0; j < n; ++j) {
    double ref = 0;  // Kingma & Welling 2014, appendix C.1, with y = sigmoid(l), computed naively
    for (int i = 0; i < dim; ++i) {
      const double xh = 1.0 / (1.0 + std::exp(-l(i, j)));
      ref += x(i, j) * std::log(xh) + (1 - x(i, j)) * std::log(1 - xh);
    }
    EXPECT_NEAR(ll(j), ref, 1e-12);
  }
  std::vector<double> lv = to_vec(l);
  auto loss = [&] {
    Eigen::VectorXd v;
    bernoulli_loglik<double>(from_vec(lv, dim, n), x, v, 1.0, nullptr);
    return -0.5 * v.sum();
  };
  expect_gradient(lv, loss, to_vec(dl), 1e-7, "bernoulli");

  // Stable in float at extreme logits where the naive form gives log(0).
  Mat<float> lf(2, 1), xf(2, 1);
  lf << 100.0f, -100.0f;
  xf << 0.0f, 1.0f;
  Mat<float> df;
  bernoulli_loglik<float>(lf, xf, ll, 1.0f, &df);
  EXPECT_NEAR(ll(0), -200.0, 1e-3);
  EXPECT_TRUE(df.allFinite());
  EXPECT_NEAR(df(0, 0), 1.0f, 1e-6);
  EXPECT_NEAR(df(1, 0), -1.0f, 1e-6);
}

TEST(VaeLayers, GaussianLogLikelihoodClosedFormAndGradient) {
  const int dim = 4, n = 2;
  const MatD out = random_mat(2 * dim, n, 9, -1, 1), x = random_mat(dim, n, 10, -1, 2);
  Eigen::VectorXd ll;
  MatD dout;
  gaussian_loglik<double>(out, x, ll, 1.0, &dout);
  for (int j = 0; j < n; ++j) {
    double ref = 0;
    for (int i = 0; i < dim; ++i) {
      const double m = out(i, j), var = std::exp(out(dim + i, j));
      ref += std::log(std::exp(-0.5 * (x(i, j) - m) * (x(i, j) - m) / var) /
                      std::sqrt(2 * std::numbers::pi * var));
    }
    EXPECT_NEAR(ll(j), ref, 1e-12);
  }
  std::vector<double> ov = to_vec(out);
  auto loss = [&] {
    Eigen::VectorXd v;
    gaussian_loglik<double>(from_vec(ov, 2 * dim, n), x, v, 1.0, nullptr);
    return -v.sum();
  };
  expect_gradient(ov, loss, to_vec(dout), 1e-7, "gaussian");
}

TEST(VaeLayers, KlMatchesSeedFormAndNumericalIntegral) {
  const int z = 3, n = 2;
  const MatD mu = random_mat(z, n, 11, -2, 2), lv = random_mat(z, n, 12, -1.5, 1.0);
  Eigen::VectorXd kl;
  MatD dmu, dlv;
  kl_standard_normal<double>(mu, lv, kl, 1.0, &dmu, &dlv);
  for (int j = 0; j < n; ++j) {
    // KL = E_q[log q] - E_q[log p], each in closed form (Kingma & Welling 2014, appendix B).
    double eq_logq = 0, eq_logp = 0, integral = 0;
    for (int i = 0; i < z; ++i) {
      const double m = mu(i, j), s2 = std::exp(lv(i, j)), s = std::sqrt(s2);
      eq_logp += -0.5 * std::log(2 * std::numbers::pi) - 0.5 * (m * m + s2);
      eq_logq += -0.5 * std::log(2 * std::numbers::pi) - 0.5 * (1 + std::log(s2));
      // And the 1-D integral of q (log q - log p) by the trapezoid rule over mu +- 12 sigma.
      const int steps = 20000;
      const double lo = m - 12 * s, h = 24 * s / steps;
      for (int k = 0; k <= steps; ++k) {
        const double t = lo + k * h;
        const double logq =
            -0.5 * std::log(2 * std::numbers::pi * s2) - 0.5 * (t - m) * (t - m) / s2;
        const double logp = -0.5 * std::log(2 * std::numbers::pi) - 0.5 * t * t;
        integral += (k == 0 || k == steps ? 0.5 : 1.0) * h * std::exp(logq) * (logq - logp);
      }
    }
    EXPECT_NEAR(kl(j), eq_logq - eq_logp, 1e-12);
    EXPECT_NEAR(kl(j), integral, 1e-8);
  }
  std::vector<double> mv = to_vec(mu), lvv = to_vec(lv);
  auto loss = [&] {
    Eigen::VectorXd v;
    kl_standard_normal<double>(from_vec(mv, z, n), from_vec(lvv, z, n), v, 1.0, nullptr, nullptr);
    return v.sum();
  };
  expect_gradient(mv, loss, to_vec(dmu), 1e-7, "kl dmu");
  expect_gradient(lvv, loss, to_vec(dlv), 1e-7, "kl dlv");
}

TEST(VaeLayers, ReparameterisationBackwardMatchesFiniteDifferences) {
  const int z = 3, n = 2, s = 3;
  std::vector<double> mv = to_vec(random_mat(z, n, 13)), lvv = to_vec(random_mat(z, n, 14));
  const MatD eps = random_mat(z, n * s, 15, -2, 2), r = random_mat(z, n * s, 16);
  auto loss = [&] {
    MatD zz;
    reparameterise<double>(from_vec(mv, z, n), from_vec(lvv, z, n), eps, s, zz);
    return (r.array() * zz.array()).sum();
  };
  MatD dmu = MatD::Zero(z, n), dlv = MatD::Zero(z, n);
  reparameterise_backward<double>(from_vec(lvv, z, n), eps, r, s, dmu, dlv);
  expect_gradient(mv, loss, to_vec(dmu), 1e-7, "reparam dmu");
  expect_gradient(lvv, loss, to_vec(dlv), 1e-7, "reparam dlv");
}

// The whole network: dL/dtheta for L = -sum_i ELBO_i, every parameter, both likelihoods and
// several hidden layers and samples.
void check_network(Likelihood lik, std::vector<int> hidden, int s,
                   Posterior post = Posterior::kDiagonal, int z = 2) {
  Architecture a{6, hidden, z, lik, post};
  const Layout layout(a);
  const ParamVec pf = xavier_init(layout, 3);
  std::vector<double> p(pf.begin(), pf.end());
  // Non-zero biases so that their gradients are exercised away from a symmetric start.
  for (const Dense* d : layout.layers())
    for (int i = 0; i < d->out; ++i) p[d->b + i] = 0.1 * std::sin(1.0 + d->b + i);
  const int n = 4;
  const MatD x = lik == Likelihood::kBernoulli ? random_mat(6, n, 17, 0, 1) : random_mat(6, n, 17);
  const MatD eps = random_mat(z, n * s, 18, -1.5, 1.5);
  Network<double> net(layout);
  std::vector<double> g(p.size());
  Eigen::VectorXd rows;
  const double total = net.run(p.data(), x, eps, s, g.data(), &rows);
  EXPECT_NEAR(total, rows.sum(), 1e-10);
  auto loss = [&] { return -net.run(p.data(), x, eps, s, nullptr); };
  expect_gradient(p, loss, g, 1e-6, "network " + to_string(lik));
}

TEST(VaeNetwork, GradientMatchesFiniteDifferencesBernoulli) {
  check_network(Likelihood::kBernoulli, {5, 4}, 2);
}
TEST(VaeNetwork, GradientMatchesFiniteDifferencesGaussian) {
  check_network(Likelihood::kGaussian, {5}, 1);
}
TEST(VaeNetwork, GradientMatchesFiniteDifferencesNoHiddenLayer) {
  check_network(Likelihood::kBernoulli, {}, 3);
}

TEST(VaeNetwork, GradientMatchesFiniteDifferencesFullPosterior) {
  check_network(Likelihood::kBernoulli, {5}, 2, Posterior::kFull, 3);
  check_network(Likelihood::kGaussian, {}, 1, Posterior::kFull, 4);
}

// The Bayesian decoder (Kingma & Welling 2014, appendix F): L(mu, log sigma) = -sum_i ELBO_i at
// the weights w = mu + sigma eps drawn for one step, plus frac KL(q(w) || N(0, s^2)); every
// parameter's gradient (means and log sigmas of the decoder, the encoder's) against central
// differences, with the draw's eps fixed by its key.
TEST(VaeNetwork, BayesianDecoderGradientMatchesFiniteDifferences) {
  Architecture a{6, {5}, 2, Likelihood::kBernoulli};
  a.bayesian_decoder = true;
  a.prior_scale = 0.7;
  const Layout layout(a);
  const ParamVec pf = xavier_init(layout, 3);
  std::vector<double> p(pf.begin(), pf.end());
  for (const Dense& d : layout.decoder) {
    ASSERT_GE(d.log_sigma_w, 0);
    EXPECT_EQ(p[d.log_sigma_w], kInitialLogSigma);
    // Larger sigmas than at the start, so that the draw's part of the gradient shows.
    for (int j = 0; j < d.in * d.out; ++j) p[d.log_sigma_w + j] = -1.5 + 0.5 * std::sin(1.0 + j);
    for (int j = 0; j < d.out; ++j) p[d.log_sigma_b + j] = -1.0 + 0.4 * std::cos(2.0 + j);
  }
  const int n = 4;
  const MatD x = random_mat(6, n, 17, 0, 1);
  const MatD eps = random_mat(2, n, 18, -1.5, 1.5);
  const double frac = 0.25;
  auto value = [&](std::vector<double>* grad) {
    std::vector<double> sampled, weight_eps, g(p.size(), 0.0);
    sample_decoder(layout, p.data(), 11, 4, sampled, weight_eps);
    Network<double> net(layout);
    const double elbo = net.run(sampled.data(), x, eps, 1, grad ? g.data() : nullptr);
    const double kl = decoder_kl_backward(layout, p.data(), weight_eps.data(), frac, g.data());
    if (grad) *grad = g;
    return -(elbo - frac * kl);
  };
  std::vector<double> g;
  value(&g);
  expect_gradient(
      p, [&] { return value(nullptr); }, g, 1e-6, "Bayesian decoder");
}

// The weights' KL by hand: zero at q = p, and 1 / (2 s^2) more for one mean moved to 1.
TEST(VaeNetwork, BayesianDecoderKlByHand) {
  Architecture a{3, {2}, 1, Likelihood::kBernoulli};
  a.bayesian_decoder = true;
  a.prior_scale = 0.5;
  const Layout layout(a);
  std::vector<double> p(static_cast<std::size_t>(layout.n_params), 0.0);
  for (const Dense& d : layout.decoder) {
    for (int j = 0; j < d.in * d.out; ++j) p[d.log_sigma_w + j] = std::log(0.5);
    for (int j = 0; j < d.out; ++j) p[d.log_sigma_b + j] = std::log(0.5);
  }
  std::vector<double> eps(p.size(), 0.0), g(p.size(), 0.0);
  EXPECT_NEAR(decoder_kl_backward(layout, p.data(), eps.data(), 1.0, g.data()), 0.0, 1e-14);
  p[layout.decoder.back().w + 1] = 1.0;
  std::fill(g.begin(), g.end(), 0.0);
  EXPECT_NEAR(decoder_kl_backward(layout, p.data(), eps.data(), 1.0, g.data()), 2.0, 1e-14);
  EXPECT_NEAR(g[layout.decoder.back().w + 1], 4.0, 1e-14);  // mu / s^2
  // The value alone (no gradient buffers), as the model file's decoder_kl is computed.
  EXPECT_NEAR(decoder_kl_backward<double>(layout, p.data(), nullptr, 0.0, nullptr), 2.0, 1e-14);
}

// The full posterior's ELBO term by term at one sample: z = mu + L eps with
// L = diag(sigma) (I + M (.) L'), the KL of N(mu, L L^T) from N(0, I) in closed form (Dense Eigen
// algebra here, independent of the network's loops), and the Gaussian log-likelihood of the
// decoder's output at that z.
TEST(VaeNetwork, FullPosteriorElboMatchesADirectComputation) {
  const int d = 3, z = 3;
  const Layout layout(Architecture{d, {}, z, Likelihood::kGaussian, Posterior::kFull});
  ASSERT_EQ(layout.lower(), 3);
  ASSERT_EQ(layout.encoder.back().rows, (std::vector<int>{3, 3, 3}));
  std::vector<double> p(static_cast<std::size_t>(layout.n_params));
  std::mt19937_64 gen(5);
  std::uniform_real_distribution<double> u(-0.7, 0.7);
  for (double& v : p) v = u(gen);
  const MatD x = random_mat(d, 1, 6), eps = random_mat(z, 1, 7);
  Network<double> net(layout);
  const double elbo = net.run(p.data(), x, eps, 1, nullptr);

  const Dense& h = layout.encoder.back();
  const MatD head = Eigen::Map<const Eigen::Matrix<double, -1, -1, Eigen::RowMajor>>(p.data() + h.w,
                                                                                     h.out, h.in) *
                        x +
                    Eigen::Map<const MatD>(p.data() + h.b, h.out, 1);
  const Eigen::VectorXd mu = head.col(0).head(z), lv = head.col(0).segment(z, z);
  Eigen::MatrixXd L = Eigen::MatrixXd::Zero(z, z);
  for (int i = 0, e = 0; i < z; ++i) {
    L(i, i) = std::exp(lv[i] / 2);
    for (int j = 0; j < i; ++j, ++e) L(i, j) = L(i, i) * head(2 * z + e, 0);
  }
  const Eigen::VectorXd zz = mu + L * eps.col(0);
  const Eigen::MatrixXd cov = L * L.transpose();
  const double kl = 0.5 * (cov.trace() + mu.squaredNorm() - z - std::log(cov.determinant()));
  const Dense& o = layout.decoder.back();
  const Eigen::VectorXd out = Eigen::Map<const Eigen::Matrix<double, -1, -1, Eigen::RowMajor>>(
                                  p.data() + o.w, o.out, o.in) *
                                  zz +
                              Eigen::Map<const Eigen::VectorXd>(p.data() + o.b, o.out);
  double ll = 0;
  for (int i = 0; i < d; ++i) {
    const double m = out[i], v = out[d + i], r = x(i, 0) - m;
    ll += -0.5 * (std::log(2 * std::numbers::pi) + v + r * r * std::exp(-v));
  }
  EXPECT_NEAR(elbo, ll - kl, 1e-12);

  // The importance weight at the same draw: log p(x | z) + log N(z; 0, I) - log q(z | x).
  Eigen::MatrixXd logw;
  net.log_weights(p.data(), x, eps, 1, logw);
  const double log_q = -0.5 * (z * std::log(2 * std::numbers::pi) + eps.squaredNorm()) -
                       std::log(L.diagonal().prod());
  const double log_prior = -0.5 * (z * std::log(2 * std::numbers::pi) + zz.squaredNorm());
  EXPECT_NEAR(logw(0, 0), ll + log_prior - log_q, 1e-12);
}

// The path-derivative ("sticking the landing") gradient (Roeder, Wu & Duvenaud 2017). On a
// linear-Gaussian model, x | z ~ N(W z + c, diag(e^v)), the posterior is Gaussian,
// N(Sigma W^T D^-1 (x - c), Sigma) with Sigma^-1 = I + W^T D^-1 W, and an encoder without hidden
// layers represents it exactly. There, log p(x, z) - log q(z | x) does not depend on z, so the
// estimator's gradient in every encoder parameter is zero at every draw; the closed-form-KL
// estimator's is not. The decoder's gradient is the same under both.
void check_stl_at_exact_posterior(Posterior post) {
  const int d = 4, z = 3, n = 3;
  Architecture a{d, {}, z, Likelihood::kGaussian, post};
  const Layout rep_layout(a);
  a.stl = true;
  const Layout stl_layout(a);
  std::vector<double> p(static_cast<std::size_t>(rep_layout.n_params), 0.0);
  const Dense& o = rep_layout.decoder.back();  // rows: the mean's d, then the log-variance's d
  Eigen::MatrixXd w = random_mat(d, z, 31);
  // A diagonal posterior is exact when W's columns are orthogonal in the D^-1 inner product.
  if (post == Posterior::kDiagonal) w = Eigen::MatrixXd::Identity(d, z) * 1.3;
  const Eigen::VectorXd c = random_mat(d, 1, 32), v = random_mat(d, 1, 33, -0.5, 0.5);
  for (int i = 0; i < d; ++i) {
    for (int j = 0; j < z; ++j) p[o.w + i * z + j] = w(i, j);
    p[o.b + i] = c[i];
    p[o.b + d + i] = v[i];
  }
  const Eigen::MatrixXd wd = v.array().exp().inverse().matrix().asDiagonal() * w;  // D^-1 W
  const Eigen::MatrixXd prec = Eigen::MatrixXd::Identity(z, z) + w.transpose() * wd;
  const Eigen::MatrixXd sigma = prec.llt().solve(Eigen::MatrixXd::Identity(z, z));
  const Eigen::MatrixXd chol = sigma.llt().matrixL();
  const Eigen::MatrixXd gain = sigma * wd.transpose();  // posterior mean = gain (x - c)
  const Dense& h = rep_layout.encoder.back();           // mu, log sigma^2, then L'
  for (int i = 0; i < z; ++i) {
    for (int j = 0; j < d; ++j) p[h.w + i * d + j] = gain(i, j);
    p[h.b + i] = -(gain * c)[i];
    p[h.b + z + i] = 2 * std::log(chol(i, i));
  }
  for (int i = 1, e = 0; i < z && post == Posterior::kFull; ++i)
    for (int j = 0; j < i; ++j, ++e) p[h.b + 2 * z + e] = chol(i, j) / chol(i, i);
  if (post == Posterior::kFull) {
    ASSERT_GT(chol.bottomLeftCorner(z - 1, z - 1).norm(), 0.1);  // the triangle is used
  }

  const MatD x = random_mat(d, n, 34, -2, 2), eps = random_mat(z, n * 2, 35, -2, 2);
  std::vector<double> g_rep(p.size()), g_stl(p.size());
  Network<double> rep(rep_layout), stl(stl_layout);
  const double e_rep = rep.run(p.data(), x, eps, 2, g_rep.data());
  const double e_stl = stl.run(p.data(), x, eps, 2, g_stl.data());
  EXPECT_EQ(e_rep, e_stl);  // the estimate of the ELBO itself is unchanged
  // A layer's weights and biases, with the alignment padding between them (whose gradient is 0).
  double enc_rep = 0;
  for (std::int64_t k = h.w; k < h.b + h.out; ++k) {
    EXPECT_NEAR(g_stl[k], 0.0, 1e-10) << "encoder parameter " << k;
    enc_rep = std::max(enc_rep, std::abs(g_rep[k]));
  }
  EXPECT_GT(enc_rep, 1e-2);  // the closed-form estimator's per-draw gradient is not zero
  for (std::int64_t k = o.w; k < o.b + o.out; ++k)
    EXPECT_NEAR(g_stl[k], g_rep[k], 1e-12) << "decoder parameter " << k;
}

TEST(VaeNetwork, StlGradientVanishesAtTheExactPosteriorDiagonal) {
  check_stl_at_exact_posterior(Posterior::kDiagonal);
}

TEST(VaeNetwork, StlGradientVanishesAtTheExactPosteriorFull) {
  check_stl_at_exact_posterior(Posterior::kFull);
}

// Away from the posterior both estimators are unbiased for the same gradient: over M draws, the
// mean of their per-draw difference is within 5 standard errors of zero in every parameter. A
// dropped or mis-signed term (the prior's -z, the entropy's L^-T eps) would move it by many.
TEST(VaeNetwork, StlGradientIsUnbiased) {
  for (Posterior post : {Posterior::kDiagonal, Posterior::kFull}) {
    Architecture a{5, {4}, 3, Likelihood::kBernoulli, post};
    const Layout rep_layout(a);
    a.stl = true;
    const Layout stl_layout(a);
    std::vector<double> p(static_cast<std::size_t>(rep_layout.n_params));
    std::mt19937_64 gen(41);
    std::uniform_real_distribution<double> u(-0.8, 0.8);
    for (double& t : p) t = u(gen);
    const MatD x = random_mat(5, 1, 42, 0, 1);
    Network<double> rep(rep_layout), stl(stl_layout);
    std::mt19937_64 noise(43);
    std::normal_distribution<double> normal;
    MatD eps(3, 1);
    expect_same_mean(
        p.size(), 20000,
        [&](std::vector<double>& g_stl, std::vector<double>& g_rep) {
          for (int i = 0; i < 3; ++i) eps(i, 0) = normal(noise);
          std::fill(g_rep.begin(), g_rep.end(), 0.0);
          std::fill(g_stl.begin(), g_stl.end(), 0.0);
          rep.run(p.data(), x, eps, 1, g_rep.data());
          stl.run(p.data(), x, eps, 1, g_stl.data());
        },
        to_string(post));
  }
}

TEST(VaeNetwork, LayoutOfTheSeedNetwork) {
  const Layout l(Architecture{784, {400}, 20, Likelihood::kBernoulli});
  std::int64_t used = 0;
  for (const Dense* d : l.layers()) {
    used += static_cast<std::int64_t>(d->in) * d->out + d->out;
    EXPECT_EQ(d->w % kParamAlign, 0);
    EXPECT_EQ(d->b % kParamAlign, 0);
    EXPECT_GE(d->b, d->w + static_cast<std::int64_t>(d->in) * d->out);
  }
  EXPECT_EQ(used, (784 * 400 + 400) + (400 * 40 + 40) + (20 * 400 + 400) + (400 * 784 + 784));
  EXPECT_GE(l.n_params, used);
  EXPECT_LT(l.n_params, used + 8 * kParamAlign);
  EXPECT_EQ(l.n_params % kParamAlign, 0);
  ASSERT_EQ(l.encoder.size(), 2u);
  EXPECT_EQ(l.encoder[1].parts, (std::vector<std::string>{"encoder/mu", "encoder/logvar"}));
  EXPECT_THROW(Layout(Architecture{784, {400}, 0, Likelihood::kBernoulli}), Error);
  EXPECT_THROW(Layout(Architecture{784, {0}, 2, Likelihood::kBernoulli}), Error);
}

TEST(VaeNetwork, XavierInitBoundsAndDeterminism) {
  const Layout l(Architecture{30, {20}, 4, Likelihood::kBernoulli});
  const auto p = xavier_init(l, 9), q = xavier_init(l, 9), r = xavier_init(l, 10);
  EXPECT_EQ(p, q);
  EXPECT_NE(p, r);
  const Dense& d = l.encoder[0];
  const double a = std::sqrt(6.0 / (30 + 20));
  double sumsq = 0;
  for (int i = 0; i < d.in * d.out; ++i) {
    EXPECT_LE(std::abs(p[d.w + i]), a);
    sumsq += p[d.w + i] * p[d.w + i];
  }
  // Variance of U(-a, a) is a^2 / 3.
  EXPECT_NEAR(sumsq / (d.in * d.out), a * a / 3, 0.15 * a * a / 3);
  for (int i = 0; i < d.out; ++i) EXPECT_EQ(p[d.b + i], 0.0f);
}

TEST(VaeAdam, FirstStepsMatchHandComputation) {
  AdamConfig cfg;
  cfg.lr = 0.1;
  cfg.weight_decay = 0.5;
  Adam adam(cfg, 2);
  std::vector<float> p{1.0f, -2.0f};
  std::vector<double> m(2, 0), v(2, 0), pd{1.0, -2.0};
  const double grads[2][2] = {{0.3, -0.1}, {-0.2, 0.4}};
  for (int t = 1; t <= 2; ++t) {
    std::vector<float> g{static_cast<float>(grads[t - 1][0]), static_cast<float>(grads[t - 1][1])};
    adam.step(p.data(), g.data());
    for (int i = 0; i < 2; ++i) {
      const double gi = grads[t - 1][i] + 0.5 * pd[i];
      m[i] = 0.9 * m[i] + 0.1 * gi;
      v[i] = 0.999 * v[i] + 0.001 * gi * gi;
      const double mh = m[i] / (1 - std::pow(0.9, t)), vh = v[i] / (1 - std::pow(0.999, t));
      pd[i] -= 0.1 * mh / (std::sqrt(vh) + 1e-8);
      // float32 state: a few ulps of the double-precision reference.
      EXPECT_NEAR(p[i], pd[i], 4e-6 * std::abs(pd[i]));
    }
  }
  EXPECT_EQ(adam.steps(), 2);
}

// The gradient driver's second optimiser (engine/optimizer.hpp): rho_t = lr (tau0 + t)^-kappa.
TEST(RobbinsMonro, FirstStepsMatchHandComputation) {
  engine::OptimizerConfig cfg;
  cfg.method = engine::parse_method("robbins-monro");
  cfg.adam.lr = 0.1;
  cfg.adam.weight_decay = 0.5;
  cfg.tau0 = 2;
  cfg.kappa = 0.6;
  engine::Optimizer opt(cfg, 2);
  std::vector<float> p{1.0f, -2.0f};
  std::vector<double> pd{1.0, -2.0};
  const double grads[2][2] = {{0.3, -0.1}, {-0.2, 0.4}};
  for (int t = 1; t <= 2; ++t) {
    std::vector<float> g{static_cast<float>(grads[t - 1][0]), static_cast<float>(grads[t - 1][1])};
    opt.begin_step();
    opt.update(p.data(), g.data(), 0, 2);
    for (int i = 0; i < 2; ++i) {
      pd[i] -= 0.1 * std::pow(2.0 + t, -0.6) * (grads[t - 1][i] + 0.5 * pd[i]);
      EXPECT_NEAR(p[i], pd[i], 4e-6 * std::abs(pd[i]));
    }
  }
  EXPECT_EQ(opt.steps(), 2);
  EXPECT_THROW(engine::parse_method("sgd"), Error);
}

TEST(VaeFixedPoint, SumIsExactAndIndependentOfGrouping) {
  // Eight "micro-block gradients" of very different magnitudes, added in two different groupings
  // (as 1 rank or as 4 ranks of 2 blocks would): the integer totals must be bitwise equal.
  const int n = 1000, blocks = 8;
  std::mt19937_64 gen(3);
  std::normal_distribution<float> z;
  std::vector<std::vector<float>> g(blocks, std::vector<float>(n));
  double mx = 0;
  for (int b = 0; b < blocks; ++b)
    for (int i = 0; i < n; ++i) {
      g[b][i] = z(gen) * std::pow(10.0f, static_cast<float>((i % 7) - 3));
      mx = std::max(mx, static_cast<double>(std::abs(g[b][i])));
    }
  const int e = fixed_point_exponent(mx, blocks);
  std::vector<std::int64_t> one(n, 0);
  for (int b = 0; b < blocks; ++b) add_fixed_point(g[b].data(), n, e, one.data());
  std::vector<std::int64_t> total(n, 0);
  for (int r = 3; r >= 0; --r) {  // "ranks" in reverse order, each with a partial sum
    std::vector<std::int64_t> part(n, 0);
    for (int b = 2 * r + 1; b >= 2 * r; --b) add_fixed_point(g[b].data(), n, e, part.data());
    for (int i = 0; i < n; ++i) total[i] += part[i];
  }
  EXPECT_EQ(one, total);
  std::vector<float> back(n);
  from_fixed_point(one.data(), n, e, 2.0, back.data());
  for (int i = 0; i < n; ++i) {
    double ref = 0;
    for (int b = 0; b < blocks; ++b) ref += g[b][i];
    EXPECT_NEAR(back[i], ref / 2, 1e-6 * std::abs(ref) + 1e-15 * mx) << i;
  }
  // Headroom: the largest value times the number of terms must not overflow int64.
  std::vector<float> big(1, static_cast<float>(mx));
  std::vector<std::int64_t> acc(1, 0);
  for (int b = 0; b < blocks; ++b) add_fixed_point(big.data(), 1, e, acc.data());
  EXPECT_GT(acc[0], 0);
  EXPECT_EQ(fixed_point_exponent(0.0, 4), 0);
}

TEST(VaeFixedPoint, DivergedMaximumHasNoGrid) {
  // A diverged step: the maximum is not finite and no grid exists (exponent 0). add_fixed_point is
  // then never called: the gradient driver stops with "training diverged" (cli.bad_input, "vae
  // train: a diverging --lr").
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(fixed_point_exponent(static_cast<double>(inf), 4), 0);
  EXPECT_EQ(fixed_point_exponent(std::numeric_limits<double>::quiet_NaN(), 4), 0);
  // The largest finite float still has a grid, on which its sum over 4 terms stays below 2^61.
  const float big = std::numeric_limits<float>::max();
  const int e = fixed_point_exponent(static_cast<double>(big), 4);
  std::vector<std::int64_t> acc(1, 0);
  for (int i = 0; i < 4; ++i) add_fixed_point(&big, 1, e, acc.data());
  EXPECT_GT(acc[0], std::int64_t{1} << 60);
  EXPECT_LT(acc[0], std::int64_t{1} << 61);
}

TEST(VaeMath, NormalQuantile) {
  EXPECT_NEAR(normal_quantile(0.975), 1.959963984540054, 1e-13);
  EXPECT_NEAR(normal_quantile(0.5), 0.0, 1e-15);
  for (double p : {1e-10, 1e-4, 0.01, 0.02425, 0.3, 0.77, 0.99, 1 - 1e-7}) {
    const double x = normal_quantile(p);
    EXPECT_NEAR(0.5 * std::erfc(-x / std::numbers::sqrt2), p, 1e-14 + 1e-12 * p) << p;
  }
  EXPECT_THROW(normal_quantile(0.0), Error);
}

// A small problem: two binary prototypes with pixel noise. Adam on the full ELBO must raise it.
TEST(VaeTraining, ElboIncreasesOnASmallProblem) {
  const int d = 16, n = 64, s = 1;
  const Layout layout(Architecture{d, {12}, 2, Likelihood::kBernoulli});
  ParamVec p = xavier_init(layout, 1);
  std::mt19937_64 gen(5);
  std::bernoulli_distribution flip(0.05);
  std::normal_distribution<float> z;
  Mat<float> x(d, n);
  for (int j = 0; j < n; ++j)
    for (int i = 0; i < d; ++i)
      x(i, j) = static_cast<float>(((i < d / 2) == (j % 2 == 0)) ^ flip(gen));
  AdamConfig cfg;
  cfg.lr = 1e-2;
  Adam adam(cfg, layout.n_params);
  Network<float> net(layout);
  std::vector<float> g(p.size());
  Mat<float> eps(2, n * s);
  double first = 0, last = 0;
  for (int it = 0; it < 300; ++it) {
    for (int i = 0; i < eps.size(); ++i) eps.data()[i] = z(gen);
    const double elbo = net.run(p.data(), x, eps, s, g.data()) / n;
    for (float& v : g) v /= n;
    adam.step(p.data(), g.data());
    if (it == 0) first = elbo;
    last = elbo;
  }
  // The start is about -d log 2 = -11.1 nats; two clusters of 5%-noisy bits are worth far more.
  EXPECT_LT(first, -9.0);
  EXPECT_GT(last, -6.0);
}

}  // namespace
}  // namespace caviar::vae
