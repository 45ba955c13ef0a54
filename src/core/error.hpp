#pragma once
// The one exception type users see. Thrown for bad input, bad arguments and failed I/O; caught
// once in apps/, which prints "caviar: error: <what>" and exits non-zero on every rank.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>

namespace caviar {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// A counter or position read from a file (stored as an integer, read back as a double): v must be
// an integer in [lo, hi] (hi <= kMaxCount = 2^53, where doubles still hold every integer), else
// `what` (e.g. "--resume ck.h5: its attribute 'epoch'") is refused as corrupt. Converting a NaN,
// a fraction's neighbour or an out-of-range value unchecked is undefined behaviour.
inline constexpr std::int64_t kMaxCount = std::int64_t{1} << 53;
inline std::int64_t checked_int(double v, std::int64_t lo, std::int64_t hi,
                                const std::string& what) {
  if (!(v >= static_cast<double>(lo) && v <= static_cast<double>(hi)) || v != std::floor(v)) {
    char buf[40];
    std::snprintf(buf, sizeof buf, "%.17g", v);
    throw Error(what + " = " + buf + " is not an integer in [" + std::to_string(lo) + ", " +
                std::to_string(hi) + "] (corrupt file?)");
  }
  return static_cast<std::int64_t>(v);
}

}  // namespace caviar
