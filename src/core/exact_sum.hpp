#pragma once
// Sums whose result does not depend on the order of the addends, and therefore not on how rows
// are split over ranks and threads: the foundation of caviar's bitwise reproducibility.
//
// Each addend is first rounded once onto a fixed grid (truncated to a multiple of 2^(e - 118),
// where 2^e bounds the sum of the magnitudes of entry i's addends), then summed exactly as a
// 128-bit integer. Integer addition is associative, so any grouping (blocks within a thread,
// threads within a rank, ranks in an MPI reduction) gives the same bits. The rounding of an addend
// depends on the addend alone. With the bound tight to within a few powers of two, the grid is
// ~2^-115 of the largest possible total, far finer than double's 2^-53, so the result is the sum
// of the addends to within a rounding of the final double (plus 2^(e-118) per addend).
//
// The caller supplies the exponents, from bounds every rank computes identically (e.g. N times the
// global maximum of |x|, or an allreduced maximum), so that every rank uses the same grid.
//
// Cost: adding is one pass of a vectorised kernel that reads an addend and an exponent (12 bytes)
// and reads and writes three int64 limbs (48 bytes) per entry: memory-bound when the limbs are not
// in cache. Callers that add many
// vectors into a large accumulator should therefore add a cache-sized range of entries for several
// addends in a row (prepare(count), then add_range per piece): see gmm::Model::local_step.
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "core/int128.hpp"

namespace caviar {

// The smallest e with bound < 2^e (bound >= 0 and finite), but at least -956, where the grid
// 2^(e-118) reaches double's smallest subnormal.
int bound_exponent(double bound);

class ExactSum {
 public:
  ExactSum() = default;
  // exponents[i] bounds entry i: the sum over all addends of |v_i| must stay below 2^exponents[i].
  explicit ExactSum(std::vector<int> exponents);
  std::size_t size() const { return limb_[0].size(); }
  const std::vector<int>& exponents() const { return *exp_; }

  void set_zero();
  // A zero accumulator on the same grid (sharing the exponents), e.g. one per thread.
  ExactSum zeros_like() const;
  // Adds one vector of addends (v.size() == size()). Throws caviar::Error if an addend is not
  // finite or breaks its entry's bound (a bug in the bound, or data beyond double's range).
  void add(std::span<const double> v);
  // Adds addends for entries [offset, offset + v.size()) only (one addend per entry).
  void add_at(std::size_t offset, std::span<const double> v);

  // Adding in pieces: prepare(count) makes room for up to `count` addends per entry; then
  // add_range may be called any number of times, provided no entry receives more than `count`
  // addends before the next prepare(). (The int64 limbs are carried into 128 bits when they could
  // otherwise overflow; add_range does not count, so this promise is what keeps them exact.)
  // Errors as add().
  void prepare(std::int64_t count);
  void add_range(std::size_t offset, std::span<const double> v);

  // Adds another accumulator on the same grid.
  ExactSum& operator+=(const ExactSum& o);
  // The same, and leaves o zero (one pass over both: for partial sums that are reused).
  void absorb(ExactSum& o);

  // The raw integers, for a reduction over ranks (Comm::allreduce_sum of Int128).
  std::span<Int128> raw() {
    carry();
    return acc_;
  }
  // The sums, each rounded to the nearest double.
  void result(std::span<double> out) const;
  std::vector<double> result() const;

  ExactSum(const ExactSum&) = default;
  ExactSum& operator=(const ExactSum&) = default;
  ExactSum(ExactSum&&) = default;
  ExactSum& operator=(ExactSum&&) = default;

 private:
  // The exponents, shared between copies (accumulators of one grid, e.g. one per thread, are
  // copies of one ExactSum): read-only after construction. The scale 2^(118 - e_i) of an addend is
  // made from e_i with integer operations inside the kernel, so no per-entry scale arrays are read.
  std::shared_ptr<const std::vector<int>> exp_ = std::make_shared<const std::vector<int>>();
  // The sum is acc_ + limb_[0] 2^80 + limb_[1] 2^40 + limb_[2]. Adding splits each addend's grid
  // units into three signed pieces of at most 40 bits (38 for the top one) and adds them to the
  // int64 limbs, which vectorises; carry() moves the limbs into acc_ before they could overflow
  // (at most 2^22 adds of < 2^40 each). acc_ is allocated at the first carry (empty = zero), so a
  // per-thread accumulator that never carries costs only its limbs.
  void carry();
  std::vector<Int128> acc_;
  std::vector<std::int64_t> limb_[3];
  std::int64_t pending_ = 0;  // addends per entry since the last carry (at most); 0: limbs zero
  [[noreturn]] void throw_bad_addend(std::size_t offset, std::span<const double> v) const;
};

}  // namespace caviar
