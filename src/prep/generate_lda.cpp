#include "prep/generate_lda.hpp"

#include <algorithm>
#include <span>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/partition.hpp"
#include "core/rng.hpp"
#include "io/csr.hpp"
#include "io/h5.hpp"

namespace caviar::lda {

// Counter-RNG indices carry a tag in their top byte so that the different kinds of draws never
// share a counter.

namespace {
constexpr std::uint64_t kTagBeta = 1ull << 56, kTagTheta = 2ull << 56, kTagLength = 3ull << 56,
                        kTagToken = 4ull << 56;
constexpr auto kGen = static_cast<std::uint32_t>(Stream::kLdaGenerate);

// Index of the first cumulative weight above u * total (weights given as a cumulative table).
std::int64_t draw_index(const double* cum, std::int64_t n, double u) {
  const double target = u * cum[n - 1];
  const double* it = std::upper_bound(cum, cum + n, target);
  return std::min<std::int64_t>(it - cum, n - 1);
}
}  // namespace

RowMatrix true_topics(const GenerateOptions& o) {
  RowMatrix beta(o.topics, o.words);
  for (int k = 0; k < o.topics; ++k) {
    for (std::int64_t w = 0; w < o.words; ++w)
      beta(k, w) =
          sample_gamma(o.seed, kGen, kTagBeta | static_cast<std::uint64_t>(k * o.words + w), o.eta);
    beta.row(k) /= beta.row(k).sum();
  }
  return beta;
}

void generate(const Comm& comm, const GenerateOptions& o) {
  if (o.docs < 1 || o.words < 1 || o.topics < 1)
    throw Error("--docs, --words and --topics must be >= 1");
  if (!(o.doc_length >= 1)) throw Error("--doc-length must be >= 1");
  if (!(o.alpha > 0) || !(o.eta > 0)) throw Error("--alpha and --eta must be > 0");
  io::check_output_path(comm, o.out, {});
  if (!o.truth.empty()) io::check_output_path(comm, o.truth, {});
  if (!o.heldout.empty()) io::check_output_path(comm, o.heldout, {});
  if (!o.heldout.empty() && o.heldout_docs < 1) throw Error("--heldout-docs must be >= 1");
  const RowMatrix beta = true_topics(o);
  RowMatrix cum = beta;  // cumulative rows, for inverse-CDF draws
  for (int k = 0; k < o.topics; ++k)
    for (std::int64_t w = 1; w < o.words; ++w) cum(k, w) += cum(k, w - 1);
  const CounterRng rng(o.seed, Stream::kLdaGenerate);
  std::vector<std::string> vocab;
  for (std::int64_t w = 0; w < o.words; ++w)
    vocab.push_back(std::string("w").append(std::to_string(w)));
  // Documents [first, first + count): the training corpus is [0, docs), the held-out one follows.
  auto make = [&](std::int64_t first, std::int64_t count, const std::string& out) {
    const RowRange part = partition_rows(count, comm.size(), comm.rank());
    Corpus local;
    local.doc_begin = first + part.begin;
    local.n_words = o.words;
    std::vector<double> theta(static_cast<std::size_t>(o.topics));
    std::vector<std::int32_t> tokens, words;
    std::vector<double> counts;
    for (std::int64_t d = first + part.begin; d < first + part.end; ++d) {
      const auto ud = static_cast<std::uint64_t>(d);
      double sum = 0;
      for (int k = 0; k < o.topics; ++k) {
        theta[k] = sample_gamma(o.seed, kGen, kTagTheta | (ud * o.topics + k), o.alpha);
        sum += theta[k];
      }
      for (int k = 0; k < o.topics; ++k) theta[k] = (k ? theta[k - 1] : 0) + theta[k] / sum;
      const auto len = static_cast<std::int64_t>(
          0.5 * o.doc_length + rng.uniform2(kTagLength | ud, 0)[0] * o.doc_length);
      tokens.clear();
      for (std::int64_t i = 0; i < len; ++i) {
        const auto u = rng.uniform2(kTagToken | ud, static_cast<std::uint32_t>(i));
        const auto z = draw_index(theta.data(), o.topics, u[0]);
        tokens.push_back(static_cast<std::int32_t>(draw_index(&cum(z, 0), o.words, u[1])));
      }
      std::sort(tokens.begin(), tokens.end());
      words.clear();
      counts.clear();
      for (auto w : tokens) {
        if (!words.empty() && words.back() == w) {
          counts.back() += 1;
        } else {
          words.push_back(w);
          counts.push_back(1);
        }
      }
      local.add_doc(words, counts);
    }
    io::write_corpus(comm, out, local, o.words, vocab);
  };
  make(0, o.docs, o.out);
  if (!o.heldout.empty()) make(o.docs, o.heldout_docs, o.heldout);
  if (!o.truth.empty()) {
    comm.on_root([&] {
      io::FileWriter w(o.truth);
      w.write("topic_word", std::span<const double>(beta.data(), beta.size()),
              {static_cast<std::uint64_t>(o.topics), static_cast<std::uint64_t>(o.words)});
      w.attr("alpha", o.alpha);
      w.attr("eta", o.eta);
      w.attr("seed", static_cast<std::int64_t>(o.seed));
      w.commit();
    });
  }
}

}  // namespace caviar::lda
