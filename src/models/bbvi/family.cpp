#include "models/bbvi/family.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <vector>

#include "core/error.hpp"
#include "core/rng.hpp"
#include "core/vec4.hpp"

namespace caviar::bbvi {
namespace {

using Eigen::MatrixXd;
using Eigen::VectorXd;
using CMap = Eigen::Map<const VectorXd>;
using RowMajor = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

const double kLog2Pi = std::log(2 * std::numbers::pi);

std::int64_t tri(int p) {
  return std::int64_t{p} * (p + 1) / 2;
}
std::int64_t tri_at(int i, int j) {
  return tri(i) + j;
}  // L_ij, j <= i, in row order

// The full-rank factor L from lambda (diagonal stored as log L_ii).
MatrixXd factor(std::span<const double> lambda, int p) {
  MatrixXd l = MatrixXd::Zero(p, p);
  const double* v = lambda.data() + p;
  for (int i = 0; i < p; ++i) {
    for (int j = 0; j < i; ++j) l(i, j) = v[tri_at(i, j)];
    l(i, i) = std::exp(v[tri_at(i, i)]);
  }
  return l;
}

// Sigma = B B^T + C^2 through the Woodbury identity (Golub & Van Loan 2013, section 2.1.4):
//   Sigma^-1 = C^-2 - C^-2 B M^-1 B^T C^-2,  M = I_r + B^T C^-2 B,
//   log det Sigma = sum log c_i^2 + log det M  (matrix determinant lemma),
//   Sigma^-1 B = C^-2 B M^-1.
struct LowRank {
  Eigen::Map<const RowMajor> b;
  VectorXd c2inv;  // 1 / c_i^2
  double log_det_c2 = 0;
  Eigen::LLT<MatrixXd> m;

