#include "models/plsa/plsa.hpp"

#include <algorithm>
#include <cmath>

#include "core/error.hpp"
#include "core/parallel.hpp"
#include "core/rng.hpp"

namespace caviar::plsa {

namespace {
// One document's E-step against topic-word rows phi_t (V x K): adds r_wk n_w, summed over the
// document's words, to `next` (K), calls emit(w, r) with the K expected counts of each word, and
// returns the document's log-likelihood sum_w n_w log p(w|d).
template <class Emit>
double e_step(const Corpus& c, std::int64_t d, const RowMatrix& phi_t, const double* theta,
              double* next, std::vector<double>& r, Emit&& emit) {
  const int K = static_cast<int>(phi_t.cols());
  double ll = 0;
  for (std::int64_t j = c.indptr[d]; j < c.indptr[d + 1]; ++j) {
    const double* b = &phi_t(c.words[j], 0);
    double p = 0;
    for (int k = 0; k < K; ++k) p += theta[k] * b[k];
    const double n = c.counts[j];
    ll += n * std::log(p);
    // Probability 0 (folding in a word unseen in training, without smoothing): it cannot inform
    // theta. In a fit every word of the corpus keeps a positive probability (EM never lowers the
    // likelihood), and the log-likelihood above is -inf if it ever did not.
    if (!(p > 0)) continue;
    const double s = n / p;
    for (int k = 0; k < K; ++k) {
      r[k] = theta[k] * b[k] * s;
      next[k] += r[k];
    }
    emit(c.words[j], r.data());
  }
  return ll;
}

// theta <- next / sum(next); an empty document keeps its theta. Returns the mean absolute change.
double normalise_into(const double* next, double* theta, int K) {
  double sum = 0;
  for (int k = 0; k < K; ++k) sum += next[k];
  if (!(sum > 0)) return 0.0;
  double change = 0;
  for (int k = 0; k < K; ++k) {
    const double t = next[k] / sum;
    change += std::abs(t - theta[k]);
    theta[k] = t;
  }
  return change / K;
}
}  // namespace

Model::Model(int n_topics, std::int64_t n_words, const Corpus* corpus, double tokens, double smooth)
    : k_(n_topics),
      v_(n_words),
      corpus_(corpus),
      tokens_(tokens),
      smooth_(smooth),
      phi_t_(n_words, n_topics) {
  if (k_ < 1) throw Error("--topics must be >= 1 (got " + std::to_string(k_) + ")");
  if (!(smooth_ >= 0) || !std::isfinite(smooth_))
    throw Error("--smooth must be a finite number >= 0");
  const std::int64_t n = n_local_rows();
  theta_ = RowMatrix::Constant(n, k_, 1.0 / k_);
  next_ = theta_;
  phi_t_.setConstant(1.0 / static_cast<double>(v_));
}

void Model::init_random(std::uint64_t seed) {
  const CounterRng rng(seed, Stream::kPlsaInit);
  for (int k = 0; k < k_; ++k) {
    double sum = 0;
    for (std::int64_t w = 0; w < v_; ++w) {
      phi_t_(w, k) = rng.uniform2(static_cast<std::uint64_t>(k * v_ + w), 0)[0];
      sum += phi_t_(w, k);
    }
    for (std::int64_t w = 0; w < v_; ++w) phi_t_(w, k) /= sum;
  }
  theta_.setConstant(1.0 / k_);
}

void Model::local_step(Stats& stats, std::span<double> terms) {
  const Corpus& c = *corpus_;
  const std::int64_t n = c.n_docs();
  const int n_threads =
      static_cast<int>(std::min<std::int64_t>(max_threads(), std::max<std::int64_t>(n, 1)));
  // Threads other than the first count into their own tables, added into stats afterwards: the
  // counts are integers, so the totals do not depend on which thread took which document.
  while (static_cast<int>(work_.size()) < n_threads - 1) work_.push_back(make_stats());
  for (int t = 0; t < n_threads - 1; ++t) work_[static_cast<std::size_t>(t)].set_zero();
  parallel_blocks_dynamic(n, 16, n_threads, [&](int tid, std::int64_t d0, std::int64_t d1) {
    Stats& acc = tid == 0 ? stats : work_[static_cast<std::size_t>(tid - 1)];
    std::vector<double> r(static_cast<std::size_t>(k_)), sum(r.size());
    for (std::int64_t d = d0; d < d1; ++d) {
      double* next = &next_(d, 0);
      std::copy_n(&theta_(d, 0), k_, next);  // an empty document keeps its theta
      std::fill(sum.begin(), sum.end(), 0.0);
      terms[static_cast<std::size_t>(d)] =
          e_step(c, d, phi_t_, &theta_(d, 0), sum.data(), r,
                 [&](std::int32_t w, const double* rw) { acc.add(w, rw); });
      normalise_into(sum.data(), next, k_);
    }
  });
  for (int t = 0; t < n_threads - 1; ++t) stats += work_[static_cast<std::size_t>(t)];
}

void Model::update(const Stats& stats) {
  // phi_kw = (S_wk + s) / (sum_w S_wk + V s), with the column totals summed as integers (exact).
  std::vector<std::int64_t> total(static_cast<std::size_t>(k_), 0);
  for (std::int64_t w = 0; w < v_; ++w) {
    const std::int64_t* row = stats.row(w);
    for (int k = 0; k < k_; ++k) total[k] += row[k];
  }
  const double scale = stats.scale();
  for (int k = 0; k < k_; ++k) {
    const double denom = static_cast<double>(total[k]) / scale + static_cast<double>(v_) * smooth_;
    // A topic no token chose (without smoothing) keeps its distribution: no document weighs it.
    if (!(denom > 0)) continue;
    for (std::int64_t w = 0; w < v_; ++w)
      phi_t_(w, k) = (static_cast<double>(stats.row(w)[k]) / scale + smooth_) / denom;
  }
  theta_.swap(next_);
}

double Model::global_objective() const {
  if (smooth_ == 0) return 0.0;
  double s = 0;  // serial, in a fixed order: the same on every rank
  for (std::int64_t w = 0; w < v_; ++w)
    for (int k = 0; k < k_; ++k) s += std::log(phi_t_(w, k));
  return smooth_ * s;
}

void Model::save(engine::StateWriter& w) const {
  const RowMatrix phi = topic_word();
  w.array("topic_word", std::span<const double>(phi.data(), phi.size()),
          {static_cast<std::uint64_t>(k_), static_cast<std::uint64_t>(v_)});
  w.attr("n_topics", static_cast<std::int64_t>(k_));
  w.attr("n_words", v_);
}

void Model::load(const engine::StateReader& r) {
  const std::vector<double> phi =
      r.array("topic_word", {static_cast<std::uint64_t>(k_), static_cast<std::uint64_t>(v_)});
  phi_t_ = Eigen::Map<const RowMatrix>(phi.data(), k_, v_).transpose();
  for (double x : phi)
    if (!(x >= 0 && x <= 1)) throw Error("its topic_word holds a value outside [0, 1]");
}

void Model::completion(const Corpus& c, std::span<double> log_prob, std::span<double> n_heldout,
                       const FoldIn& opt) const {
  const std::int64_t n = c.n_docs();
  parallel_blocks_dynamic(n, 16, max_threads(), [&](int, std::int64_t d0, std::int64_t d1) {
    Corpus obs;  // the observed half of one document
    obs.n_words = c.n_words;
    std::vector<double> theta(static_cast<std::size_t>(k_)), sum(theta.size()), r(theta.size());
    std::vector<double> held;
    for (std::int64_t d = d0; d < d1; ++d) {
      obs.indptr.assign(1, 0);
      obs.words.clear();
      obs.counts.clear();
      held.clear();
      std::int64_t pos = 0;
      for (std::int64_t j = c.indptr[d]; j < c.indptr[d + 1]; ++j) {
        const auto cnt = static_cast<std::int64_t>(c.counts[j]);
        const double o = observed_part(pos, cnt);
        pos += cnt;
        held.push_back(static_cast<double>(cnt) - o);
        if (o > 0) {
          obs.words.push_back(c.words[j]);
          obs.counts.push_back(o);
        }
      }
      obs.indptr.push_back(static_cast<std::int64_t>(obs.words.size()));
      std::fill(theta.begin(), theta.end(), 1.0 / k_);
      for (int it = 0; it < opt.max_iter; ++it) {
        std::fill(sum.begin(), sum.end(), 0.0);
        e_step(obs, 0, phi_t_, theta.data(), sum.data(), r, [](std::int32_t, const double*) {});
        if (normalise_into(sum.data(), theta.data(), k_) < opt.tol) break;
      }
      double lp = 0, nh = 0;
      for (std::int64_t j = c.indptr[d]; j < c.indptr[d + 1]; ++j) {
        const double h = held[static_cast<std::size_t>(j - c.indptr[d])];
        if (h == 0) continue;
        const double* b = &phi_t_(c.words[j], 0);
        double p = 0;
        for (int k = 0; k < k_; ++k) p += theta[k] * b[k];
        lp += h * std::log(p);
        nh += h;
      }
      log_prob[static_cast<std::size_t>(d)] = lp;
      n_heldout[static_cast<std::size_t>(d)] = nh;
    }
  });
}

}  // namespace caviar::plsa
