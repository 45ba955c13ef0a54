#include "models/gmm_gibbs/collapsed.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.hpp"
#include "core/parallel.hpp"
#include "core/partition.hpp"
#include "core/rng.hpp"
#include "math/special.hpp"

namespace caviar::gmm_gibbs {
namespace {

using Eigen::MatrixXd;
using Eigen::VectorXd;

double logdet_of(const Eigen::LLT<MatrixXd>& llt) {
  double out = 0;
  for (Eigen::Index j = 0; j < llt.matrixLLT().rows(); ++j)
    out += 2 * std::log(llt.matrixLLT()(j, j));
  return out;
}

}  // namespace

CollapsedComponent::CollapsedComponent(double n, double beta, double nu, VectorXd m,
                                       const MatrixXd& w_inv)
    : n_(n), beta_(beta), nu_(nu), m_(std::move(m)), dev_(m_.size()), llt_(w_inv) {
  if (llt_.info() != Eigen::Success)
    throw Error("a posterior scale matrix is not positive definite");
  refresh();
}

double CollapsedComponent::logdet_w_inv() const {
  return logdet_of(llt_);
}

void CollapsedComponent::refresh() {
  // log St normaliser (Bishop 2006, eq. B.68) with precision Lambda = c W, c = v beta/(1 + beta),
  // v = nu + 1 - D (eq. 10.82): log|Lambda| = D log c - log|W^-1|.
  const double d = static_cast<double>(m_.size());
  const double v = nu_ + 1 - d;
  const double c = v * beta_ / (1 + beta_);
  norm_ = std::lgamma(0.5 * (v + d)) - std::lgamma(0.5 * v) -
          0.5 * d * (std::log(v) + math::kLogPi) + 0.5 * (d * std::log(c) - logdet_w_inv());
}

void CollapsedComponent::add(const VectorXd& y) {
  // W^-1 += beta/(beta + 1) (y - m)(y - m)^T, m <- (beta m + y)/(beta + 1), beta and nu + 1.
  dev_ = y - m_;
  llt_.rankUpdate(dev_, beta_ / (beta_ + 1));
  m_ = (beta_ * m_ + y) / (beta_ + 1);
  beta_ += 1;
  nu_ += 1;
  n_ += 1;
  refresh();
}

void CollapsedComponent::remove(const VectorXd& y) {
  // The inverse of add: with beta, m holding y, W^-1 -= beta/(beta - 1) (y - m)(y - m)^T.
  dev_ = y - m_;
  llt_.rankUpdate(dev_, -beta_ / (beta_ - 1));
  if (llt_.info() != Eigen::Success)
    throw Error("a rank-one downdate of a posterior scale lost positive definiteness");
  m_ = (beta_ * m_ - y) / (beta_ - 1);
  beta_ -= 1;
  nu_ -= 1;
  n_ -= 1;
  refresh();
}

double CollapsedComponent::log_predictive(const VectorXd& y, VectorXd& work) const {
  // (y - m)^T Lambda (y - m) = c |L^-1 (y - m)|^2 with L L^T = W^-1: one triangular solve.
  const double d = static_cast<double>(m_.size());
  const double v = nu_ + 1 - d;
  const double c = v * beta_ / (1 + beta_);
  work = y - m_;
  llt_.matrixL().solveInPlace(work);
  return norm_ - 0.5 * (v + d) * std::log1p(c * work.squaredNorm() / v);
}

double CollapsedComponent::log_marginal(double beta0, double nu0, double logdet_w0_inv) const {
  // Murphy 2007, eq. 266: p(X_k) = pi^(-N D/2) (beta0/beta)^(D/2) Gamma_D(nu/2)/Gamma_D(nu0/2)
  // |W0^-1|^(nu0/2) / |W^-1|^(nu/2).
  const int d = static_cast<int>(m_.size());
  return -0.5 * n_ * d * math::kLogPi + 0.5 * d * std::log(beta0 / beta_) +
         math::log_multigamma(0.5 * nu_, d) - math::log_multigamma(0.5 * nu0, d) +
         0.5 * nu0 * logdet_w0_inv - 0.5 * nu_ * logdet_w_inv();
}

CollapsedSampler::CollapsedSampler(gmm::Model& model, const gmm::RowMatrix& x,
                                   std::int64_t first_row, std::int64_t n_rows,
                                   std::vector<int> exponents, std::uint64_t seed,
                                   std::int64_t block_rows)
    : model_(model),
      x_(x),
      first_row_(first_row),
      n_rows_(n_rows),
      block_rows_(block_rows),
      exponents_(std::move(exponents)),
      seed_(seed),
      labels_(static_cast<std::size_t>(x.rows()), 0.0) {
  if (model.prior().weights != gmm::WeightPrior::kDirichlet)
    throw Error("the collapsed sampler needs Dirichlet weights");
  if (model.covariance() != gmm::Covariance::kFull)
    throw Error("the collapsed sampler needs --covariance full");
  logdet_w0_inv_ = logdet_of(Eigen::LLT<MatrixXd>(model.prior().W0_inv));
}

void CollapsedSampler::start(std::span<const std::int64_t> labels, const gmm::Stats& s) {
  std::copy(labels.begin(), labels.end(), labels_.begin());
  set_stats(s);
}

void CollapsedSampler::set_stats(const gmm::Stats& s) {
  stats_.assign(s.buffer().begin(), s.buffer().end());
  // With one-hot statistics the variational update is the exact posterior of each component
  // (Bishop 2006, eqs. 10.58-10.63 with r_nk in {0, 1}).
  model_.update(s);
  const gmm::Posterior& p = model_.posterior();
  comp_.clear();
  for (int k = 0; k < model_.n_components(); ++k)
    comp_.emplace_back(s.n(k), p.beta[k], p.nu[k],
                       VectorXd(p.m.row(k).transpose() - model_.shift()), p.W_inv[k]);
}

CollapsedSampler::Stats CollapsedSampler::make_stats() const {
  Stats s{model_.make_stats(), n_rows_};
  s.s.make_exact(exponents_);
  return s;
}

void CollapsedSampler::sweep_block(std::uint64_t sweep, std::int64_t r0, std::int64_t r1,
                                   std::vector<CollapsedComponent>& comp) {
  const int k_n = model_.n_components();
  const auto step = static_cast<std::uint32_t>(sweep);
  const auto n = static_cast<std::size_t>(r1 - r0);
  // A fresh order of the block's rows (Fisher-Yates), its uniforms keyed by global row.
  std::vector<std::int64_t> order(n);
  for (std::size_t i = 0; i < n; ++i) order[i] = r0 + static_cast<std::int64_t>(i);
  const CounterRng order_rng(seed_, Stream::kGibbsOrder);
  for (std::size_t j = n; j-- > 1;) {
    const double u = order_rng.uniform2(static_cast<std::uint64_t>(first_row_ + r0) + j, step)[0];
    std::swap(order[j], order[std::min(j, static_cast<std::size_t>(u * double(j + 1)))]);
  }
  const CounterRng label_rng(seed_, Stream::kGibbsCollapsedLabels);
  const double alpha0 = model_.prior().alpha0;
  VectorXd y(model_.dim()), work(model_.dim()), logp(k_n);
  for (const std::int64_t r : order) {
    y = x_.row(r).transpose() - model_.shift();
    auto& z = labels_[static_cast<std::size_t>(r)];
    comp[static_cast<std::size_t>(z)].remove(y);
    // Bruno 2022, eqs. 2.37-2.39: (N_k,-n + alpha0) times the predictive of x_n.
    for (int k = 0; k < k_n; ++k)
      logp[k] = std::log(comp[static_cast<std::size_t>(k)].n() + alpha0) +
                comp[static_cast<std::size_t>(k)].log_predictive(y, work);
    // Inverse CDF of the normalised probabilities with one uniform keyed by (global row, sweep).
    const double mx = logp.maxCoeff();
    const VectorXd p = (logp.array() - mx).exp();
    double u = label_rng.uniform2(static_cast<std::uint64_t>(first_row_ + r), step)[0] * p.sum();
    int pick = k_n - 1;
    for (int k = 0; k < k_n; ++k) {
      u -= p[k];
      if (u < 0) {
        pick = k;
        break;
      }
    }
    z = pick;
    comp[static_cast<std::size_t>(pick)].add(y);
  }
}

void CollapsedSampler::local_step(std::uint64_t sweep, Stats& s, std::span<double> terms) {
  std::fill(terms.begin(), terms.end(), 0.0);
  // One copy of the start-of-sweep components per thread, refreshed at each block.
  std::vector<std::vector<CollapsedComponent>> scratch(static_cast<std::size_t>(max_threads()));
  parallel_blocks(x_.rows(), block_rows_, max_threads(),
                  [&](int t, std::int64_t r0, std::int64_t r1) {
                    auto& comp = scratch[static_cast<std::size_t>(t)];
                    comp = comp_;
                    sweep_block(sweep, r0, r1, comp);
                  });
  accumulate_one_hot(model_, x_, labels_, s.s);
}

double CollapsedSampler::global_log_density() const {
  // log p(z) = log Gamma(K alpha0) - log Gamma(N + K alpha0) + sum_k [log Gamma(N_k + alpha0) -
  // log Gamma(alpha0)] (Bruno 2022, eq. 2.36), plus sum_k log p(X_k).
  const gmm::Prior& pr = model_.prior();
  const double k_n = model_.n_components();
  double out = std::lgamma(k_n * pr.alpha0) - std::lgamma(double(n_rows_) + k_n * pr.alpha0);
  for (const CollapsedComponent& c : comp_)
    out += std::lgamma(c.n() + pr.alpha0) - std::lgamma(pr.alpha0) +
           c.log_marginal(pr.beta0, pr.nu0, logdet_w0_inv_);
  return out;
}

std::vector<double> CollapsedSampler::counts(const Stats& s) const {
  std::vector<double> c(static_cast<std::size_t>(model_.n_components()));
  for (int k = 0; k < model_.n_components(); ++k) c[static_cast<std::size_t>(k)] = s.s.n(k);
  return c;
}

void CollapsedSampler::draw(std::uint64_t, const Stats& s) {
  set_stats(s.s);
}

std::vector<CollapsedSampler::Part> CollapsedSampler::layout() const {
  const auto k = static_cast<std::uint64_t>(model_.n_components());
  const auto d = static_cast<std::uint64_t>(model_.dim());
  return {{"counts", {k}}, {"sums", {k, d}}};
}

std::vector<double> CollapsedSampler::draw_state() const {
  const int k_n = model_.n_components(), d = model_.dim();
  gmm::Stats s = model_.make_stats();
  std::copy(stats_.begin(), stats_.end(), s.buffer().begin());
  std::vector<double> out;
  for (int k = 0; k < k_n; ++k) out.push_back(s.n(k));
  // Sums in data coordinates: Sx_k + N_k c.
  for (int k = 0; k < k_n; ++k)
    for (int j = 0; j < d; ++j) out.push_back(s.sx(k)[j] + s.n(k) * model_.shift()[j]);
  return out;
}

void CollapsedSampler::log_density(const gmm::RowMatrix& x, std::span<double> out) const {
  const int k_n = model_.n_components();
  const double alpha0 = model_.prior().alpha0;
  const double log_total = std::log(double(n_rows_) + k_n * alpha0);
  parallel_blocks(x.rows(), kBlockRows, max_threads(), [&](int, std::int64_t r0, std::int64_t r1) {
    VectorXd y(model_.dim()), work(model_.dim()), logp(k_n);
    for (std::int64_t r = r0; r < r1; ++r) {
      y = x.row(r).transpose() - model_.shift();
      for (int k = 0; k < k_n; ++k)
        logp[k] = std::log(comp_[static_cast<std::size_t>(k)].n() + alpha0) - log_total +
                  comp_[static_cast<std::size_t>(k)].log_predictive(y, work);
      out[static_cast<std::size_t>(r)] = math::log_sum_exp(logp);
    }
  });
}

void CollapsedSampler::save(engine::StateWriter& w) const {
  w.array("stats", stats_, {static_cast<std::uint64_t>(stats_.size())});
}

void CollapsedSampler::load(const engine::StateReader& r) {
  gmm::Stats s = model_.make_stats();
  const std::vector<double> v = r.array("stats", {static_cast<std::uint64_t>(s.buffer().size())});
  std::copy(v.begin(), v.end(), s.buffer().begin());
  set_stats(s);
}

std::vector<engine::LocalState> CollapsedSampler::local_states() {
  engine::LocalState l;
  l.name = "labels";
  l.data = labels_.data();
  l.width = 1;
  l.categories = model_.n_components();  // indexes the components: checked on a resume
  return {l};
}

std::vector<std::int64_t> CollapsedSampler::labels() const {
  return {labels_.begin(), labels_.end()};
}

}  // namespace caviar::gmm_gibbs