  LowRank(std::span<const double> lambda, int p, int r) : b(lambda.data() + p, p, r), c2inv(p) {
    const double* logc = lambda.data() + p + std::int64_t{p} * r;
    for (int i = 0; i < p; ++i) {
      c2inv[i] = std::exp(-2 * logc[i]);
      log_det_c2 += 2 * logc[i];
    }
    MatrixXd mm = MatrixXd::Identity(r, r);
    mm.noalias() += b.transpose() * c2inv.asDiagonal() * b;
    m.compute(mm);
  }
  double log_det() const {
    const MatrixXd& f = m.matrixLLT();
    double s = log_det_c2;
    for (int k = 0; k < f.rows(); ++k) s += 2 * std::log(f(k, k));
    return s;
  }
  VectorXd solve(const VectorXd& delta) const {  // Sigma^-1 delta
    const VectorXd u = c2inv.cwiseProduct(delta);
    return u - c2inv.cwiseProduct(b * m.solve(b.transpose() * u));
  }
  MatrixXd sinv_b() const { return c2inv.asDiagonal() * (m.solve(b.transpose())).transpose(); }
  VectorXd sinv_diag(
      const MatrixXd& sb) const {  // diag(Sigma^-1) = c^-2 - c^-2 b_i^T (Sigma^-1 B)_i
    VectorXd d(c2inv.size());
    for (Eigen::Index i = 0; i < d.size(); ++i) d[i] = c2inv[i] * (1 - b.row(i).dot(sb.row(i)));
    return d;
  }
};

}  // namespace

FamilyKind parse_family(const std::string& s) {
  if (s == "meanfield") return FamilyKind::kMeanField;
  if (s == "fullrank") return FamilyKind::kFullRank;
  if (s == "lowrank") return FamilyKind::kLowRank;
  throw Error("--family must be meanfield, fullrank or lowrank, not '" + s + "'");
}

std::string to_string(FamilyKind f) {
  switch (f) {
    case FamilyKind::kMeanField:
      return "meanfield";
    case FamilyKind::kFullRank:
      return "fullrank";
    case FamilyKind::kLowRank:
      return "lowrank";
  }
  return "?";
}

Family::Family(FamilyKind kind, int dim, int rank) : kind_(kind), p_(dim), r_(rank) {
  if (dim < 1) throw Error("the variational family needs at least one parameter");
  if (kind == FamilyKind::kLowRank && (rank < 1 || rank > dim))
    throw Error("--rank must be in [1, " + std::to_string(dim) + "] (the number of parameters)");
  if (kind != FamilyKind::kLowRank) r_ = 0;
}

std::int64_t Family::n_params() const {
  switch (kind_) {
    case FamilyKind::kMeanField:
      return 2 * std::int64_t{p_};
    case FamilyKind::kFullRank:
      return p_ + tri(p_);
    case FamilyKind::kLowRank:
      return 2 * std::int64_t{p_} + std::int64_t{p_} * r_;
  }
  return 0;
}

int Family::n_noise() const {
  return kind_ == FamilyKind::kLowRank ? r_ + p_ : p_;
}

void Family::init(std::span<double> lambda, double init_sd, std::uint64_t seed) const {
  std::fill(lambda.begin(), lambda.end(), 0.0);
  const double log_sd = std::log(init_sd);
  double* v = lambda.data() + p_;
  switch (kind_) {
    case FamilyKind::kMeanField:
      for (int i = 0; i < p_; ++i) v[i] = log_sd;
      break;
    case FamilyKind::kFullRank:
      for (int i = 0; i < p_; ++i) v[tri_at(i, i)] = log_sd;
      break;
    case FamilyKind::kLowRank: {
      // Var theta_i = |b_i|^2 + c_i^2 = init_sd^2 with |b_i|^2 about 1e-4 init_sd^2.
      const CounterRng rng(seed, Stream::kBbviInit);
      const std::int64_t nb = std::int64_t{p_} * r_;
      for (std::int64_t k = 0; k < nb; ++k)
        v[k] = 0.01 * init_sd / std::sqrt(double(r_)) * rng.normal2(std::uint64_t(k), 0)[0];
      for (int i = 0; i < p_; ++i) {
        double bb = 0;
        for (int j = 0; j < r_; ++j)
          bb += v[std::int64_t{i} * r_ + j] * v[std::int64_t{i} * r_ + j];
        v[nb + i] = 0.5 * std::log(init_sd * init_sd - bb);
      }
      break;
    }
  }
}

namespace {
// The draws of a row-major S x n matrix side by side: column j of m as row j of the result, its S
// values padded with zeros to `width` (a multiple of 8), for kernels that run over the draws in
// vector lanes.
std::vector<double> draws_side_by_side(std::span<const double> m, std::size_t s, std::size_t n,
                                       std::size_t width) {
  std::vector<double> t(n * width, 0.0);
  for (std::size_t k = 0; k < s; ++k)
    for (std::size_t j = 0; j < n; ++j) t[j * width + k] = m[k * n + j];
  return t;
}
}  // namespace

void Family::draw(std::span<const double> lambda, std::span<const double> eps,
                  std::span<double> theta) const {
  const std::size_t s = theta.size() / static_cast<std::size_t>(p_), p = std::size_t(p_);
  const auto n = static_cast<std::size_t>(n_noise());
  const double* mu = lambda.data();
  const double* v = lambda.data() + p_;
  switch (kind_) {
    case FamilyKind::kMeanField:
      for (std::size_t i = 0; i < p; ++i) {
        const double sd = std::exp(v[i]);
        for (std::size_t k = 0; k < s; ++k) theta[k * p + i] = mu[i] + sd * eps[k * n + i];
      }
      break;
    case FamilyKind::kFullRank: {
      // theta_ki = mu_i + L_ii eps_ki + sum_{j < i} L_ij eps_kj, in this order, for eight draws
      // at once and two rows i, i + 1 at once: four independent chains of fused multiply-adds,
      // which a single chain's latency would otherwise bound.
      const std::size_t w = (s + 7) / 8 * 8;
      const std::vector<double> e = draws_side_by_side(eps, s, n, w);
      for (std::size_t k0 = 0; k0 < w; k0 += 8) {
        const auto at = [&](std::size_t j, int h) { return vload<Vec4>(&e[j * w + k0 + 4 * h]); };
        for (std::size_t i = 0; i < p; i += 2) {
          const bool two = i + 1 < p;
          const double* r0 = v + tri(int(i));
          const double* r1 = two ? v + tri(int(i + 1)) : r0;
          Vec4 a0[2], a1[2];
          const Vec4 l0 = splat<Vec4>(std::exp(r0[i]));
          const Vec4 l1 = splat<Vec4>(two ? std::exp(r1[i + 1]) : 0.0);
          for (int h = 0; h < 2; ++h) {
            a0[h] = vfma(l0, at(i, h), splat<Vec4>(mu[i]));
            a1[h] = two ? vfma(l1, at(i + 1, h), splat<Vec4>(mu[i + 1])) : Vec4{};
          }
          for (std::size_t j = 0; j < i; ++j)
            for (int h = 0; h < 2; ++h) {
              a0[h] = vfma(splat<Vec4>(r0[j]), at(j, h), a0[h]);
              a1[h] = vfma(splat<Vec4>(r1[j]), at(j, h), a1[h]);
            }
          if (two)
            for (int h = 0; h < 2; ++h) a1[h] = vfma(splat<Vec4>(r1[i]), at(i, h), a1[h]);
          for (std::size_t k = k0; k < std::min(s, k0 + 8); ++k) {
            theta[k * p + i] = a0[(k - k0) / 4][(k - k0) % 4];
            if (two) theta[k * p + i + 1] = a1[(k - k0) / 4][(k - k0) % 4];
          }
        }
      }
      break;
    }
    case FamilyKind::kLowRank: {
      const double* logc = v + std::int64_t{p_} * r_;
      for (std::size_t i = 0; i < p; ++i) {
        const double c = std::exp(logc[i]);
        const double* b = v + i * std::size_t(r_);
        for (std::size_t k = 0; k < s; ++k) {
          const double* z = eps.data() + k * n;
          double t = mu[i] + c * z[std::size_t(r_) + i];
          for (int j = 0; j < r_; ++j) t += b[j] * z[j];
          theta[k * p + i] = t;
        }
      }
      break;
    }
  }
}

double Family::log_q(std::span<const double> lambda, std::span<const double> theta) const {
  const VectorXd delta = CMap(theta.data(), p_) - CMap(lambda.data(), p_);
  const double c = -0.5 * p_ * kLog2Pi;
  switch (kind_) {
    case FamilyKind::kMeanField: {
      double s = c;
      for (int i = 0; i < p_; ++i) {
        const double z = delta[i] * std::exp(-lambda[p_ + i]);
        s -= lambda[p_ + i] + 0.5 * z * z;
      }
      return s;
    }
    case FamilyKind::kFullRank: {
      const MatrixXd l = factor(lambda, p_);
      const VectorXd z = l.triangularView<Eigen::Lower>().solve(delta);
      return c - l.diagonal().array().log().sum() - 0.5 * z.squaredNorm();
    }
    case FamilyKind::kLowRank: {
      const LowRank lr(lambda, p_, r_);
      return c - 0.5 * lr.log_det() - 0.5 * delta.dot(lr.solve(delta));
    }
  }
  return 0;
}

double Family::entropy(std::span<const double> lambda) const {
  // H = 0.5 log det(2 pi e Sigma).
  const double c = 0.5 * p_ * (1 + kLog2Pi);
  switch (kind_) {
    case FamilyKind::kMeanField:
      return c + CMap(lambda.data() + p_, p_).sum();
    case FamilyKind::kFullRank: {
      double s = c;
      for (int i = 0; i < p_; ++i) s += lambda[p_ + tri_at(i, i)];
      return s;
    }
    case FamilyKind::kLowRank:
      return c + 0.5 * LowRank(lambda, p_, r_).log_det();
  }
  return 0;
}

void Family::add_score(std::span<const double> lambda, std::span<const double> theta,
                       std::span<double> grad) const {
  const VectorXd delta = CMap(theta.data(), p_) - CMap(lambda.data(), p_);
  double* g = grad.data();
  double* gv = g + p_;
  switch (kind_) {
    case FamilyKind::kMeanField:
      // z = delta / sigma: d/dmu = z / sigma, d/domega = z^2 - 1.
      for (int i = 0; i < p_; ++i) {
        const double inv = std::exp(-lambda[p_ + i]), z = delta[i] * inv;
        g[i] += z * inv;
        gv[i] += z * z - 1;
      }
      break;
    case FamilyKind::kFullRank: {
      // z = L^-1 delta, u = L^-T z: d/dmu = u, d/dL = lower(u z^T) - diag(1 / L_ii); the
      // diagonal is stored as log L_ii, so its entry is L_ii u_i z_i - 1.
      const MatrixXd l = factor(lambda, p_);
      const VectorXd z = l.triangularView<Eigen::Lower>().solve(delta);
      const VectorXd u = l.triangularView<Eigen::Lower>().transpose().solve(z);
      for (int i = 0; i < p_; ++i) {
        g[i] += u[i];
        for (int j = 0; j < i; ++j) gv[tri_at(i, j)] += u[i] * z[j];
        gv[tri_at(i, i)] += l(i, i) * u[i] * z[i] - 1;
      }
      break;
    }
    case FamilyKind::kLowRank: {
      // v = Sigma^-1 delta; d/dSigma = (v v^T - Sigma^-1) / 2, so d/dB = v (v^T B) - Sigma^-1 B
      // and d/dlog c_i = c_i^2 (v_i^2 - (Sigma^-1)_ii).
      const LowRank lr(lambda, p_, r_);
      const VectorXd v = lr.solve(delta);
      const MatrixXd sb = lr.sinv_b();
      const VectorXd sd = lr.sinv_diag(sb);
      const VectorXd vb = lr.b.transpose() * v;
      for (int i = 0; i < p_; ++i) {
        g[i] += v[i];
        for (int j = 0; j < r_; ++j) gv[std::int64_t{i} * r_ + j] += v[i] * vb[j] - sb(i, j);
        gv[std::int64_t{p_} * r_ + i] += (v[i] * v[i] - sd[i]) / lr.c2inv[i];
      }
      break;
    }
  }
}

void Family::add_entropy_grad(std::span<const double> lambda, std::span<double> grad) const {
  double* gv = grad.data() + p_;
  switch (kind_) {
    case FamilyKind::kMeanField:
      for (int i = 0; i < p_; ++i) gv[i] += 1;
      break;
    case FamilyKind::kFullRank:
      for (int i = 0; i < p_; ++i) gv[tri_at(i, i)] += 1;
      break;
    case FamilyKind::kLowRank: {
      // d/dB (0.5 log det Sigma) = Sigma^-1 B; d/dlog c_i = c_i^2 (Sigma^-1)_ii.
      const LowRank lr(lambda, p_, r_);
      const MatrixXd sb = lr.sinv_b();
      const VectorXd sd = lr.sinv_diag(sb);
      for (int i = 0; i < p_; ++i) {
        for (int j = 0; j < r_; ++j) gv[std::int64_t{i} * r_ + j] += sb(i, j);
        gv[std::int64_t{p_} * r_ + i] += sd[i] / lr.c2inv[i];
      }
      break;
    }
  }
}

void Family::add_reparam_grad(std::span<const double> lambda, std::span<const double> eps,
                              std::span<const double> g_theta, std::span<double> grad) const {
  const std::size_t s = g_theta.size() / static_cast<std::size_t>(p_), p = std::size_t(p_);
  const auto n = static_cast<std::size_t>(n_noise());
  double* g = grad.data();
  double* gv = g + p_;
  // Each sum over the draws is taken first (draw 0, 1, ...) and then added to grad; four
  // parameters at a time in vector lanes, the same additions lane by lane.
  std::size_t i0 = 0;
  for (; i0 + 4 <= p; i0 += 4) {
    Vec4 sum{};
    for (std::size_t k = 0; k < s; ++k) sum += vload<Vec4>(&g_theta[k * p + i0]);
    vstore(g + i0, vload<Vec4>(g + i0) + sum);
  }
  for (std::size_t i = i0; i < p; ++i) {
    double sum = 0;
    for (std::size_t k = 0; k < s; ++k) sum += g_theta[k * p + i];
    g[i] += sum;
  }
  switch (kind_) {
    case FamilyKind::kMeanField:
      for (std::size_t i = 0; i < p; ++i) {
        double sum = 0;
        for (std::size_t k = 0; k < s; ++k) sum += g_theta[k * p + i] * eps[k * n + i];
        gv[i] += sum * std::exp(lambda[p + i]);
      }
      break;
    case FamilyKind::kFullRank: {
      // Row i of L: sum_k g_ki eps_kj for j <= i, then L_ii's chain rule through its logarithm
      // on the diagonal. Up to sixteen j at once, in four vectors: independent chains of fused
      // multiply-adds, where one chain would wait on each one's latency. A row's last vector
      // may run past j = i (each lane's sum is its own; the extra lanes are not used), so that
      // only the rows whose vectors would run past eps's row sum j one at a time. Every sum runs
      // over k in the same order in either case.
      std::vector<double> row(p + 16);
      const auto pass = [&]<int NB>(std::size_t i, std::size_t j) {
        Vec4 acc[NB] = {};
        for (std::size_t k = 0; k < s; ++k) {
          const Vec4 gk = splat<Vec4>(g_theta[k * p + i]);
          for (int h = 0; h < NB; ++h)
            acc[h] = vfma(gk, vload<Vec4>(&eps[k * n + j + 4 * std::size_t(h)]), acc[h]);
        }
        for (int h = 0; h < NB; ++h) vstore(&row[j + 4 * std::size_t(h)], acc[h]);
      };
      for (std::size_t i = 0; i < p; ++i) {
        std::size_t j = 0;
        for (; j <= i; j += 16) {
          const std::size_t nb = std::min<std::size_t>(4, (i + 1 - j + 3) / 4);
          if (j + 4 * nb > n) break;
          switch (nb) {
            case 4:
              pass.template operator()<4>(i, j);
              break;
            case 3:
              pass.template operator()<3>(i, j);
              break;
            case 2:
              pass.template operator()<2>(i, j);
              break;
            default:
              pass.template operator()<1>(i, j);
          }
        }
        for (; j <= i; ++j) {
          double acc = 0;
          for (std::size_t k = 0; k < s; ++k)
            acc = std::fma(g_theta[k * p + i], eps[k * n + j], acc);
          row[j] = acc;
        }
        double* out = gv + tri(int(i));
        for (j = 0; j < i; ++j) out[j] += row[j];
        out[i] += row[i] * std::exp(lambda[p + std::size_t(tri_at(int(i), int(i)))]);
      }
      break;
    }
    case FamilyKind::kLowRank: {
      const double* logc = lambda.data() + p_ + std::int64_t{p_} * r_;
      const auto r = std::size_t(r_);
      for (std::size_t i = 0; i < p; ++i) {
        double* out = gv + i * r;
        for (std::size_t j = 0; j < r; ++j) {
          double sum = 0;
          for (std::size_t k = 0; k < s; ++k) sum += g_theta[k * p + i] * eps[k * n + j];
          out[j] += sum;
        }
        double sum = 0;
        for (std::size_t k = 0; k < s; ++k) sum += g_theta[k * p + i] * eps[k * n + r + i];
        gv[p * r + i] += sum * std::exp(logc[i]);
      }
      break;
    }
  }
}

VectorXd Family::mean(std::span<const double> lambda) const {
  return CMap(lambda.data(), p_);
}

VectorXd Family::marginal_sd(std::span<const double> lambda) const {
  VectorXd sd(p_);
  switch (kind_) {
    case FamilyKind::kMeanField:
      sd = CMap(lambda.data() + p_, p_).array().exp();
      break;
    case FamilyKind::kFullRank: {
      const MatrixXd l = factor(lambda, p_);
      sd = l.rowwise().norm();
      break;
    }
    case FamilyKind::kLowRank: {
      const LowRank lr(lambda, p_, r_);
      for (int i = 0; i < p_; ++i) sd[i] = std::sqrt(lr.b.row(i).squaredNorm() + 1 / lr.c2inv[i]);
      break;
    }
  }
  return sd;
}

MatrixXd Family::covariance(std::span<const double> lambda) const {
  switch (kind_) {
    case FamilyKind::kMeanField:
      return CMap(lambda.data() + p_, p_).array().exp().square().matrix().asDiagonal();
    case FamilyKind::kFullRank: {
      const MatrixXd l = factor(lambda, p_);
      return l * l.transpose();
    }
    case FamilyKind::kLowRank: {
      const LowRank lr(lambda, p_, r_);
      MatrixXd s = lr.b * lr.b.transpose();
      s.diagonal() += lr.c2inv.cwiseInverse();
      return s;
    }
  }
  return {};
}

}  // namespace caviar::bbvi
