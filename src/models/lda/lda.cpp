#include "models/lda/lda.hpp"

#include <cmath>
#include <limits>

#include "core/error.hpp"
#include "core/parallel.hpp"
#include "core/rng.hpp"
#include "math/special.hpp"

namespace caviar::lda {

using Eigen::VectorXd;

double fixed_point_scale(double bound) {
  int e = 0;
  std::frexp(std::max(bound, 1.0), &e);  // bound < 2^e
  return std::ldexp(1.0, 61 - e);
}

Stats::Stats(int n_topics, std::int64_t n_words, double scale)
    : k_(n_topics),
      v_(n_words),
      scale_(scale),
      buf_(static_cast<std::size_t>(n_topics * n_words)) {}

void Stats::set_zero() {
  std::fill(buf_.begin(), buf_.end(), std::int64_t{0});
}

Stats& Stats::operator+=(const Stats& o) {
  for (std::size_t i = 0; i < buf_.size(); ++i) buf_[i] += o.buf_[i];
  return *this;
}

Model::Model(int n_topics, std::int64_t n_words, double alpha, double eta)
    : k_(n_topics), v_(n_words), alpha_(alpha), eta_(eta) {
  if (n_topics < 1) throw Error("the number of topics must be >= 1");
  if (n_words < 1) throw Error("the vocabulary is empty");
  if (!(alpha > 0) || !std::isfinite(alpha)) throw Error("--alpha must be > 0");
  if (!(eta > 0) || !std::isfinite(eta)) throw Error("--eta must be > 0");
  lambda_ = RowMatrix::Constant(k_, v_, 1.0);
  refresh();
}

double sample_gamma(std::uint64_t seed, std::uint32_t stream, std::uint64_t index, double shape) {
  const CounterRng rng(seed, static_cast<Stream>(stream));
  double boost = 1.0;
  if (shape < 1.0) {
    // Gamma(a) = Gamma(a + 1) U^(1/a); step 0 is reserved for this uniform.
    boost = std::pow(rng.uniform2(index, 0)[0], 1.0 / shape);
    shape += 1.0;
  }
  const double d = shape - 1.0 / 3.0, c = 1.0 / std::sqrt(9.0 * d);
  for (std::uint32_t attempt = 1;; ++attempt) {
    const double x = rng.normal2(index, 2 * attempt)[0];
    const double u = rng.uniform2(index, 2 * attempt + 1)[0];
    const double t = 1.0 + c * x;
    if (t <= 0) continue;
    const double v = t * t * t;
    if (std::log(u) < 0.5 * x * x + d - d * v + d * std::log(v)) return boost * d * v;
  }
}

void Model::init_random(std::uint64_t seed) {
  for (int k = 0; k < k_; ++k)
    for (std::int64_t w = 0; w < v_; ++w)
      lambda_(k, w) = sample_gamma(seed, static_cast<std::uint32_t>(Stream::kLdaInit),
                                   static_cast<std::uint64_t>(k * v_ + w), 100.0) /
                      100.0;
  doc_seed_ = seed;
  refresh();
}

void Model::set_lambda(RowMatrix lambda) {
  if (lambda.rows() != k_ || lambda.cols() != v_)
    throw Error("topic-word matrix is " + std::to_string(lambda.rows()) + " x " +
                std::to_string(lambda.cols()) + "; expected " + std::to_string(k_) + " x " +
                std::to_string(v_));
  if (!lambda.allFinite() || !(lambda.array() > 0).all())
    throw Error("topic-word matrix (lambda) must have positive finite entries");
  lambda_ = std::move(lambda);
  refresh();
}

void Model::refresh_row_sums() {
  psi_row_sum_.resize(k_);
  for (int k = 0; k < k_; ++k) psi_row_sum_[k] = math::digamma(lambda_.row(k).sum());
}

void Model::refresh() {
  refresh_row_sums();
  exp_elog_beta_t_.resize(v_, k_);
  for (int k = 0; k < k_; ++k)
    for (std::int64_t w = 0; w < v_; ++w)
      exp_elog_beta_t_(w, k) = std::exp(math::digamma(lambda_(k, w)) - psi_row_sum_[k]);
}

void Model::refresh_words(const Corpus& c, std::span<const std::int64_t> docs) {
  // Each value is the same function of lambda as in refresh(), so which words a rank refreshes
  // changes no result. The digammas of the K x V matrix dominate SVI otherwise.
  mark_.assign(static_cast<std::size_t>(v_), 0);
  for (const auto d : docs)
    for (std::int64_t j = c.indptr[d]; j < c.indptr[d + 1]; ++j) {
      const auto w = c.words[j];
      if (mark_[w]) continue;
      mark_[w] = 1;
      for (int k = 0; k < k_; ++k)
        exp_elog_beta_t_(w, k) = std::exp(math::digamma(lambda_(k, w)) - psi_row_sum_[k]);
    }
}

namespace {

// Per-thread scratch of the document fixed point.
struct Scratch {
  RowMatrix b;  // n x K: exp(E[ln beta_kw]) gathered for the document's words
  VectorXd cnt, ratio, etheta, gamma_new, psi;
};

// exp(E[ln theta_k]) = exp(psi(gamma_k) - psi(sum gamma)) (seed eq. 10, first term). Also
// returns E[ln theta] in s.psi.
void expect_log_theta(const Eigen::Ref<const VectorXd>& gamma, Scratch& s) {
  const double psi_sum = math::digamma(gamma.sum());
  s.psi.resize(gamma.size());
  for (Eigen::Index k = 0; k < gamma.size(); ++k) s.psi[k] = math::digamma(gamma[k]) - psi_sum;
  s.etheta = s.psi.array().exp();
}

}  // namespace

std::int64_t Model::local_step(const Corpus& c, std::span<const std::int64_t> docs,
                               RowMatrix& gamma, bool warm, Stats* stats,
                               std::span<double> doc_terms, const LocalOptions& opt) const {
  return local_step_seeded(c, docs, gamma, warm, stats, doc_terms, opt, doc_seed_);
}

std::int64_t Model::local_step_seeded(const Corpus& c, std::span<const std::int64_t> docs,
                                      RowMatrix& gamma, bool warm, Stats* stats,
                                      std::span<double> doc_terms, const LocalOptions& opt,
                                      std::uint64_t seed) const {
  const std::int64_t n = static_cast<std::int64_t>(docs.size());
  if (gamma.rows() != n || gamma.cols() != k_) {
    gamma.resize(n, k_);
    warm = false;
  }
  const int n_threads = max_threads();
  // Threads beyond the first accumulate into their own buffers, added after (integer sums, so
  // the result is the same for any number of threads).
  std::vector<Stats> extra;
  if (stats)
    for (int t = 1; t < n_threads; ++t) extra.emplace_back(k_, v_, stats->scale());
  std::vector<Scratch> scratch(static_cast<std::size_t>(n_threads));
  std::vector<std::int64_t> sweeps(static_cast<std::size_t>(n_threads), 0);
  const double lg_dir_prior = std::lgamma(k_ * alpha_) - k_ * std::lgamma(alpha_);

  parallel_blocks(n, 16, n_threads, [&](int tid, std::int64_t i0, std::int64_t i1) {
    Scratch& s = scratch[static_cast<std::size_t>(tid)];
    Stats* st = !stats ? nullptr : tid == 0 ? stats : &extra[static_cast<std::size_t>(tid - 1)];
    for (std::int64_t i = i0; i < i1; ++i) {
      const std::int64_t d = docs[static_cast<std::size_t>(i)];
      const std::int64_t j0 = c.indptr[d], j1 = c.indptr[d + 1];
      const Eigen::Index m = static_cast<Eigen::Index>(j1 - j0);
      auto g = gamma.row(i);
      if (m == 0) {  // an empty document: q(theta) = prior, no ELBO contribution
        g.setConstant(alpha_);
        doc_terms[static_cast<std::size_t>(i)] = 0;
        continue;
      }
      s.b.resize(m, k_);
      s.cnt.resize(m);
      for (Eigen::Index j = 0; j < m; ++j) {
        s.b.row(j) = exp_elog_beta_t_.row(c.words[j0 + j]);
        s.cnt[j] = c.counts[j0 + j];
      }
      // Fixed point of seed eqs 10-11 with phi eliminated: phi_wk ∝ etheta_k b_wk, so
      // gamma_k = alpha + etheta_k sum_w n_w b_wk / (sum_k' etheta_k' b_wk').
      auto iterate = [&](Eigen::Ref<VectorXd> gv) {
        for (int it = 0; it < opt.max_iter; ++it) {
          expect_log_theta(gv, s);
          s.ratio = s.cnt.array() / ((s.b * s.etheta).array() + 1e-100);
          s.gamma_new = (alpha_ + s.etheta.array() * (s.b.transpose() * s.ratio).array()).matrix();
          const double change = (s.gamma_new - gv).cwiseAbs().mean();
          gv = s.gamma_new;
          ++sweeps[static_cast<std::size_t>(tid)];
          if (change < opt.tol) break;
        }
      };
      // The document's ELBO term at gamma with phi optimal (Blei et al. 2003 eq. 15, phi
      // collapsed): sum_w n_w ln sum_k exp(E ln theta_k + E ln beta_kw)
      //   + E[ln p(theta | alpha)] - E[ln q(theta | gamma)].
      // Leaves etheta and s.ratio = n_w / norm_w at gamma, for the statistics.
      auto evaluate = [&](const VectorXd& gv) {
        expect_log_theta(gv, s);
        s.gamma_new = (s.b * s.etheta).array() + 1e-100;  // norm_w
        s.ratio = s.cnt.array() / s.gamma_new.array();
        double term = (s.cnt.array() * s.gamma_new.array().log()).sum();
        term += lg_dir_prior + ((alpha_ - gv.array()) * s.psi.array()).sum();
        term += gv.unaryExpr([](double x) { return std::lgamma(x); }).sum() - std::lgamma(gv.sum());
        return term;
      };
      // Warm: the previous fixed point, kept if a fresh start ends lower (so CAVI never
      // decreases the ELBO), and otherwise refined from itself.
      VectorXd prev;
      double f_prev = 0;
      if (warm) {
        prev = g.transpose();
        f_prev = evaluate(prev);
      }
      // A fresh start: gamma_dk ~ Gamma(100, 1/100) keyed by the global document; the top bit
      // keeps these counters apart from the lambda initialisation's.
      VectorXd gv(k_);
      const std::uint64_t base = (1ull << 63) | static_cast<std::uint64_t>((c.doc_begin + d) * k_);
      for (int k = 0; k < k_; ++k)
        gv[k] = sample_gamma(seed, static_cast<std::uint32_t>(Stream::kLdaInit), base + k, 100.0) /
                100.0;
      iterate(gv);
      double term = evaluate(gv);
      if (warm && term < f_prev) {
        gv = prev;
        iterate(gv);
        term = evaluate(gv);
      }
      g = gv.transpose();
      doc_terms[static_cast<std::size_t>(i)] = term;
      if (st) {
        for (Eigen::Index j = 0; j < m; ++j) {
          const std::int64_t w = c.words[j0 + j];
          const double r = s.ratio[j];
          for (int k = 0; k < k_; ++k)
            // Round half up (the addend is >= 0): a plain cast, much cheaper than llround.
            st->buf_[static_cast<std::size_t>(k * v_ + w)] +=
                static_cast<std::int64_t>(r * s.etheta[k] * s.b(j, k) * st->scale_ + 0.5);
        }
      }
    }
  });
  for (auto& e : extra) *stats += e;
  std::int64_t total = 0;
  for (auto v : sweeps) total += v;
  return total;
}

void Model::update(const Stats& s) {
  for (int k = 0; k < k_; ++k)
    for (std::int64_t w = 0; w < v_; ++w) lambda_(k, w) = eta_ + s.value(k, w);
  refresh();
}

void Model::update_stochastic(const Stats& s, double rho, double scale, bool refresh_all) {
  for (int k = 0; k < k_; ++k)
    for (std::int64_t w = 0; w < v_; ++w)
      lambda_(k, w) = (1.0 - rho) * lambda_(k, w) + rho * (eta_ + scale * s.value(k, w));
  if (refresh_all)
    refresh();
  else
    refresh_row_sums();
}

double Model::global_elbo() const {
  // E[ln p(beta_k)] - E[ln q(beta_k)]
  //   = ln C(eta 1_V) - ln C(lambda_k) + sum_w (eta - lambda_kw) E[ln beta_kw].
  const double lg_prior = std::lgamma(v_ * eta_) - v_ * std::lgamma(eta_);
  double total = 0;
  for (int k = 0; k < k_; ++k) {
    const double sum = lambda_.row(k).sum();
    const double psi_sum = math::digamma(sum);
    double t = lg_prior - std::lgamma(sum);
    for (std::int64_t w = 0; w < v_; ++w) {
      const double l = lambda_(k, w);
      t += std::lgamma(l) + (eta_ - l) * (math::digamma(l) - psi_sum);
    }
    total += t;
  }
  return total;
}

RowMatrix Model::topic_word() const {
  RowMatrix b = lambda_;
  for (int k = 0; k < k_; ++k) b.row(k) /= b.row(k).sum();
  return b;
}

void Model::completion(const Corpus& c, std::span<double> log_prob, std::span<double> n_heldout,
                       const LocalOptions& opt) const {
  const std::int64_t n = c.n_docs();
  // The observed halves as a corpus of their own.
  Corpus obs;
  obs.n_words = c.n_words;
  obs.doc_begin = c.doc_begin;  // the same starting gammas whatever the rank count
  obs.indptr.reserve(static_cast<std::size_t>(n + 1));
  std::vector<double> held(c.counts.size());
  for (std::int64_t d = 0; d < n; ++d) {
    std::int64_t pos = 0;
    for (std::int64_t j = c.indptr[d]; j < c.indptr[d + 1]; ++j) {
      const auto cnt = static_cast<std::int64_t>(c.counts[j]);
      const double o = observed_part(pos, cnt);
      pos += cnt;
      held[j] = static_cast<double>(cnt) - o;
      if (o > 0) {
        obs.words.push_back(c.words[j]);
        obs.counts.push_back(o);
      }
    }
    obs.indptr.push_back(static_cast<std::int64_t>(obs.words.size()));
  }
  std::vector<std::int64_t> docs(static_cast<std::size_t>(n));
  for (std::int64_t d = 0; d < n; ++d) docs[d] = d;
  RowMatrix gamma;
  std::vector<double> terms(static_cast<std::size_t>(n));
  local_step_seeded(obs, docs, gamma, false, nullptr, terms, opt, 0);
  const RowMatrix beta = topic_word();
  for (std::int64_t d = 0; d < n; ++d) {
    const VectorXd theta = gamma.row(d).transpose() / gamma.row(d).sum();
    double lp = 0, nh = 0;
    for (std::int64_t j = c.indptr[d]; j < c.indptr[d + 1]; ++j) {
      if (held[j] == 0) continue;
      lp += held[j] * std::log(beta.col(c.words[j]).dot(theta));
      nh += held[j];
    }
    log_prob[d] = lp;
    n_heldout[d] = nh;
  }
}

}  // namespace caviar::lda
