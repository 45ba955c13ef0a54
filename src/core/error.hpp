#pragma once
// The one exception type users see. Thrown for bad input, bad arguments and failed I/O; caught
// once in apps/, which prints "caviar: error: <what>" and exits non-zero on every rank.
#include <stdexcept>
#include <string>

namespace caviar {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

}  // namespace caviar
