#include "models/gmm_gibbs/blocked.hpp"

#include <algorithm>
#include <cmath>

#include "core/error.hpp"
#include "core/exact_sum.hpp"
#include "core/parallel.hpp"
#include "core/partition.hpp"
#include "math/special.hpp"

namespace caviar::gmm_gibbs {
namespace {

using Eigen::MatrixXd;
using Eigen::VectorXd;

// Rows per label block: the engine's fixed block size, so no result depends on the thread count.
constexpr std::int64_t kRows = kBlockRows;

// log N(mu | m0, (beta0 Lambda)^-1) + log W(Lambda | W0, nu0) of one full-covariance component
// (Bishop 2006, eqs. B.37 and B.78 with B.79's normaliser), through the Cholesky factor of Lambda.
double log_normal_wishart(const gmm::Prior& pr, const VectorXd& mu, const MatrixXd& lambda) {
  const int d = static_cast<int>(mu.size());
  const Eigen::LLT<MatrixXd> llt(lambda);
  if (llt.info() != Eigen::Success)
    throw Error("a drawn precision matrix is not positive definite");
  const MatrixXd l = llt.matrixL();
  double logdet = 0;
  for (int j = 0; j < d; ++j) logdet += 2 * std::log(l(j, j));
  const double quad = (l.transpose() * (mu - pr.m0)).squaredNorm();
  const Eigen::LLT<MatrixXd> w0(pr.W0_inv);
  double logdet_w0_inv = 0;
  for (int j = 0; j < d; ++j) logdet_w0_inv += 2 * std::log(MatrixXd(w0.matrixL())(j, j));
  const double trace = (pr.W0_inv.cwiseProduct(lambda)).sum();
  const double normal =
      0.5 * d * (std::log(pr.beta0) - math::kLog2Pi) + 0.5 * logdet - 0.5 * pr.beta0 * quad;
  const double wishart = math::log_wishart_norm(-logdet_w0_inv, pr.nu0, d) +
                         0.5 * (pr.nu0 - d - 1) * logdet - 0.5 * trace;
  return normal + wishart;
}

// The same for the diagonal model: per dimension a 1-D Wishart (a Gamma) on lambda_j and a
// normal on mu_j.
double log_normal_gamma(const gmm::Prior& pr, const VectorXd& mu, const MatrixXd& lambda) {
  double out = 0;
  for (Eigen::Index j = 0; j < mu.size(); ++j) {
    const double lam = lambda(j, 0), w0_inv = pr.W0_inv(j, 0), dm = mu[j] - pr.m0[j];
    out +=
        0.5 * (std::log(pr.beta0) - math::kLog2Pi + std::log(lam)) - 0.5 * pr.beta0 * lam * dm * dm;
    out += math::log_wishart_norm(-std::log(w0_inv), pr.nu0, 1) +
           0.5 * (pr.nu0 - 2) * std::log(lam) - 0.5 * w0_inv * lam;
  }
  return out;
}

}  // namespace

double log_prior_density(const gmm::Prior& prior, gmm::Covariance cov, const Params& p) {
  const int k_n = static_cast<int>(p.weights.size());
  if (prior.weights != gmm::WeightPrior::kDirichlet)
    throw Error("the blocked sampler needs Dirichlet weights");
  // Dirichlet(pi | alpha0): ln C(alpha0) + (alpha0 - 1) sum_k ln pi_k (Bishop 2006, eq. B.16).
  double out = math::log_dirichlet_norm(VectorXd::Constant(k_n, prior.alpha0));
  for (int k = 0; k < k_n; ++k) out += (prior.alpha0 - 1) * std::log(p.weights[k]);
  for (int k = 0; k < k_n; ++k) {
    const VectorXd mu = p.means.row(k).transpose();
    out += cov == gmm::Covariance::kDiag ? log_normal_gamma(prior, mu, p.precision[k])
                                         : log_normal_wishart(prior, mu, p.precision[k]);
  }
  return out;
}

BlockedSampler::BlockedSampler(gmm::Model& model, const gmm::RowMatrix& x, std::int64_t first_row,
                               std::int64_t n_rows, std::vector<int> exponents, std::uint64_t seed)
    : model_(model),
      x_(x),
      first_row_(first_row),
      n_rows_(n_rows),
      exponents_(std::move(exponents)),
      seed_(seed),
      labels_(static_cast<std::size_t>(x.rows()), 0) {
  if (model.prior().weights != gmm::WeightPrior::kDirichlet)
    throw Error("the blocked sampler needs Dirichlet weights");
}

BlockedSampler::Stats BlockedSampler::make_stats() const {
  Stats s{model_.make_stats(), n_rows_};
  s.s.make_exact(exponents_);
  return s;
}

void BlockedSampler::local_step(std::uint64_t sweep, Stats& s, std::span<double> terms) {
  const LabelKernel kernel(params_, model_.covariance());
  parallel_blocks(x_.rows(), kRows, max_threads(), [&](int, std::int64_t r0, std::int64_t r1) {
    const auto n = static_cast<std::size_t>(r1 - r0), b = static_cast<std::size_t>(r0);
    kernel.draw(x_.middleRows(r0, r1 - r0), first_row_ + r0, seed_, sweep,
                std::span(labels_).subspan(b, n), terms.subspan(b, n));
  });
  accumulate_one_hot(model_, x_, labels_, s.s);
}

double BlockedSampler::global_log_density() const {
  return log_prior_density(model_.prior(), model_.covariance(), params_);
}

std::vector<double> BlockedSampler::counts(const Stats& s) const {
  std::vector<double> c(static_cast<std::size_t>(model_.n_components()));
  for (int k = 0; k < model_.n_components(); ++k) c[static_cast<std::size_t>(k)] = s.s.n(k);
  return c;
}

void BlockedSampler::draw(std::uint64_t sweep, const Stats& s) {
  draw(sweep, s.s);
}

void BlockedSampler::draw(std::uint64_t sweep, const gmm::Stats& s) {
  // With one-hot statistics the variational update is the exact conditional posterior
  // (Bishop 2006, eqs. 10.58-10.63 with r_nk in {0, 1}; Bruno 2022, eqs. 2.22-2.31).
  model_.update(s);
  params_ = draw_params(model_.posterior(), model_.covariance(), seed_, sweep);
}

std::vector<BlockedSampler::Part> BlockedSampler::layout() const {
  const auto k = static_cast<std::uint64_t>(model_.n_components());
  const auto d = static_cast<std::uint64_t>(model_.dim());
  const bool diag = model_.covariance() == gmm::Covariance::kDiag;
  return {{"weights", {k}},
          {"means", {k, d}},
          {"covariances", diag ? engine::Dims{k, d} : engine::Dims{k, d, d}}};
}

std::vector<double> BlockedSampler::draw_state() const {
  std::vector<double> out(params_.weights.data(), params_.weights.data() + params_.weights.size());
  out.insert(out.end(), params_.means.data(), params_.means.data() + params_.means.size());
  const int d = model_.dim();
  for (const MatrixXd& lam : params_.precision) {
    // Sigma_k = Lambda_k^-1 through its Cholesky factor (column-major D x D is symmetric, so
    // the order of the copy does not matter).
    const MatrixXd cov = lam.cols() == 1 ? MatrixXd(lam.cwiseInverse())
                                         : MatrixXd(lam.llt().solve(MatrixXd::Identity(d, d)));
    out.insert(out.end(), cov.data(), cov.data() + cov.size());
  }
  return out;
}

void BlockedSampler::log_density(const gmm::RowMatrix& x, std::span<double> out) const {
  const LabelKernel kernel(params_, model_.covariance());
  parallel_blocks(x.rows(), kRows, max_threads(), [&](int, std::int64_t r0, std::int64_t r1) {
    kernel.log_density(x.middleRows(r0, r1 - r0), out.subspan(static_cast<std::size_t>(r0),
                                                              static_cast<std::size_t>(r1 - r0)));
  });
}

void BlockedSampler::save(engine::StateWriter& w) const {
  const auto k = static_cast<std::uint64_t>(model_.n_components());
  const auto d = static_cast<std::uint64_t>(model_.dim());
  w.array("weights", std::span(params_.weights.data(), k), {k});
  w.array("means", std::span(params_.means.data(), k * d), {k, d});
  std::vector<double> prec;
  for (const MatrixXd& m : params_.precision)
    prec.insert(prec.end(), m.data(), m.data() + m.size());
  const bool diag = model_.covariance() == gmm::Covariance::kDiag;
  w.array("precision", prec, diag ? engine::Dims{k, d} : engine::Dims{k, d, d});
}

void BlockedSampler::load(const engine::StateReader& r) {
  const int k_n = model_.n_components(), d = model_.dim();
  const auto k = static_cast<std::uint64_t>(k_n), ud = static_cast<std::uint64_t>(d);
  const bool diag = model_.covariance() == gmm::Covariance::kDiag;
  const std::vector<double> w = r.array("weights", {k});
  const std::vector<double> m = r.array("means", {k, ud});
  const std::vector<double> p =
      r.array("precision", diag ? engine::Dims{k, ud} : engine::Dims{k, ud, ud});
  params_.weights = Eigen::Map<const VectorXd>(w.data(), k_n);
  params_.means = Eigen::Map<const gmm::RowMatrix>(m.data(), k_n, d);
  params_.precision.clear();
  const Eigen::Index per = diag ? d : Eigen::Index(d) * d;
  for (int j = 0; j < k_n; ++j)
    params_.precision.push_back(Eigen::Map<const MatrixXd>(p.data() + j * per, d, diag ? 1 : d));
}

}  // namespace caviar::gmm_gibbs
