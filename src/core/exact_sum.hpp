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
#include <cstdint>
#include <span>
#include <vector>

namespace caviar {

__extension__ typedef __int128 Int128;  // __extension__: a GCC/Clang type, not ISO C++
__extension__ typedef unsigned __int128 UInt128;

// The smallest e with bound < 2^e (bound >= 0 and finite), but at least -956, where the grid
// 2^(e-118) reaches double's smallest subnormal.
int bound_exponent(double bound);

class ExactSum {
 public:
  ExactSum() = default;
  // exponents[i] bounds entry i: the sum over all addends of |v_i| must stay below 2^exponents[i].
  explicit ExactSum(std::vector<int> exponents);
  std::size_t size() const { return acc_.size(); }
  const std::vector<int>& exponents() const { return exp_; }

  void set_zero();
  // Adds one vector of addends (v.size() == size()). Throws caviar::Error if an addend is not
  // finite or breaks its entry's bound (a bug in the bound, or data beyond double's range).
  void add(std::span<const double> v);
  // Adds addends for entries [offset, offset + v.size()) only.
  void add_at(std::size_t offset, std::span<const double> v);
  // Adds another accumulator on the same grid.
  ExactSum& operator+=(const ExactSum& o);

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

 private:
  std::vector<int> exp_;
  std::vector<double> up_;    // up_ * up2_ = 2^(118 - e_i): addend -> grid units (two factors,
  std::vector<double> up2_;   // since 2^(118 - e) can exceed double's range for tiny bounds)
  std::vector<double> down_;  // 2^(e_i - 118)
  // The sum is acc_ + limb_[0] 2^80 + limb_[1] 2^40 + limb_[2]. add() splits each addend's grid
  // units into three signed 40-bit pieces and adds them to the int64 limbs, which vectorises;
  // carry() moves the limbs into acc_ before they could overflow (at most 2^22 adds of < 2^40).
  void carry();
  std::vector<Int128> acc_;
  std::vector<std::int64_t> limb_[3];
  std::int64_t pending_ = 0;  // adds since the last carry
};

}  // namespace caviar
