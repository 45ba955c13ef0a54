#include "models/lda/lda.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <new>

#include "core/error.hpp"
#include "core/parallel.hpp"
#include "core/rng.hpp"
#include "core/vec4.hpp"
#include "math/fast.hpp"

namespace caviar::lda {

namespace fast = math::fast;

using Eigen::VectorXd;

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
  lambda_t_ = RowMatrix::Constant(v_, k_, 1.0);
  refresh();
}

void Model::init_random(std::uint64_t seed) {
  for (int k = 0; k < k_; ++k)
    for (std::int64_t w = 0; w < v_; ++w)
      lambda_t_(w, k) = sample_gamma(seed, static_cast<std::uint32_t>(Stream::kLdaInit),
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
  lambda_t_ = lambda.transpose();
  refresh();
}

namespace {
// Words per block of the threaded word loops below. The column sums are summed block by block in a
// fixed order, so they do not depend on the thread count.
constexpr std::int64_t kWordBlock = 512;
}  // namespace

void Model::refresh_row_sums() {
  // Column sums of the V x K matrix: per block of words (one accumulator per topic, words in
  // order), then the blocks in order.
  const std::int64_t n_blocks = (v_ + kWordBlock - 1) / kWordBlock;
  std::vector<double> part(static_cast<std::size_t>(n_blocks * k_), 0.0);
  parallel_blocks(n_blocks, 1, max_threads(), [&](int, std::int64_t b0, std::int64_t b1) {
    for (std::int64_t b = b0; b < b1; ++b) {
      double* s = part.data() + b * k_;
      for (std::int64_t w = b * kWordBlock; w < std::min(v_, (b + 1) * kWordBlock); ++w) {
        const double* l = &lambda_t_(w, 0);
#pragma omp simd
        for (int k = 0; k < k_; ++k) s[k] += l[k];
      }
    }
  });
  VectorXd sum = VectorXd::Zero(k_);
  for (std::int64_t b = 0; b < n_blocks; ++b)
    for (int k = 0; k < k_; ++k) sum[k] += part[static_cast<std::size_t>(b * k_ + k)];
  psi_row_sum_.resize(k_);
  for (int k = 0; k < k_; ++k) psi_row_sum_[k] = fast::digamma(sum[k]);
  ps_tile_.resize(static_cast<std::size_t>(8 * k_));
  for (int i = 0; i < 8 * k_; ++i) ps_tile_[static_cast<std::size_t>(i)] = psi_row_sum_[i % k_];
}

void Model::refresh_span(const double* lam, double* out, std::int64_t n_words) const {
  // exp(psi(lambda_kw) - psi(sum_w lambda_kw)) for n_words contiguous rows of K. Groups of eight
  // rows are one flat vector loop of 8 K values against ps_tile_ (the K row-sum digammas repeated
  // eight times), so no lane is wasted on K not being a multiple of the vector width.
  // Threads take blocks of words; every value is computed alone, so the thread count changes
  // nothing.
  const std::int64_t group = 8 * k_;
  const double* ps = ps_tile_.data();
  parallel_blocks(n_words, kWordBlock, max_threads(), [&](int, std::int64_t w0, std::int64_t w1) {
    std::int64_t w = w0;
    for (; w + 8 <= w1; w += 8) {
      const double* l = lam + w * k_;
      double* e = out + w * k_;
#pragma omp simd
      for (std::int64_t i = 0; i < group; ++i) e[i] = fast::exp_digamma(l[i], ps[i]);
    }
    const std::int64_t rest = (w1 - w) * k_;
    const double* l = lam + w * k_;
    double* e = out + w * k_;
#pragma omp simd
    for (std::int64_t i = 0; i < rest; ++i) e[i] = fast::exp_digamma(l[i], ps[i]);
  });
}

void Model::refresh() {
  refresh_row_sums();
  exp_elog_beta_t_.resize(v_, k_);
  refresh_span(lambda_t_.data(), exp_elog_beta_t_.data(), v_);
}

void Model::refresh_words(const Corpus& c, std::span<const std::int64_t> docs) {
  // Each value is the same function of lambda as in refresh(), so which words a rank refreshes
  // changes no result. The digammas of the K x V matrix dominate SVI otherwise. The words' rows
  // are gathered into one contiguous block, refreshed there, and scattered back.
  mark_.assign(static_cast<std::size_t>(v_), 0);
  std::int64_t entries = 0;
  for (const auto d : docs) entries += c.indptr[d + 1] - c.indptr[d];
  // One slot more than the distinct words can fill: a repeated word is written at position n
  // (n <= min(entries, V)) and then overwritten.
  words_.resize(static_cast<std::size_t>(std::min(entries, v_) + 1));
  // Without a branch (whether a word was seen is unpredictable): write every word, advance the
  // count only for new ones.
  std::int64_t n = 0;
  char* mark = mark_.data();
  std::int64_t* list = words_.data();
  for (const auto d : docs)
    for (std::int64_t j = c.indptr[d]; j < c.indptr[d + 1]; ++j) {
      const auto w = c.words[j];
      list[n] = w;
      n += 1 - mark[w];
      mark[w] = 1;
    }
  gather_.resize(static_cast<std::size_t>(2 * n * k_));
  double* lam = gather_.data();
  double* out = lam + n * k_;
  for (std::int64_t i = 0; i < n; ++i) {
    const double* src = &lambda_t_(words_[i], 0);
    for (int k = 0; k < k_; ++k) lam[i * k_ + k] = src[k];
  }
  refresh_span(lam, out, n);
  for (std::int64_t i = 0; i < n; ++i) {
    double* dst = &exp_elog_beta_t_(words_[i], 0);
    for (int k = 0; k < k_; ++k) dst[k] = out[i * k_ + k];
  }
}

namespace {

constexpr std::int64_t kLanes = 8;  // padding unit of the document kernels (one AVX-512 vector)

// Eight doubles (GCC/Clang vector extension; one AVX-512 register, two AVX ones): the document
// kernels below keep their partial sums in explicit vectors, so each lane's sum runs in a fixed
// order and the result is the same whatever the compiler's vectorisation choices.
using V8 = Vec8;

inline void store(double* p, V8 v) {
  std::memcpy(p, &v, sizeof v);
}
inline double lane_sum(V8 v) {
  return ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
}

std::int64_t padded(std::int64_t n) {
  return (n + kLanes - 1) / kLanes * kLanes;
}

// n doubles of `store`, 64-byte aligned (the store only grows, so a thread's buffers are reused
// from document to document and call to call without allocation).
double* aligned_doubles(std::vector<double>& store, std::size_t n) {
  if (store.size() < n + 8) store.resize(std::max(n + 8, 2 * store.size()));
  const auto p = reinterpret_cast<std::uintptr_t>(store.data());
  return reinterpret_cast<double*>((p + 63) & ~std::uintptr_t{63});
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
  const int K = k_;
  const int n_threads =
      static_cast<int>(std::min<std::int64_t>(max_threads(), std::max<std::int64_t>(n, 1)));
  // Threads beyond the first accumulate into their own buffers, added after (integer sums, so
  // the result is the same for any number of threads and any assignment of documents to them).
  if (static_cast<int>(work_.size()) < n_threads) work_.resize(static_cast<std::size_t>(n_threads));
  if (stats)
    for (int t = 1; t < n_threads; ++t) {
      auto& w = work_[static_cast<std::size_t>(t)];
      if (static_cast<std::int64_t>(w.stats.size()) != v_ * k_) {
        w.stats.assign(static_cast<std::size_t>(v_ * k_), 0);
        w.mark.assign(static_cast<std::size_t>(v_), 0);
      }
    }
  const double lg_dir_prior = std::lgamma(K * alpha_) - K * std::lgamma(alpha_);
  const double alpha = alpha_;

  // Documents differ in length by orders of magnitude: small blocks handed out dynamically. The
  // result of each document does not depend on its thread.
  parallel_blocks_dynamic(n, 4, n_threads, [&](int tid, std::int64_t i0, std::int64_t i1) {
    Workspace& ws = work_[static_cast<std::size_t>(tid)];
    Workspace* ts = stats && tid > 0 ? &ws : nullptr;  // a thread's own statistics
    std::int64_t* st_base = !stats ? nullptr : ts ? ts->stats.data() : stats->buf_.data();
    const double st_scale = stats ? stats->scale_ : 0.0;
    const std::int64_t kp = padded(K);
    double* vec = aligned_doubles(ws.vec, static_cast<std::size_t>(7 * kp));
    double* g = vec;              // current gamma
    double* gn = vec + kp;        // next gamma
    double* et = vec + 2 * kp;    // exp(E[ln theta])
    double* el = vec + 3 * kp;    // E[ln theta]
    double* acc = vec + 4 * kp;   // sum_w n_w b_wk / norm_w
    double* prev = vec + 5 * kp;  // warm start
    double* lg = vec + 6 * kp;    // lgamma scratch
    for (std::int64_t i = i0; i < i1; ++i) {
      const std::int64_t d = docs[static_cast<std::size_t>(i)];
      const std::int64_t j0 = c.indptr[d], j1 = c.indptr[d + 1];
      const std::int64_t m = j1 - j0;
      auto grow = gamma.row(i);
      if (m == 0) {  // an empty document: q(theta) = prior, no ELBO contribution
        grow.setConstant(alpha);
        doc_terms[static_cast<std::size_t>(i)] = 0;
        continue;
      }
      // exp(E[ln beta_kw]) of the document's words, topic-major (K x mp, words padded to whole
      // vectors with zeros), so that both products of the sweep run along contiguous words
      // without a horizontal sum per word.
      const std::int64_t mp = padded(m);
      double* bt = aligned_doubles(ws.doc, static_cast<std::size_t>((K + 4) * mp));
      double* cnt = bt + K * mp;
      double* norm = cnt + mp;
      double* ratio = norm + mp;
      double* ratio_log = ratio + mp;
      if (ws.offsets.size() < static_cast<std::size_t>(m))
        ws.offsets.resize(static_cast<std::size_t>(m));
      std::int64_t* off = ws.offsets.data();
      for (std::int64_t j = 0; j < m; ++j) {
        off[j] = static_cast<std::int64_t>(c.words[j0 + j]) * K;
        cnt[j] = c.counts[j0 + j];
      }
      for (std::int64_t j = m; j < mp; ++j) cnt[j] = 0;
      // Topic by topic: contiguous stores, loads from the document's rows (in L1 after the
      // first topic).
      const double* eb = exp_elog_beta_t_.data();
      for (int k = 0; k < K; ++k) {
        double* dst = bt + k * mp;
        const double* src = eb + k;
        for (std::int64_t j = 0; j < m; ++j) dst[j] = src[off[j]];
        for (std::int64_t j = m; j < mp; ++j) dst[j] = 0;
      }
      // E[ln theta] and exp(E[ln theta]) at gamma gv (the theta term of the phi update; Blei, Ng &
      // Jordan 2003, section 5.2).
      // E[ln theta] is needed only by the ELBO term (with_log); a sweep needs only
      // exp(E[ln theta]), computed without a logarithm (fast::exp_digamma).
      auto expect = [&](const double* gv, bool with_log) {
        double sum = 0;
        for (int k = 0; k < K; ++k) sum += gv[k];
        const double psi_sum = fast::digamma(sum);
#pragma omp simd
        for (int k = 0; k < K; ++k) et[k] = fast::exp_digamma(gv[k], psi_sum);
        if (with_log) {
#pragma omp simd
          for (int k = 0; k < K; ++k) el[k] = fast::digamma(gv[k]) - psi_sum;
        }
      };
      // norm_w = sum_k etheta_k b_wk and ratio_w = n_w / norm_w, for blocks of 4 x 8 words in
      // registers (four independent chains of K multiply-adds).
      auto normalise = [&] {
        std::int64_t j = 0;
        for (; j + 4 * kLanes <= mp; j += 4 * kLanes) {
          V8 n0{}, n1{}, n2{}, n3{};
          for (int k = 0; k < K; ++k) {
            const double* bk = bt + k * mp + j;
            const V8 e = splat<V8>(et[k]);
            n0 += e * vload<V8>(bk);
            n1 += e * vload<V8>(bk + kLanes);
            n2 += e * vload<V8>(bk + 2 * kLanes);
            n3 += e * vload<V8>(bk + 3 * kLanes);
          }
          store(norm + j, n0);
          store(norm + j + kLanes, n1);
          store(norm + j + 2 * kLanes, n2);
          store(norm + j + 3 * kLanes, n3);
        }
        for (; j < mp; j += kLanes) {
          V8 n0{};
          for (int k = 0; k < K; ++k) n0 += splat<V8>(et[k]) * vload<V8>(bt + k * mp + j);
          store(norm + j, n0);
        }
        const V8 tiny = splat<V8>(1e-100);
        for (j = 0; j < mp; j += kLanes)
          store(ratio + j, vload<V8>(cnt + j) / (vload<V8>(norm + j) + tiny));
      };
      // acc_k = sum_w ratio_w b_wk: four topics at a time, eight words per vector, summed over
      // the lanes in a fixed order at the end.
      auto accumulate = [&] {
        int k = 0;
        for (; k + 4 <= K; k += 4) {
          const double* b0 = bt + k * mp;
          V8 a0{}, a1{}, a2{}, a3{};
          for (std::int64_t j = 0; j < mp; j += kLanes) {
            const V8 r = vload<V8>(ratio + j);
            a0 += r * vload<V8>(b0 + j);
            a1 += r * vload<V8>(b0 + mp + j);
            a2 += r * vload<V8>(b0 + 2 * mp + j);
            a3 += r * vload<V8>(b0 + 3 * mp + j);
          }
          acc[k] = lane_sum(a0);
          acc[k + 1] = lane_sum(a1);
          acc[k + 2] = lane_sum(a2);
          acc[k + 3] = lane_sum(a3);
        }
        for (; k < K; ++k) {
          const double* bk = bt + k * mp;
          V8 a0{};
          for (std::int64_t j = 0; j < mp; j += kLanes)
            a0 += vload<V8>(ratio + j) * vload<V8>(bk + j);
          acc[k] = lane_sum(a0);
        }
      };
      // Fixed point of the phi and gamma updates (Blei, Ng & Jordan 2003, section 5.2; Hoffman,
      // Blei & Bach 2010, Algorithm 1) with phi eliminated: phi_wk ∝ etheta_k b_wk, so
      // gamma_k = alpha + etheta_k sum_w n_w b_wk / (sum_k' etheta_k' b_wk'). Stops at a mean
      // absolute change of gamma below tol (the rule of scikit-learn) or after max_iter sweeps.
      auto iterate = [&](double* gv) {
        for (int it = 0; it < opt.max_iter; ++it) {
          expect(gv, false);
          normalise();
          accumulate();
          double change = 0;
          for (int k = 0; k < K; ++k) {
            gn[k] = alpha + et[k] * acc[k];
            change += std::abs(gn[k] - gv[k]);
          }
          std::copy(gn, gn + K, gv);
          ++ws.sweeps;
          if (change / K < opt.tol) break;
        }
      };
      // The document's ELBO term at gamma with phi optimal (Blei et al. 2003 eq. 15, phi
      // collapsed): sum_w n_w ln sum_k exp(E ln theta_k + E ln beta_kw)
      //   + E[ln p(theta | alpha)] - E[ln q(theta | gamma)].
      // Leaves etheta and ratio = n_w / norm_w at gamma, for the statistics.
      auto evaluate = [&](const double* gv) {
        expect(gv, true);
        normalise();
        // Padding words have n_w = 0 and add nothing.
        for (std::int64_t j = 0; j < mp; ++j) ratio_log[j] = cnt[j] * fast::log(norm[j] + 1e-100);
        V8 t{};
        for (std::int64_t j = 0; j < mp; j += kLanes) t += vload<V8>(ratio_log + j);
        double term = lane_sum(t) + lg_dir_prior;
        double sum = 0;
        for (int k = 0; k < K; ++k) {
          lg[k] = std::lgamma(gv[k]);
          sum += gv[k];
        }
        for (int k = 0; k < K; ++k) term += (alpha - gv[k]) * el[k] + lg[k];
        return term - std::lgamma(sum);
      };
      // Warm: the previous fixed point, kept if a fresh start ends lower (so CAVI never
      // decreases the ELBO), and otherwise refined from itself.
      double f_prev = 0;
      if (warm) {
        for (int k = 0; k < K; ++k) prev[k] = grow[k];
        f_prev = evaluate(prev);
      }
      // A fresh start: gamma_dk ~ Gamma(100, 1/100) keyed by the global document; the top bit
      // keeps these counters apart from the lambda initialisation's.
      const std::uint64_t base = (1ull << 63) | static_cast<std::uint64_t>((c.doc_begin + d) * K);
      for (int k = 0; k < K; ++k)
        g[k] = sample_gamma(seed, static_cast<std::uint32_t>(Stream::kLdaInit), base + k, 100.0) /
               100.0;
      iterate(g);
      double term = evaluate(g);
      if (warm && term < f_prev) {
        std::copy(prev, prev + K, g);
        iterate(g);
        term = evaluate(g);
      }
      for (int k = 0; k < K; ++k) grow[k] = g[k];
      doc_terms[static_cast<std::size_t>(i)] = term;
      if (st_base) {
        // Expected counts n_w phi_wk = ratio_w etheta_k b_wk, rounded half up (the addend is
        // >= 0: a plain conversion, much cheaper than llround) into the word's contiguous row.
        for (std::int64_t j = 0; j < m; ++j) {
          const std::int64_t w = c.words[j0 + j];
          const double r = ratio[j] * st_scale;
          const double* b = &exp_elog_beta_t_(w, 0);
          std::int64_t* out = st_base + w * K;
#pragma omp simd
          for (int k = 0; k < K; ++k) out[k] += static_cast<std::int64_t>(r * et[k] * b[k] + 0.5);
          if (ts && !ts->mark[w]) {
            ts->mark[w] = 1;
            ts->touched.push_back(w);
          }
        }
      }
    }
  });
  if (stats)
    for (int tid = 1; tid < n_threads; ++tid) {
      auto& t = work_[static_cast<std::size_t>(tid)];
      for (const auto w : t.touched) {
        std::int64_t* out = stats->row(w);
        std::int64_t* in = t.stats.data() + w * K;
        for (int k = 0; k < K; ++k) {
          out[k] += in[k];
          in[k] = 0;
        }
        t.mark[w] = 0;
      }
      t.touched.clear();
    }
  std::int64_t total = 0;
  for (int t = 0; t < n_threads; ++t) {
    total += work_[static_cast<std::size_t>(t)].sweeps;
    work_[static_cast<std::size_t>(t)].sweeps = 0;
  }
  return total;
}

void Model::update(const Stats& s) {
  const double inv = 1.0 / s.scale();
  for (std::int64_t w = 0; w < v_; ++w) {
    const std::int64_t* in = s.row(w);
    double* l = &lambda_t_(w, 0);
    for (int k = 0; k < k_; ++k) l[k] = eta_ + static_cast<double>(in[k]) * inv;
  }
  refresh();
}

void Model::update_stochastic(const Stats& s, double rho, double scale, bool refresh_all) {
  const double f = rho * scale / s.scale(), keep = 1.0 - rho, base = rho * eta_;
  parallel_blocks(v_, kWordBlock, max_threads(), [&](int, std::int64_t w0, std::int64_t w1) {
    const std::int64_t* in = s.row(w0);
    double* l = &lambda_t_(w0, 0);
    const std::int64_t n = (w1 - w0) * k_;
#pragma omp simd
    for (std::int64_t i = 0; i < n; ++i)
      l[i] = keep * l[i] + (base + f * static_cast<double>(in[i]));
  });
  if (refresh_all)
    refresh();
  else
    refresh_row_sums();
}

double Model::global_elbo() const {
  // E[ln p(beta_k)] - E[ln q(beta_k)]
  //   = ln C(eta 1_V) - ln C(lambda_k) + sum_w (eta - lambda_kw) E[ln beta_kw].
  // Summed per topic over words in a fixed order; the K x V lgammas and digammas as flat vector
  // loops over groups of eight words (ps_tile_ holds psi(sum_w lambda_kw) repeated).
  const double lg_prior = std::lgamma(v_ * eta_) - v_ * std::lgamma(eta_);
  const std::int64_t group = 8 * k_;
  std::vector<double> t(static_cast<std::size_t>(group), 0.0);
  const double* ps = ps_tile_.data();
  const double eta = eta_;
  double* tt = t.data();
  std::int64_t w = 0;
  for (; w + 8 <= v_; w += 8) {
    const double* l = &lambda_t_(w, 0);
#pragma omp simd
    for (std::int64_t i = 0; i < group; ++i)
      tt[i] += fast::lgamma(l[i]) + (eta - l[i]) * (fast::digamma(l[i]) - ps[i]);
  }
  const std::int64_t rest = (v_ - w) * k_;
  const double* l = lambda_t_.data() + w * k_;
#pragma omp simd
  for (std::int64_t i = 0; i < rest; ++i)
    tt[i] += fast::lgamma(l[i]) + (eta - l[i]) * (fast::digamma(l[i]) - ps[i]);
  VectorXd sum = VectorXd::Zero(k_);
  for (std::int64_t v = 0; v < v_; ++v)
    for (int k = 0; k < k_; ++k) sum[k] += lambda_t_(v, k);
  double total = 0;
  for (int k = 0; k < k_; ++k) {
    double tk = 0;
    for (int g = 0; g < 8; ++g) tk += t[static_cast<std::size_t>(g * k_ + k)];
    total += lg_prior - std::lgamma(sum[k]) + tk;
  }
  return total;
}

RowMatrix Model::topic_word() const {
  RowMatrix b = lambda();
  for (int k = 0; k < k_; ++k) b.row(k) /= b.row(k).sum();
  return b;
}

void Model::save(engine::StateWriter& w) const {
  const engine::Dims kv{static_cast<std::uint64_t>(k_), static_cast<std::uint64_t>(v_)};
  const RowMatrix lam = lambda();
  w.array("components", std::span<const double>(lam.data(), lam.size()), kv);
  const RowMatrix beta = topic_word();
  w.array("topic_word", std::span<const double>(beta.data(), beta.size()), kv);
  w.attr("alpha", alpha_);
  w.attr("eta", eta_);
  w.attr("n_topics", static_cast<std::int64_t>(k_));
  w.attr("n_words", v_);
}

void Model::load(const engine::StateReader& r) {
  const auto lam =
      r.array("components", {static_cast<std::uint64_t>(k_), static_cast<std::uint64_t>(v_)});
  set_lambda(Eigen::Map<const RowMatrix>(lam.data(), k_, v_));
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
  const RowMatrix beta_t = topic_word().transpose();  // V x K
  // The sums over topics run in index order. Eigen's vectorised sum() and dot() start their
  // packets at the first aligned address, so their rounding would depend on where a row sits in
  // memory: gamma's row d is at d * K doubles, and d is the document's index on its rank.
  const auto k = static_cast<Eigen::Index>(gamma.cols());
  VectorXd theta(k);
  for (std::int64_t d = 0; d < n; ++d) {
    double total = 0;
    for (Eigen::Index t = 0; t < k; ++t) total += gamma(d, t);
    for (Eigen::Index t = 0; t < k; ++t) theta[t] = gamma(d, t) / total;
    double lp = 0, nh = 0;
    for (std::int64_t j = c.indptr[d]; j < c.indptr[d + 1]; ++j) {
      if (held[j] == 0) continue;
      double p = 0;
      for (Eigen::Index t = 0; t < k; ++t) p += beta_t(c.words[j], t) * theta[t];
      lp += held[j] * std::log(p);
      nh += held[j];
    }
    log_prob[d] = lp;
    n_heldout[d] = nh;
  }
}

}  // namespace caviar::lda
