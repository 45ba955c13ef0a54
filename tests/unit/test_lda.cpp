// LDA model-level tests (no MPI, no files): monotone ELBO of batch VB, recovery of known topics
// from corpora drawn from the generative model, and the pieces the drivers rely on.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/parallel.hpp"
#include "core/rng.hpp"
#include "math/special.hpp"
#include "models/lda/lda.hpp"

namespace caviar::lda {
namespace {

struct Synthetic {
  RowMatrix beta;  // K x V true topics
  Corpus corpus;
};

// A corpus from the LDA generative model (Blei et al. 2003, section 3).
Synthetic make_corpus(int k, std::int64_t v, std::int64_t d, int len, double alpha, double eta,
                      std::uint64_t seed) {
  const auto stream = static_cast<std::uint32_t>(Stream::kLdaGenerate);
  Synthetic s;
  s.beta.resize(k, v);
  for (int t = 0; t < k; ++t) {
    for (std::int64_t w = 0; w < v; ++w) s.beta(t, w) = sample_gamma(seed, stream, t * v + w, eta);
    s.beta.row(t) /= s.beta.row(t).sum();
  }
  const CounterRng rng(seed, Stream::kLdaGenerate);
  s.corpus.n_words = v;
  std::vector<double> theta(k);
  for (std::int64_t doc = 0; doc < d; ++doc) {
    double sum = 0;
    for (int t = 0; t < k; ++t) {
      theta[t] = sample_gamma(seed, stream, (1ull << 40) + doc * k + t, alpha);
      sum += theta[t];
    }
    std::vector<double> counts(v, 0.0);
    for (int i = 0; i < len; ++i) {
      const auto u = rng.uniform2((2ull << 40) + doc, i);
      int z = 0;
      for (double acc = theta[0] / sum; acc < u[0] && z < k - 1;) acc += theta[++z] / sum;
      std::int64_t w = 0;
      for (double acc = s.beta(z, 0); acc < u[1] && w < v - 1;) acc += s.beta(z, ++w);
      counts[w] += 1;
    }
    std::vector<std::int32_t> ws;
    std::vector<double> cs;
    for (std::int64_t w = 0; w < v; ++w)
      if (counts[w] > 0) {
        ws.push_back(static_cast<std::int32_t>(w));
        cs.push_back(counts[w]);
      }
    s.corpus.add_doc(ws, cs);
  }
  return s;
}

double hellinger(const RowMatrix& a, int i, const RowMatrix& b, int j) {
  return std::sqrt(0.5 * (a.row(i).array().sqrt() - b.row(j).array().sqrt()).square().sum());
}

// Greedy one-to-one matching of fitted to true topics by Hellinger distance; returns the worst
// matched distance.
double worst_matched_hellinger(const RowMatrix& fit, const RowMatrix& truth) {
  const int k = static_cast<int>(truth.rows());
  std::vector<std::tuple<double, int, int>> pairs;
  for (int i = 0; i < k; ++i)
    for (int j = 0; j < k; ++j) pairs.emplace_back(hellinger(fit, i, truth, j), i, j);
  std::sort(pairs.begin(), pairs.end());
  std::vector<bool> used_f(k), used_t(k);
  double worst = 0;
  int matched = 0;
  for (auto [h, i, j] : pairs) {
    if (used_f[i] || used_t[j]) continue;
    used_f[i] = used_t[j] = true;
    worst = std::max(worst, h);
    ++matched;
  }
  EXPECT_EQ(matched, k);
  return worst;
}

struct CaviRun {
  std::vector<double> elbo;
  Model model;
};

CaviRun run_cavi(const Corpus& c, int k, double alpha, double eta, int iters, std::uint64_t seed,
                 LocalOptions local = {}, bool warm = true) {
  CaviRun r{{}, Model(k, c.n_words, alpha, eta)};
  r.model.init_random(seed);
  std::vector<std::int64_t> docs(c.n_docs());
  std::iota(docs.begin(), docs.end(), 0);
  Stats st(k, c.n_words, fixed_point_scale(c.tokens()));
  RowMatrix gamma;
  std::vector<double> terms(docs.size());
  for (int it = 0; it < iters; ++it) {
    st.set_zero();
    r.model.local_step(c, docs, gamma, warm && it > 0, &st, terms, local);
    r.elbo.push_back(std::accumulate(terms.begin(), terms.end(), 0.0) + r.model.global_elbo());
    r.model.update(st);
  }
  return r;
}

TEST(Lda, BatchElboNeverDecreases) {
  const auto s = make_corpus(4, 60, 200, 50, 0.2, 0.1, 3);
  const auto r = run_cavi(s.corpus, 4, 0.25, 0.25, 40, 11);
  for (std::size_t t = 1; t < r.elbo.size(); ++t)
    EXPECT_GE(r.elbo[t], r.elbo[t - 1] - 1e-9 * std::abs(r.elbo[t])) << "iteration " << t;
  // It must actually move: the first steps gain a lot.
  EXPECT_GT(r.elbo.back() - r.elbo.front(), 100.0);
  // Also with a capped document fixed point (2 sweeps), where each step is far from converged.
  const auto w = run_cavi(s.corpus, 4, 0.25, 0.25, 40, 11, LocalOptions{1e-3, 2}, true);
  for (std::size_t t = 1; t < w.elbo.size(); ++t)
    EXPECT_GE(w.elbo[t], w.elbo[t - 1] - 1e-9 * std::abs(w.elbo[t])) << "iteration " << t;
}

TEST(Lda, BatchRecoversKnownTopics) {
  const int k = 5;
  const auto s = make_corpus(k, 100, 600, 80, 0.1, 0.05, 7);
  const auto r = run_cavi(s.corpus, k, 0.1, 0.05, 80, 1);
  const double worst = worst_matched_hellinger(r.model.topic_word(), s.beta);
  // A random initialisation is far from the truth; the fit must be close to it.
  Model init(k, 100, 0.1, 0.05);
  init.init_random(1);
  EXPECT_GT(worst_matched_hellinger(init.topic_word(), s.beta), 0.5);
  EXPECT_LT(worst, 0.15);
}

TEST(Lda, StochasticRecoversKnownTopics) {
  const int k = 5;
  const auto s = make_corpus(k, 100, 2000, 80, 0.1, 0.05, 9);
  Model m(k, 100, 0.1, 0.05);
  m.init_random(2);
  const std::int64_t d = s.corpus.n_docs(), batch = 100;
  Stats st(k, 100, fixed_point_scale(s.corpus.tokens()));
  RowMatrix gamma;
  int t = 0;
  for (int pass = 0; pass < 10; ++pass) {
    for (std::int64_t b0 = 0; b0 < d; b0 += batch, ++t) {
      std::vector<std::int64_t> docs;
      for (std::int64_t i = b0; i < std::min(d, b0 + batch); ++i) docs.push_back(i);
      std::vector<double> terms(docs.size());
      st.set_zero();
      m.local_step(s.corpus, docs, gamma, false, &st, terms, {});
      m.update_stochastic(st, std::pow(10.0 + t, -0.7), static_cast<double>(d) / docs.size());
    }
  }
  EXPECT_LT(worst_matched_hellinger(m.topic_word(), s.beta), 0.2);
}

TEST(Lda, EmptyDocumentsAreSkipped) {
  auto s = make_corpus(3, 30, 50, 40, 0.2, 0.1, 5);
  Corpus with_empty;
  with_empty.n_words = 30;
  for (std::int64_t d = 0; d < s.corpus.n_docs(); ++d) {
    std::vector<std::int32_t> w(s.corpus.words.begin() + s.corpus.indptr[d],
                                s.corpus.words.begin() + s.corpus.indptr[d + 1]);
    std::vector<double> c(s.corpus.counts.begin() + s.corpus.indptr[d],
                          s.corpus.counts.begin() + s.corpus.indptr[d + 1]);
    with_empty.add_doc(w, c);
  }
  // At the end, so that the other documents keep their global indices (and starting gammas).
  for (int e = 0; e < 9; ++e) with_empty.add_doc({}, {});
  const auto a = run_cavi(s.corpus, 3, 0.3, 0.3, 5, 4);
  const auto b = run_cavi(with_empty, 3, 0.3, 0.3, 5, 4);
  // Same statistics, so the same lambda bit for bit; the ELBO sums differ only in rounding.
  EXPECT_EQ(a.model.lambda(), b.model.lambda());
  EXPECT_NEAR(a.elbo.back(), b.elbo.back(), 1e-9 * std::abs(a.elbo.back()));
}

TEST(Lda, DocumentCompletionSplitsTokensInHalf) {
  // Tokens at positions [start, start + count): the even positions are observed.
  EXPECT_EQ(observed_part(0, 1), 1);
  EXPECT_EQ(observed_part(1, 1), 0);
  EXPECT_EQ(observed_part(0, 4), 2);
  EXPECT_EQ(observed_part(1, 4), 2);
  EXPECT_EQ(observed_part(3, 3), 1);
  EXPECT_EQ(observed_part(2, 3), 2);
  // A model with the true topics predicts held-out halves better than a random one.
  const auto s = make_corpus(4, 80, 300, 60, 0.1, 0.05, 8);
  Model truth(4, 80, 0.1, 0.05), random(4, 80, 0.1, 0.05);
  truth.set_lambda(s.beta * 1000.0);
  random.init_random(3);
  std::vector<double> lp(300), nh(300), lp2(300), nh2(300);
  truth.completion(s.corpus, lp, nh, {});
  random.completion(s.corpus, lp2, nh2, {});
  const double n = std::accumulate(nh.begin(), nh.end(), 0.0);
  EXPECT_EQ(n, std::accumulate(nh2.begin(), nh2.end(), 0.0));
  EXPECT_NEAR(n, 0.5 * s.corpus.tokens(), 0.5 * 300);
  const double perp_truth = std::exp(-std::accumulate(lp.begin(), lp.end(), 0.0) / n);
  const double perp_random = std::exp(-std::accumulate(lp2.begin(), lp2.end(), 0.0) / n);
  EXPECT_LT(perp_truth, 0.7 * perp_random);
  EXPECT_LT(perp_truth, 80.0);  // below the uniform model's perplexity V
}

TEST(Lda, ThreadsDoNotChangeStatistics) {
  // Documents of very different lengths (documents are handed to threads dynamically), K not a
  // multiple of the vector width.
  auto s = make_corpus(3, 40, 120, 30, 0.2, 0.1, 6);
  const auto longer = make_corpus(3, 40, 20, 900, 0.2, 0.1, 7);
  for (std::int64_t d = 0; d < longer.corpus.n_docs(); ++d) {
    const auto j0 = longer.corpus.indptr[d], j1 = longer.corpus.indptr[d + 1];
    s.corpus.add_doc({longer.corpus.words.begin() + j0, longer.corpus.words.begin() + j1},
                     {longer.corpus.counts.begin() + j0, longer.corpus.counts.begin() + j1});
  }
  Model m(3, 40, 0.3, 0.3);
  m.init_random(1);
  std::vector<std::int64_t> docs(s.corpus.n_docs());
  std::iota(docs.begin(), docs.end(), 0);
  std::vector<double> ta(docs.size()), tb(docs.size());
  Stats a(3, 40, fixed_point_scale(s.corpus.tokens())), b = a;
  RowMatrix ga, gb;
  omp_set_num_threads(1);
  const auto sa = m.local_step(s.corpus, docs, ga, false, &a, ta, {});
  omp_set_num_threads(3);
  const auto sb = m.local_step(s.corpus, docs, gb, false, &b, tb, {});
  // Twice: the threads' buffers must be left clean for the next call.
  b.set_zero();
  m.local_step(s.corpus, docs, gb, false, &b, tb, {});
  omp_set_num_threads(1);
  EXPECT_TRUE(std::equal(a.words().begin(), a.words().end(), b.words().begin()));
  EXPECT_EQ(ga, gb);
  EXPECT_EQ(ta, tb);
  EXPECT_EQ(sa, sb);
}

// Whole fits (CAVI with its global ELBO, and SVI steps, whose word loops are threaded too) are the
// same bit for bit at 1 and 3 threads. V = 1100 words: more than two of the 512-word blocks.
TEST(Lda, ThreadsDoNotChangeFits) {
  const auto s = make_corpus(3, 1100, 150, 40, 0.2, 0.1, 12);
  auto fit = [&](int threads) {
    omp_set_num_threads(threads);
    auto r = run_cavi(s.corpus, 3, 0.3, 0.3, 4, 2);
    Model m(3, 1100, 0.3, 0.3);
    m.init_random(5);
    Stats st(3, 1100, fixed_point_scale(s.corpus.tokens()));
    RowMatrix g;
    for (int t = 0; t < 3; ++t) {
      std::vector<std::int64_t> docs;
      for (std::int64_t d = 50 * t; d < 50 * (t + 1); ++d) docs.push_back(d);
      std::vector<double> terms(docs.size());
      st.set_zero();
      m.refresh_words(s.corpus, docs);
      m.local_step(s.corpus, docs, g, false, &st, terms, {});
      m.update_stochastic(st, std::pow(10.0 + t, -0.7), 3.0, false);
    }
    m.refresh();
    omp_set_num_threads(1);
    return std::tuple(r.elbo, r.model.lambda(), m.lambda(), m.global_elbo());
  };
  const auto a = fit(1), b = fit(3);
  EXPECT_EQ(std::get<0>(a), std::get<0>(b));
  EXPECT_EQ(std::get<1>(a), std::get<1>(b));
  EXPECT_EQ(std::get<2>(a), std::get<2>(b));
  EXPECT_EQ(std::get<3>(a), std::get<3>(b));
}

TEST(Lda, GammaSamplerHasTheRightMean) {
  for (double shape : {0.05, 0.5, 3.0, 100.0}) {
    double sum = 0;
    const int n = 20000;
    for (int i = 0; i < n; ++i) sum += sample_gamma(1, 10, i, shape);
    EXPECT_NEAR(sum / n, shape, 4 * std::sqrt(shape / n)) << "shape " << shape;
  }
}

TEST(Lda, RejectsBadParameters) {
  EXPECT_THROW(Model(0, 10, 0.1, 0.1), std::exception);
  EXPECT_THROW(Model(2, 10, -1, 0.1), std::exception);
  Model m(2, 3, 0.1, 0.1);
  RowMatrix bad = RowMatrix::Constant(2, 3, 1.0);
  bad(1, 2) = 0;
  EXPECT_THROW(m.set_lambda(bad), std::exception);
  EXPECT_THROW(m.set_lambda(RowMatrix::Constant(3, 3, 1.0)), std::exception);
}

}  // namespace
}  // namespace caviar::lda
