#include "models/lda/svi.hpp"

#include <algorithm>
#include <bit>
#include <numeric>
#include <utility>

#include "core/partition.hpp"
#include "core/rng.hpp"

namespace caviar::lda {

SviStats::SviStats(int n_topics, std::int64_t n_words, double scale, ReducedRows* usage)
    : counts_(n_topics, n_words, scale),
      bits_(static_cast<std::size_t>((n_words + 63) / 64), 0),
      usage_(usage) {}

void SviStats::set_zero() {
  for (const auto w : words_) std::fill_n(counts_.row(w), counts_.n_topics(), std::int64_t{0});
  std::fill(bits_.begin(), bits_.end(), std::uint64_t{0});
  words_.clear();
}

void SviStats::add_docs(const Corpus& c, std::span<const std::int64_t> docs) {
  for (const auto d : docs)
    for (std::int64_t j = c.indptr[d]; j < c.indptr[d + 1]; ++j) {
      const auto w = static_cast<std::uint64_t>(c.words[j]);
      bits_[w >> 6] |= std::uint64_t{1} << (w & 63);
    }
}

void SviStats::reduce(const engine::Reducer& r) {
  r.bit_or(bits_);
  words_.clear();
  for (std::size_t i = 0; i < bits_.size(); ++i)
    for (std::uint64_t b = bits_[i]; b; b &= b - 1)
      words_.push_back(static_cast<std::int64_t>(i * 64) + std::countr_zero(b));
  if (r.counts_shared()) {
    usage_->words += static_cast<std::int64_t>(words_.size());
    ++usage_->calls;
  }
  if (r.single()) return;
  const auto k = static_cast<std::size_t>(counts_.n_topics());
  packed_.resize(words_.size() * k);
  for (std::size_t i = 0; i < words_.size(); ++i)
    std::copy_n(counts_.row(words_[i]), k, packed_.data() + i * k);
  r.sum(std::span<std::int64_t>(packed_));
  for (std::size_t i = 0; i < words_.size(); ++i)
    std::copy_n(packed_.data() + i * k, k, counts_.row(words_[i]));
}

SviFit::SviFit(Model& model, const Corpus* corpus, BatchReader read, std::int64_t n_docs,
               double tokens, std::uint64_t seed, const LocalOptions& local)
    : model_(model),
      corpus_(corpus),
      read_(std::move(read)),
      n_docs_(n_docs),
      tokens_(tokens),
      seed_(seed),
      local_(local) {}

SviStats SviFit::make_stats() const {
  return SviStats(model_.n_topics(), model_.n_words(), fixed_point_scale(std::max(tokens_, 1.0)),
                  &usage_);
}

// Documents (in memory) or 256-document blocks (--stream, so that a minibatch is a few runs of
// consecutive documents to read) sorted by a key drawn from (seed, item, pass): the same order
// for any rank count.
std::vector<std::int64_t> SviFit::pass_order(int pass) const {
  const std::int64_t unit = corpus_ ? 1 : kBlockRows, n = (n_docs_ + unit - 1) / unit;
  const CounterRng rng(seed_, Stream::kSviMinibatch);
  std::vector<std::pair<double, std::int64_t>> keys(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i)
    keys[i] = {rng.uniform2(static_cast<std::uint64_t>(i), static_cast<std::uint32_t>(pass))[0], i};
  std::sort(keys.begin(), keys.end());
  std::vector<std::int64_t> order;
  order.reserve(static_cast<std::size_t>(n_docs_));
  for (const auto& [key, b] : keys)
    for (std::int64_t d = b * unit; d < std::min(n_docs_, (b + 1) * unit); ++d) order.push_back(d);
  return order;
}

void SviFit::local_step(Stats& s, std::span<double> terms, std::span<const std::int64_t> rows) {
  if (corpus_) {
    model_.refresh_words(*corpus_, rows);
    sweeps_ += model_.local_step(*corpus_, rows, gamma_, false, &s.counts(), terms, local_);
    s.add_docs(*corpus_, rows);
    return;
  }
  // The step's tokens bound every expected count of this step: its fixed-point scale.
  const double batch_tokens = read_(rows, parts_);
  s.counts().set_scale(fixed_point_scale(std::max(1.0, batch_tokens)));
  std::size_t at = 0;
  for (const Corpus& part : parts_) {
    docs_.resize(static_cast<std::size_t>(part.n_docs()));
    std::iota(docs_.begin(), docs_.end(), std::int64_t{0});
    model_.refresh_words(part, docs_);
    sweeps_ += model_.local_step(part, docs_, gamma_, false, &s.counts(),
                                 terms.subspan(at, docs_.size()), local_);
    s.add_docs(part, docs_);
    tokens_visited_ += static_cast<std::int64_t>(part.tokens());
    at += docs_.size();
  }
}

}  // namespace caviar::lda
