// Black-box VI's model half: the GLM log joints against finite differences, the Gaussian
// families against dense closed forms and finite differences, and the three gradient estimators
// against the exact ELBO gradient of a Gaussian target.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <numbers>
#include <vector>

#include "core/error.hpp"
#include "core/rng.hpp"
#include "models/bbvi/estimator.hpp"
#include "models/bbvi/family.hpp"
#include "models/bbvi/glm.hpp"
#include "models/bbvi/psis.hpp"

namespace caviar::bbvi {
namespace {

using Eigen::MatrixXd;
using Eigen::VectorXd;
using Vec = std::vector<double>;

Vec normals(std::size_t n, std::uint64_t seed, double scale = 1.0) {
  const CounterRng rng(seed, Stream::kGenerateRows);
  Vec v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = scale * rng.normal2(i, 0)[0];
  return v;
}

// Central differences of f at x.
Vec numeric_grad(const std::function<double(const Vec&)>& f, Vec x, double h = 1e-6) {
  Vec g(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double x0 = x[i];
    x[i] = x0 + h;
    const double fp = f(x);
    x[i] = x0 - h;
    const double fm = f(x);
    x[i] = x0;
    g[i] = (fp - fm) / (2 * h);
  }
  return g;
}

void expect_close(const Vec& a, const Vec& b, double tol) {
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i)
    EXPECT_NEAR(a[i], b[i], tol * (1 + std::abs(b[i]))) << "component " << i;
}

TEST(BbviGlm, GradientsMatchFiniteDifferences) {
  // One row takes its own path for one-output likelihoods (most minibatch groups at large N).
  for (const int n : {9, 1})
    for (Likelihood lik :
         {Likelihood::kLogistic, Likelihood::kLinear, Likelihood::kPoisson, Likelihood::kSoftmax}) {
      const int d = 3;
      const Vec x = normals(n * d, 1);
      Glm m;
      m.likelihood = lik;
      m.features = d;
      m.classes = 4;
      m.noise_sd = 0.7;
      m.prior_scale = 1.3;
      Vec y(n);
      for (int i = 0; i < n; ++i)
        y[i] = lik == Likelihood::kLinear    ? 0.3 * i - 1
               : lik == Likelihood::kSoftmax ? i % 4
                                             : i % 2 + (lik == Likelihood::kPoisson ? i / 3 : 0);
      m.check_responses(y, 0);
      const Vec theta = normals(static_cast<std::size_t>(m.n_params()), 2, 0.5);
      Vec g(theta.size(), 0.0);
      m.loglik(theta, x, y, g);
      m.log_prior(theta, g);
      const auto f = [&](const Vec& t) {
        Vec scratch(t.size(), 0.0);
        return m.loglik(t, x, y, scratch) + m.log_prior(t, scratch);
      };
      SCOPED_TRACE(to_string(lik) + ", " + std::to_string(n) + " rows");
      expect_close(g, numeric_grad(f, theta), 1e-6);
    }
}

Glm test_glm(Likelihood lik, int d) {
  Glm m;
  m.likelihood = lik;
  m.features = d;
  m.classes = 3;
  m.noise_sd = 0.7;
  return m;
}

Vec test_responses(Likelihood lik, int n) {
  Vec y(n);
  for (int i = 0; i < n; ++i)
    y[i] = lik == Likelihood::kLinear ? 0.1 * i - 2 : lik == Likelihood::kSoftmax ? i % 3 : i % 2;
  return y;
}

TEST(BbviGlm, DrawsAtOnceEqualOneByOneAndIgnoreAlignment) {
  for (const int n : {37, 1})
    for (Likelihood lik :
         {Likelihood::kLogistic, Likelihood::kLinear, Likelihood::kPoisson, Likelihood::kSoftmax}) {
      const int d = 5, samples = 3;
      const Vec x = normals(n * d, 12);
      SCOPED_TRACE(to_string(lik) + ", " + std::to_string(n) + " rows");
      const Glm m = test_glm(lik, d);
      const Vec y = test_responses(lik, n);
      const auto p = static_cast<std::size_t>(m.n_params());
      const Vec theta = normals(samples * p, 13, 0.4);
      Vec f(samples, 0.0), g(samples * p, 0.0);
      m.loglik_draws(theta, samples, x, y, f, g);
      // Without the gradient (the ELBO and diagnostic passes): the same log-likelihoods.
      Vec f_only(samples, 0.0);
      m.loglik_draws(theta, samples, x, y, f_only, {});
      EXPECT_EQ(f, f_only);
      for (int s = 0; s < samples; ++s) {
        Vec gs(p, 0.0);
        const double fs = m.loglik({theta.data() + s * p, p}, x, y, gs);
        EXPECT_NEAR(f[s], fs, 1e-12 * std::abs(fs));
        for (std::size_t j = 0; j < p; ++j) EXPECT_NEAR(g[s * p + j], gs[j], 1e-11);
      }
      // The same block one double further into memory: the same bits.
      Vec x2(x.size() + 1), f2(samples, 0.0), g2(g.size(), 0.0);
      std::copy(x.begin(), x.end(), x2.begin() + 1);
      m.loglik_draws(theta, samples, {x2.data() + 1, x.size()}, y, f2, g2);
      EXPECT_EQ(f, f2);
      EXPECT_EQ(g, g2);
      // Into a strided buffer holding garbage (as a minibatch group's tree node does): every
      // value overwritten with the same bits, the gaps between the draws' rows left alone.
      const std::size_t ld = p + 1;
      Vec f3(samples, NAN), g3(samples * ld, -7.0);
      m.loglik_draws(theta, samples, x, y, f3, {g3.data(), g3.size()}, ld);
      EXPECT_EQ(f, f3);
      for (int s = 0; s < samples; ++s) {
        for (std::size_t j = 0; j < p; ++j)
          EXPECT_EQ(g3[s * ld + j], g[s * p + j]) << s << " " << j;
        EXPECT_EQ(g3[s * ld + p], -7.0);
      }
    }
}

TEST(BbviGlm, RowTermsDependOnTheRowAlone) {
  // The draws driver prepares a thread's run of rows at once, and runs depend on the thread
  // split: each row's terms must be the same bits alone, first, last, or anywhere in a run. S = 1
  // and 3 put a row's entries at every place in a vector of four; 9 columns (softmax, S = 3)
  // leave a remainder after the blocks of eight; D = 6 leaves one after the blocks of four.
  for (const int samples : {1, 3, 8})
    for (Likelihood lik :
         {Likelihood::kLogistic, Likelihood::kLinear, Likelihood::kPoisson, Likelihood::kSoftmax}) {
      SCOPED_TRACE(to_string(lik) + ", S = " + std::to_string(samples));
      const int n = 11, d = 6;
      const Glm m = test_glm(lik, d);
      const auto p = static_cast<std::size_t>(m.n_params());
      const auto cols = static_cast<std::size_t>(samples * m.outputs());
      // Large etas too, where the logistic's exp(-|eta|) and log(1 + t) take their far branches.
      const Vec x = normals(n * d, 21, 3.0), y = test_responses(lik, n);
      const Vec theta = normals(samples * p, 22, 0.8);
      Vec lik_all(n * samples), r_all(n * cols);
      m.row_terms(theta, samples, x, y, lik_all.data(), r_all.data());
      for (int first = 0; first < n; ++first)
        for (const int len : {1, 2, 5}) {
          if (first + len > n) continue;
          Vec l(len * samples), r(len * cols);
          m.row_terms(theta, samples, {x.data() + first * d, std::size_t(len * d)},
                      {y.data() + first, std::size_t(len)}, l.data(), r.data());
          for (int i = 0; i < len * samples; ++i)
            ASSERT_EQ(l[i], lik_all[first * samples + i]) << "rows " << first << "+" << len;
          for (std::size_t i = 0; i < len * cols; ++i)
            ASSERT_EQ(r[i], r_all[first * cols + i]) << "rows " << first << "+" << len;
          // A group's gradient from the run's terms equals that of the rows as a block.
          Vec f(samples), g(samples * p), g2(samples * p);
          m.loglik_draws(theta, samples, {x.data() + first * d, std::size_t(len * d)},
                         {y.data() + first, std::size_t(len)}, f, g);
          const std::int64_t one[2] = {first, first + len};
          m.rows_gradient(samples, {x.data() + first * d, std::size_t(len * d)},
                          r_all.data() + first * cols, cols, one, g2);
          ASSERT_EQ(g, g2) << "rows " << first << "+" << len;
          // With the next rows as a second group: the two gradients added, bit for bit.
          if (first + len + 2 > n) continue;
          Vec g3(samples * p), both(samples * p);
          const std::int64_t next[2] = {0, 2}, two[3] = {first, first + len, first + len + 2};
          m.rows_gradient(samples, {x.data() + (first + len) * d, std::size_t(2 * d)},
                          r_all.data() + (first + len) * cols, cols, next, g3);
          m.rows_gradient(samples, {x.data() + first * d, std::size_t((len + 2) * d)},
                          r_all.data() + first * cols, cols, two, both);
          for (std::size_t j = 0; j < both.size(); ++j)
            ASSERT_EQ(both[j], g[j] + g3[j]) << "rows " << first << "+" << len << " and 2, " << j;
        }
    }
}

TEST(BbviGlm, GroupsAddAsTheSumTree) {
  // rows_gradient over 2^l groups (the draws driver's node of a subtree) equals each group's
  // gradient alone added pairwise: node (1, i) = group 2i + group 2i + 1, and so on up. Eight
  // groups of 1-3 rows; S = 3 with softmax's 4 classes leaves 12 output rows (a block of eight
  // and one of four), D = 6 a block of four columns and one with the intercept.
  for (Likelihood lik : {Likelihood::kLogistic, Likelihood::kSoftmax}) {
    SCOPED_TRACE(to_string(lik));
    const int d = 6, samples = 3;
    const Glm m = test_glm(lik, d);
    const std::vector<std::int64_t> bounds{5, 6, 8, 11, 12, 13, 15, 16, 19};
    const int n = 19;
    const auto p = static_cast<std::size_t>(m.n_params());
    const auto cols = static_cast<std::size_t>(samples * m.outputs());
    const Vec x = normals(n * d, 31), y = test_responses(lik, n), theta = normals(samples * p, 32);
    Vec lik_all(n * samples), r(n * cols);
    m.row_terms(theta, samples, x, y, lik_all.data(), r.data());
    std::vector<Vec> level;
    for (std::size_t t = 0; t + 1 < bounds.size(); ++t) {
      Vec g(samples * p);
      const std::int64_t b[2] = {bounds[t], bounds[t + 1]};
      m.rows_gradient(samples, {x.data() + bounds[t] * d, std::size_t((b[1] - b[0]) * d)},
                      r.data() + bounds[t] * cols, cols, b, g);
      level.push_back(g);
    }
    while (level.size() > 1) {
      std::vector<Vec> up;
      for (std::size_t i = 0; i < level.size(); i += 2) {
        Vec v(level[i].size());
        for (std::size_t j = 0; j < v.size(); ++j) v[j] = level[i][j] + level[i + 1][j];
        up.push_back(v);
      }
      level = up;
    }
    Vec node(samples * p);
    m.rows_gradient(samples, {x.data() + 5 * d, std::size_t((n - 5) * d)}, r.data() + 5 * cols,
                    cols, bounds, node);
    for (std::size_t j = 0; j < node.size(); ++j) ASSERT_EQ(node[j], level[0][j]) << j;
  }
}

TEST(BbviGlm, HandValues) {
  // One row x = (2), w = 0.5, b = -0.25: eta = 0.75.
  Glm m;
  m.features = 1;
  const Vec x{2.0}, theta{0.5, -0.25};
  Vec g(2, 0.0);
  m.likelihood = Likelihood::kLogistic;
  EXPECT_NEAR(m.loglik(theta, x, Vec{1.0}, g), std::log(1 / (1 + std::exp(-0.75))), 1e-15);
  m.likelihood = Likelihood::kPoisson;
  EXPECT_NEAR(m.loglik(theta, x, Vec{3.0}, g), 3 * 0.75 - std::exp(0.75) - std::log(6.0), 1e-14);
  m.likelihood = Likelihood::kLinear;
  m.noise_sd = 2;
  EXPECT_NEAR(m.loglik(theta, x, Vec{1.0}, g),
              -0.5 * std::log(2 * std::numbers::pi * 4) - 0.0625 / 8, 1e-15);
  // Logistic with a large |eta| stays finite: log sigma(-800) = -800.
  m.likelihood = Likelihood::kLogistic;
  EXPECT_NEAR(m.loglik(Vec{-400, 0}, x, Vec{1.0}, g), -800.0, 1e-12);
}

TEST(BbviGlm, RefusesResponsesTheLikelihoodCannotTake) {
  Glm m;
  m.features = 1;
  m.likelihood = Likelihood::kLogistic;
  EXPECT_THROW(m.check_responses(Vec{0, 1, 2}, 0), Error);
  m.likelihood = Likelihood::kPoisson;
  EXPECT_THROW(m.check_responses(Vec{0, -1}, 0), Error);
  EXPECT_THROW(m.check_responses(Vec{0.5}, 0), Error);
  m.likelihood = Likelihood::kSoftmax;
  m.classes = 3;
  EXPECT_THROW(m.check_responses(Vec{3}, 0), Error);
  m.likelihood = Likelihood::kLinear;
  EXPECT_THROW(m.check_responses(Vec{NAN}, 0), Error);
  EXPECT_NO_THROW(m.check_responses(Vec{-3.5, 2.0}, 0));
}

TEST(BbviGlm, NamesTheFirstBadResponseRow) {
  Glm m;
  m.features = 1;
  const auto message = [&](const Vec& y, std::int64_t first_row) {
    try {
      m.check_responses(y, first_row);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  m.likelihood = Likelihood::kLogistic;
  EXPECT_EQ(message(Vec{0, 1, 2, 3}, 10),
            "response row 12 is not a 0/1 label (logistic regression)");
  EXPECT_EQ(message(Vec{1, NAN}, 0), "response row 1 is not finite");
  m.likelihood = Likelihood::kPoisson;
  EXPECT_EQ(message(Vec{4, 0.5}, 7),
            "response row 8 is not a non-negative integer count (Poisson regression)");
  m.likelihood = Likelihood::kSoftmax;
  m.classes = 3;
  EXPECT_EQ(message(Vec{0, 2, 3}, 0),
            "response row 2 is not a class label in [0, 3) (softmax regression)");
  m.likelihood = Likelihood::kLinear;
  EXPECT_EQ(message(Vec{1, 2, INFINITY}, 5), "response row 7 is not finite");
}

class BbviFamily : public ::testing::TestWithParam<FamilyKind> {
 protected:
  static constexpr int kP = 5;  // odd: the full-rank draw's last row has no partner
  Family q{GetParam(), kP, 2};
  Vec lambda() const {
    // A start, then moved away from it so that mu != 0 and the factors are not diagonal.
    Vec l(static_cast<std::size_t>(q.n_params()));
    q.init(l, 0.8, 3);
    const Vec bump = normals(l.size(), 4, 0.3);
    for (std::size_t i = 0; i < l.size(); ++i) l[i] += bump[i];
    return l;
  }
};

double dense_log_density(const VectorXd& x, const VectorXd& mu, const MatrixXd& cov) {
  const Eigen::LLT<MatrixXd> llt(cov);
  const VectorXd z = llt.matrixL().solve(x - mu);
  double logdet = 0;
  for (int i = 0; i < cov.rows(); ++i) logdet += 2 * std::log(llt.matrixL()(i, i));
  return -0.5 * (cov.rows() * std::log(2 * std::numbers::pi) + logdet + z.squaredNorm());
}

TEST_P(BbviFamily, DensityAndEntropyMatchTheDenseGaussian) {
  const Vec l = lambda();
  const MatrixXd cov = q.covariance(l);
  const Vec eps = normals(static_cast<std::size_t>(q.n_noise()), 5);
  Vec theta(kP);
  q.draw(l, eps, theta);
  EXPECT_NEAR(q.log_q(l, theta),
              dense_log_density(Eigen::Map<const VectorXd>(theta.data(), kP), q.mean(l), cov),
              1e-12);
  const double logdet = Eigen::LLT<MatrixXd>(cov).matrixLLT().diagonal().array().log().sum() * 2;
  EXPECT_NEAR(q.entropy(l), 0.5 * (kP * (1 + std::log(2 * std::numbers::pi)) + logdet), 1e-12);
  const VectorXd sd = q.marginal_sd(l);
  for (int i = 0; i < kP; ++i) EXPECT_NEAR(sd[i] * sd[i], cov(i, i), 1e-13);
}

TEST_P(BbviFamily, DrawsHaveTheFamilysMoments) {
  const Vec l = lambda();
  const int n = 100000;
  const RowMatrix eps = draw_noise(7, 0, n, q.n_noise());
  VectorXd sum = VectorXd::Zero(kP);
  MatrixXd sq = MatrixXd::Zero(kP, kP);
  RowMatrix theta(n, kP);
  q.draw(l, {eps.data(), size_t(eps.size())}, {theta.data(), size_t(theta.size())});
  for (int s = 0; s < n; ++s) {
    const VectorXd t = theta.row(s).transpose() - q.mean(l);
    sum += t;
    sq += t * t.transpose();
  }
  const MatrixXd cov = q.covariance(l);
  for (int i = 0; i < kP; ++i) {
    // Standard errors: sd / sqrt(n) for the mean, about sqrt(2) var / sqrt(n) for the variance.
    EXPECT_NEAR(sum[i] / n, 0.0, 5 * std::sqrt(cov(i, i) / n));
    for (int j = 0; j < kP; ++j)
      EXPECT_NEAR(sq(i, j) / n, cov(i, j), 5 * std::sqrt(2.0 * cov(i, i) * cov(j, j) / n));
  }
}

TEST_P(BbviFamily, GradientsMatchFiniteDifferences) {
  const Vec l = lambda();
  const Vec eps = normals(static_cast<std::size_t>(q.n_noise()), 6);
  Vec theta(kP);
  q.draw(l, eps, theta);
  {
    SCOPED_TRACE("score");
    Vec g(l.size(), 0.0);
    q.add_score(l, theta, g);
    expect_close(g, numeric_grad([&](const Vec& v) { return q.log_q(v, theta); }, l), 1e-6);
  }
  {
    SCOPED_TRACE("entropy");
    Vec g(l.size(), 0.0);
    q.add_entropy_grad(l, g);
    expect_close(g, numeric_grad([&](const Vec& v) { return q.entropy(v); }, l), 1e-6);
  }
  {
    // phi(theta) = a . theta + |theta|^2 / 2, so grad phi = a + theta.
    SCOPED_TRACE("reparameterisation");
    const Vec a = normals(kP, 8);
    const auto phi = [&](const Vec& v) {
      Vec t(kP);
      q.draw(v, eps, t);
      double s = 0;
      for (int i = 0; i < kP; ++i) s += a[i] * t[i] + 0.5 * t[i] * t[i];
      return s;
    };
    Vec gt(kP);
    for (int i = 0; i < kP; ++i) gt[i] = a[i] + theta[i];
    Vec g(l.size(), 0.0);
    q.add_reparam_grad(l, eps, gt, g);
    expect_close(g, numeric_grad(phi, l), 1e-6);
  }
  {
    // The same over 11 draws at once (more than one block of the draws' vector lanes): the sum
    // of phi over the draws.
    SCOPED_TRACE("reparameterisation, 11 draws");
    const int s = 11;
    const Vec e = normals(static_cast<std::size_t>(s * q.n_noise()), 9);
    const Vec a = normals(kP, 10);
    const auto phi = [&](const Vec& v) {
      Vec t(static_cast<std::size_t>(s * kP));
      q.draw(v, e, t);
      double sum = 0;
      for (std::size_t i = 0; i < t.size(); ++i) sum += a[i % kP] * t[i] + 0.5 * t[i] * t[i];
      return sum;
    };
    Vec t(static_cast<std::size_t>(s * kP));
    q.draw(l, e, t);
    Vec gt(t.size());
    for (std::size_t i = 0; i < t.size(); ++i) gt[i] = a[i % kP] + t[i];
    Vec g(l.size(), 0.0);
    q.add_reparam_grad(l, e, gt, g);
    expect_close(g, numeric_grad(phi, l), 1e-5);
  }
}

TEST_P(BbviFamily, ABatchOfDrawsIsEachDrawAlone) {
  // Every rank draws a step's S draws together; predict draws them in other batches. A draw's
  // bits must not depend on the batch it is in.
  const Vec l = lambda();
  const int s = 13;
  const Vec e = normals(static_cast<std::size_t>(s * q.n_noise()), 11);
  Vec all(static_cast<std::size_t>(s * kP));
  q.draw(l, e, all);
  for (int k = 0; k < s; ++k) {
    Vec one(kP);
    q.draw(l, {e.data() + std::size_t(k * q.n_noise()), std::size_t(q.n_noise())}, one);
    for (int i = 0; i < kP; ++i) ASSERT_EQ(one[i], all[std::size_t(k * kP + i)]) << k << " " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(All, BbviFamily,
                         ::testing::Values(FamilyKind::kMeanField, FamilyKind::kFullRank,
                                           FamilyKind::kLowRank),
                         [](const ::testing::TestParamInfo<FamilyKind>& p) {
                           return to_string(p.param);
                         });

TEST(BbviFullRank, ReparameterisationGradientIsEachSumOverTheDrawsInOrder) {
  // The full-rank kernel sums over the draws for many entries of L at once, in vector lanes,
  // with lanes past the row's end computed and dropped. Every entry must still be its own sum
  // over k = 0, 1, ... of fused multiply-adds from zero, for every row length: against that sum
  // written out one entry at a time.
  for (const int p : {1, 2, 3, 4, 5, 7, 8, 15, 16, 17, 18, 19, 20, 31, 33, 50}) {
    for (const int s : {1, 3, 8, 11}) {
      const Family q(FamilyKind::kFullRank, p, 0);
      const Vec l = normals(static_cast<std::size_t>(q.n_params()), 40, 0.3);
      const Vec eps = normals(static_cast<std::size_t>(s * q.n_noise()), 41);
      const Vec gt = normals(static_cast<std::size_t>(s * p), 42);
      Vec g(l.size(), 0.0);
      q.add_reparam_grad(l, eps, gt, g);
      const auto at = [&](int k, int i) { return gt[std::size_t(k * p + i)]; };
      for (int i = 0; i < p; ++i) {
        double mu = 0;
        for (int k = 0; k < s; ++k) mu += at(k, i);
        ASSERT_EQ(g[std::size_t(i)], mu) << "p " << p << " s " << s << " mu " << i;
        const std::size_t row = std::size_t(p) + std::size_t(i) * std::size_t(i + 1) / 2;
        for (int j = 0; j <= i; ++j) {
          double sum = 0;
          for (int k = 0; k < s; ++k) sum = std::fma(at(k, i), eps[std::size_t(k * p + j)], sum);
          if (j == i) sum *= std::exp(l[row + std::size_t(i)]);
          ASSERT_EQ(g[row + std::size_t(j)], sum) << "p " << p << " s " << s << " L " << i << j;
        }
      }
    }
  }
}

// Target log p(theta) = c - (theta - m)^T A (theta - m) / 2: E_q log p = c - ((mu - m)^T A
// (mu - m) + tr(A Sigma)) / 2 in closed form, so the exact ELBO gradient is a finite difference
// away. The constant c does not change the gradient, but it does change the score estimator's
// variance, as a log joint summed over many rows does; c = -100 is such a log joint.
struct Quadratic {
  VectorXd m;
  MatrixXd a;
  double c = -100;
  double f(const Vec& t, Vec* g) const {
    const VectorXd d = Eigen::Map<const VectorXd>(t.data(), m.size()) - m;
    const VectorXd ad = a * d;
    if (g)
      for (Eigen::Index i = 0; i < m.size(); ++i) (*g)[i] = -ad[i];
    return c - 0.5 * d.dot(ad);
  }
  double elbo(const Family& q, const Vec& l) const {
    const VectorXd d = q.mean(l) - m;
    return c - 0.5 * (d.dot(a * d) + (a * q.covariance(l)).trace()) + q.entropy(l);
  }
};

struct Moments {
  VectorXd mean, var;
};

Moments estimator_moments(Estimator e, const Family& q, const Vec& l, const Quadratic& t,
                          int samples, int steps) {
  const auto n = static_cast<Eigen::Index>(l.size());
  VectorXd s1 = VectorXd::Zero(n), s2 = VectorXd::Zero(n);
  Vec g(l.size());
  for (int step = 0; step < steps; ++step) {
    Draws d;
    d.eps = draw_noise(11, step, samples, q.n_noise());
    d.theta.resize(samples, q.dim());
    d.grad_theta.resize(samples, q.dim());
    d.f.resize(samples);
    for (int s = 0; s < samples; ++s) {
      Vec th(q.dim()), gt(q.dim());
      q.draw(l, {d.eps.row(s).data(), size_t(d.eps.cols())}, th);
      d.f[s] = t.f(th, &gt);
      for (int i = 0; i < q.dim(); ++i) {
        d.theta(s, i) = th[i];
        d.grad_theta(s, i) = gt[i];
      }
    }
    elbo_gradient(e, q, l, d, g);
    const VectorXd gv = Eigen::Map<const VectorXd>(g.data(), n);
    s1 += gv;
    s2 += gv.cwiseProduct(gv);
  }
  Moments mo;
  mo.mean = s1 / steps;
  mo.var = s2 / steps - mo.mean.cwiseProduct(mo.mean);
  return mo;
}

TEST_P(BbviFamily, EstimatorsAreUnbiasedAndOrderedByVariance) {
  const Vec l = lambda();
  Quadratic t;
  t.m = VectorXd::LinSpaced(kP, -1, 1);
  const MatrixXd r = Eigen::Map<const MatrixXd>(normals(kP * kP, 9).data(), kP, kP);
  t.a = r * r.transpose() / kP + MatrixXd::Identity(kP, kP);
  const Vec exact = numeric_grad([&](const Vec& v) { return t.elbo(q, v); }, l);
  const int samples = 8, steps = 20000;
  double total[3];
  int k = 0;
  for (Estimator e : {Estimator::kScore, Estimator::kScoreCv, Estimator::kReparam}) {
    SCOPED_TRACE(to_string(e));
    const Moments mo = estimator_moments(e, q, l, t, samples, steps);
    for (std::size_t m = 0; m < l.size(); ++m) {
      // Within 5 standard errors of the mean (every estimator is unbiased); 1e-7 absorbs the
      // finite difference.
      const double se = std::sqrt(mo.var[m] / steps);
      EXPECT_NEAR(mo.mean[m], exact[m], 5 * se + 1e-7) << "component " << m;
    }
    total[k++] = mo.var.sum();
  }
  // Ranganath et al. (2014), section 3: control variates lower the score estimator's variance;
  // the reparameterisation gradient has lower variance still.
  std::printf("summed gradient variance (%s, S = %d): score %.4g, score-cv %.4g, reparam %.4g\n",
              to_string(GetParam()).c_str(), samples, total[0], total[1], total[2]);
  EXPECT_GT(total[0], total[1]);
  EXPECT_GT(total[1], total[2]);
}

// Draws from q = N(0, 1) weighed against p = N(0, v): the ratio p/q has a Pareto tail of shape
// k = 1 - 1/v (P(w > t) ~ t^(-1/k)), so k-hat must find it; v = 1 is an exact q.
double k_hat_normal(double v, double shift, int n) {
  const CounterRng rng(21, Stream::kGenerateRows);
  Vec lw(n);
  for (int i = 0; i < n; ++i) {
    const double x = rng.normal2(i, 0)[0];
    lw[i] = -0.5 * (x - shift) * (x - shift) / v - 0.5 * std::log(v) + 0.5 * x * x;
  }
  return pareto_k_hat(lw);
}

TEST(BbviPsis, FindsTheTailShapeOfKnownRatios) {
  // 10^6 draws: a tail of M = 3000, so the standard error of k-hat is about (1 + k) / sqrt(M)
  // = 0.03. The normal ratios reach their Pareto tail slowly (a factor 1 / sqrt(log t)), so
  // k-hat sits a little below k (0.48 and 0.71 when this test was written). scipy.stats'
  // maximum-likelihood generalised Pareto fit to the same tail agreed, checked by hand (0.431
  // where this gave 0.434 at 10^5 draws).
  const int n = 1000000;
  const double k2 = k_hat_normal(2.0, 0, n), k4 = k_hat_normal(4.0, 0, n);
  const double k_close = k_hat_normal(1.0, 0.2, n);
  std::printf("k-hat: v = 2 (k = 0.5) %.3f, v = 4 (k = 0.75) %.3f, shifted exact q %.3f\n", k2, k4,
              k_close);
  EXPECT_NEAR(k2, 0.5, 0.08);
  EXPECT_NEAR(k4, 0.75, 0.08);
  EXPECT_LT(k_close, 0.3);
  // A generalised Pareto sample of shape 0.3 by inversion: its own tail has shape 0.3.
  const CounterRng rng(22, Stream::kGenerateRows);
  Vec lw(n / 10);
  for (int i = 0; i < n / 10; ++i)
    lw[i] = std::log((std::pow(rng.uniform2(i, 0)[0], -0.3) - 1) / 0.3);
  const double k_gpd = pareto_k_hat(lw);
  std::printf("k-hat of a generalised Pareto sample of shape 0.3: %.3f\n", k_gpd);
  EXPECT_NEAR(k_gpd, 0.3, 0.08);
  // Too few draws, or none finite: no estimate.
  EXPECT_TRUE(std::isnan(pareto_k_hat(Vec{1, 2, 3})));
  EXPECT_TRUE(std::isnan(pareto_k_hat(Vec(100, NAN))));
  // Ties only: no tail to fit.
  EXPECT_TRUE(std::isnan(pareto_k_hat(Vec(1000, 3.0))));
  // One draw outweighs every other by e^1000 (a q far from p on a large data set): the tail
  // cannot be represented, and k-hat must say the fit failed (+inf), not "no estimate".
  Vec spread(1000);
  for (int i = 0; i < 1000; ++i) spread[i] = -1000.0 - i;
  spread[17] = 0;
  EXPECT_EQ(pareto_k_hat(spread), std::numeric_limits<double>::infinity());
}

}  // namespace
}  // namespace caviar::bbvi
