#pragma once
// Non-negative expected counts summed exactly: each addend is rounded once to an integer multiple
// of 1/scale and accumulated in int64. Integer addition is associative, so the totals do not
// depend on how rows are split over ranks and threads (docs/reproducibility.md), and the reduction
// over ranks is one allreduce of int64. The scale is a power of two shared by every rank, derived
// from a bound on every total (for counts: the corpus's tokens).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

namespace caviar {

// The largest power of two s with bound * s < 2^61: values in [0, bound] summed as round(x * s)
// leave headroom for the rounding of many terms below 2^63.
inline double fixed_point_scale(double bound) {
  int e = 0;
  std::frexp(std::max(bound, 1.0), &e);  // bound < 2^e
  return std::ldexp(1.0, 61 - e);
}

// A rows x cols table of such counts, row-major (a row's columns are contiguous, so a row is added
// with one short vector loop).
class FixedPointCounts {
 public:
  FixedPointCounts() = default;
  FixedPointCounts(std::int64_t rows, std::int64_t cols, double scale)
      : rows_(rows), cols_(cols), scale_(scale), buf_(static_cast<std::size_t>(rows * cols), 0) {}
  std::int64_t rows() const { return rows_; }
  std::int64_t cols() const { return cols_; }
  double scale() const { return scale_; }
  std::span<std::int64_t> words() { return buf_; }
  std::span<const std::int64_t> words() const { return buf_; }
  void set_zero() { std::fill(buf_.begin(), buf_.end(), std::int64_t{0}); }
  std::int64_t* row(std::int64_t r) { return buf_.data() + r * cols_; }
  const std::int64_t* row(std::int64_t r) const { return buf_.data() + r * cols_; }
  // Adds round(x[c] * scale) to row r, for x[c] >= 0 (a plain conversion of x + 0.5: round half
  // up, much cheaper than llround).
  void add(std::int64_t r, const double* x) {
    std::int64_t* out = row(r);
#pragma omp simd
    for (std::int64_t c = 0; c < cols_; ++c)
      out[c] += static_cast<std::int64_t>(x[c] * scale_ + 0.5);
  }
  double value(std::int64_t r, std::int64_t c) const {
    return static_cast<double>(buf_[static_cast<std::size_t>(r * cols_ + c)]) / scale_;
  }
  FixedPointCounts& operator+=(const FixedPointCounts& o) {
    for (std::size_t i = 0; i < buf_.size(); ++i) buf_[i] += o.buf_[i];
    return *this;
  }

 private:
  std::int64_t rows_ = 0, cols_ = 0;
  double scale_ = 1;
  std::vector<std::int64_t> buf_;
};

}  // namespace caviar
