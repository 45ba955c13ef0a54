#pragma once
// The engine's reductions over ranks. Every one but Reducer's plain double sum is exact, so its
// result is the same for any number of ranks and threads (docs/reproducibility.md).
#include <concepts>
#include <cstdint>
#include <span>

#include "comm/comm.hpp"
#include "core/exact_sum.hpp"

namespace caviar::engine {

// Exact, order-independent global sum of doubles (one entry per local row, e.g. per-document
// objective terms): core/exact_sum.hpp's ExactSum on the grid of 2 n max|x|, with n and max|x|
// taken over every rank. NaN if any value is not finite.
double exact_sum(const Comm& comm, std::span<const double> v);

// The combinations over the contributors of a model's statistics that the drivers hand to the
// model (Stats::reduce): a model reduces its own statistics through these calls and never sees
// MPI. Over ranks (Reducer(comm)), or over one process that already holds every contribution
// (Reducer::local(): max returns its argument, sums leave their buffers as they are).
class Reducer {
 public:
  explicit Reducer(const Comm& comm) : comm_(&comm) {}
  static Reducer local() { return Reducer(); }

  double max(double v) const { return comm_ ? comm_->allreduce_max(v) : v; }
  // In place, element-wise. Integer sums are exact; the double sum depends on the order of the
  // contributors, hence on the rank count (a model's --fast-reduce).
  void sum(std::span<std::int64_t> v) const {
    if (comm_) comm_->allreduce_sum(v);
  }
  void sum(std::span<Int128> v) const {
    if (comm_) comm_->allreduce_sum(v);
  }
  void sum(std::span<double> v) const {
    if (comm_) comm_->allreduce_sum(v);
  }
  // In place, element-wise bitwise or (e.g. the union of the contributors' sets of touched rows).
  void bit_or(std::span<std::uint64_t> v) const {
    if (comm_) comm_->allreduce_or(v);
  }
  // Whether there is one contributor only (every sum would leave its buffer as it is).
  bool single() const { return !comm_ || comm_->size() == 1; }
  // Whether this contributor is the one that counts what every contributor computes alike (e.g.
  // the size of a reduction, in a counter summed over ranks).
  bool counts_shared() const { return !comm_ || comm_->rank() == 0; }

 private:
  Reducer() = default;
  const Comm* comm_ = nullptr;
};

// What the drivers sum over ranks: statistics that reduce themselves through a Reducer
// (Stats::reduce, e.g. the GMM's two-phase exact sum: a max for the grid of its log-normalisers,
// then one Int128 sum), or plain integer words (Stats::words(), e.g. core/fixed_point.hpp's
// FixedPointCounts), which are summed in one int64 reduction.
template <class S>
concept ReducibleStats = requires(S& s, const Reducer& r) {
  s.reduce(r);
}
|| requires(S& s) {
  { s.words() } -> std::same_as<std::span<std::int64_t>>;
};

template <ReducibleStats S>
void reduce(S& s, const Reducer& r) {
  if constexpr (requires { s.reduce(r); })
    s.reduce(r);
  else
    r.sum(s.words());
}

}  // namespace caviar::engine
