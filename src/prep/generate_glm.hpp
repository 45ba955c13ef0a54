#pragma once
// caviar generate glm: synthetic regression data from a known parameter vector, for black-box VI.
#include <cstdint>
#include <string>

#include "comm/comm.hpp"
#include "models/bbvi/glm.hpp"

namespace caviar {

struct GlmSpec {
  bbvi::Glm model;     // likelihood, features (D), classes, noise_sd
  std::int64_t n = 0;  // rows
  std::uint64_t seed = 0;
};

// Writes FILE with /X (n x D, standard normal features), /y (n responses) and /true/theta (the
// parameters, laid out as bbvi::Glm: per output [w_1..w_D, b], with w_j ~ N(0, 1/D) and
// b ~ N(0, 1/4), so that eta = w.x + b has about unit variance). Row i depends only on
// (seed, i): the file is the same for any number of ranks.
void write_glm(const Comm& comm, const std::string& file, const GlmSpec& spec);

}  // namespace caviar
