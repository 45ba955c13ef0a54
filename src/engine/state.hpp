#pragma once
// How a model's global state reaches a file without the model knowing about files: the model
// writes named arrays and attributes through StateWriter and reads them back through StateReader.
// The engine provides the implementations (engine/state_io.hpp): the model file of --out, and
// the "model/" group of a checkpoint. One save/load pair per model serves both.
//
// Doubles are stored as doubles, so a state read back is bit-identical to the state written; a
// model that derives caches from its parameters (digammas, logarithms) recomputes them in load()
// by the same deterministic code that computed them in the run.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/error.hpp"

namespace caviar::engine {

using Dims = std::vector<std::uint64_t>;

class StateWriter {
 public:
  virtual ~StateWriter() = default;
  // A dataset of shape dims (row-major), e.g. {K, V}.
  virtual void array(const std::string& name, std::span<const double> data, const Dims& dims) = 0;
  virtual void attr(const std::string& name, double v) = 0;
  virtual void attr(const std::string& name, std::int64_t v) = 0;
  virtual void attr(const std::string& name, const std::string& v) = 0;
};

// A model's per-row local state (e.g. each document's topic proportions): this rank's rows of a
// table `width` wide, row-major. The engine checkpoints it in parallel (engine/checkpoint.hpp).
struct LocalState {
  std::string name;
  double* data = nullptr;
  std::int64_t width = 0;
  // What a row read back from a checkpoint must hold: finite values, and positive ones if
  // `positive` (e.g. Dirichlet parameters); a resume from rows that are not is refused with one
  // line naming the first bad row ("the <name> of <row_noun> i ...").
  bool positive = false;
  std::string row_noun = "row";
  // > 0: every value must also be a whole number in [0, categories) (e.g. a label of K
  // components), since a model indexes with it.
  std::int64_t categories = 0;
};

// One named part of a sampler's recorded draw, e.g. the means (K x D); a draw is its parts
// concatenated (engine/sampler.hpp).
struct DrawPart {
  std::string name;
  Dims dims;
};

class StateReader {
 public:
  virtual ~StateReader() = default;
  virtual bool has(const std::string& name) const = 0;
  // Throws caviar::Error naming the file unless the dataset exists with exactly these dims.
  virtual std::vector<double> array(const std::string& name, const Dims& dims) const = 0;
  virtual double attr_double(const std::string& name) const = 0;
  // A count or an index, stored as a double attribute: throws caviar::Error ("<what> = v is not an
  // integer in [lo, hi] (corrupt file?)") unless it is a whole number in [lo, hi].
  std::int64_t attr_int(const std::string& name, std::int64_t lo, std::int64_t hi,
                        const std::string& what) const {
    return checked_int(attr_double(name), lo, hi, what);
  }
  virtual std::string attr_string(const std::string& name) const = 0;
};

}  // namespace caviar::engine
