#pragma once
// SVI minibatches drawn without replacement, independent of the number of ranks.
//
// Each epoch visits the rows in the order of a pseudo-random permutation of [0, N) keyed by
// (seed, epoch). The permutation is a Feistel network on the smallest even number of bits that
// covers N, with cycle walking back into [0, N) (Black & Rogaway 2002), whose round function is
// Philox (Stream::kSviMinibatch). perm(i) is computed pointwise, so every rank computes the same
// B indices of a step without communication and keeps the ones it owns.
#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "core/partition.hpp"
#include "core/rng.hpp"

namespace caviar {

class EpochPermutation {
 public:
  EpochPermutation(std::uint64_t n, std::uint64_t seed, std::uint32_t epoch)
      : n_(n), seed_(seed), epoch_(epoch) {
    int bits = 2;
    while (bits < 64 && (std::uint64_t{1} << bits) < n) ++bits;
    half_ = (bits + 1) / 2;
    mask_ = (std::uint64_t{1} << half_) - 1;
  }

  std::uint64_t operator()(std::uint64_t i) const {
    std::uint64_t x = feistel(i);
    while (x >= n_) x = feistel(x);  // cycle walking: terminates since i < n is on the cycle
    return x;
  }

 private:
  static constexpr int kRounds = 6;
  std::uint64_t feistel(std::uint64_t x) const {
    std::uint64_t l = x >> half_, r = x & mask_;
    for (int k = 0; k < kRounds; ++k) {
      const auto out = philox4x32_10(
          {static_cast<std::uint32_t>(r), static_cast<std::uint32_t>(r >> 32),
           static_cast<std::uint32_t>(k) | (static_cast<std::uint32_t>(Stream::kSviMinibatch) << 8),
           epoch_},
          {static_cast<std::uint32_t>(seed_), static_cast<std::uint32_t>(seed_ >> 32)});
      const std::uint64_t f = ((std::uint64_t{out[1]} << 32) | out[0]) & mask_;
      const std::uint64_t nl = r;
      r = l ^ f;
      l = nl;
    }
    return (l << half_) | r;
  }

  std::uint64_t n_, seed_;
  std::uint32_t epoch_;
  int half_;
  std::uint64_t mask_;
};

// The global rows of step `step` of an epoch (positions [step B, min(N, (step + 1) B)) of the
// permutation) that fall in `mine`, sorted increasingly. *batch_size gets the global count.
inline std::vector<std::int64_t> minibatch_rows(const EpochPermutation& perm, std::int64_t n,
                                                std::int64_t batch, std::int64_t step,
                                                RowRange mine, std::int64_t* batch_size) {
  const std::int64_t p0 = step * batch, p1 = std::min(n, p0 + batch);
  std::vector<std::int64_t> rows;
  for (std::int64_t p = p0; p < p1; ++p) {
    const auto r = static_cast<std::int64_t>(perm(static_cast<std::uint64_t>(p)));
    if (r >= mine.begin && r < mine.end) rows.push_back(r);
  }
  std::sort(rows.begin(), rows.end());
  if (batch_size) *batch_size = p1 - p0;
  return rows;
}

// The epoch's order of all N rows as one shuffled vector: the Fisher-Yates shuffle (Durstenfeld's
// in-place form; Knuth, TAOCP vol. 2, Algorithm 3.4.2 P) driven by CounterRng draws keyed by
// (seed, stream, position, epoch), so every rank computes the same order without communication.
// For drivers whose every rank can compute any row (engine/gradient.hpp): O(N) memory per epoch.
inline std::vector<std::int64_t> shuffled_rows(std::int64_t n, std::uint64_t seed, Stream stream,
                                               std::uint32_t epoch) {
  std::vector<std::int64_t> p(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) p[i] = i;
  const CounterRng rng(seed, stream);
  for (std::int64_t i = n - 1; i > 0; --i) {
    const double u = rng.uniform2(static_cast<std::uint64_t>(i), epoch)[0];
    const std::int64_t j = std::min<std::int64_t>(i, static_cast<std::int64_t>(u * (i + 1)));
    std::swap(p[i], p[j]);
  }
  return p;
}

}  // namespace caviar
