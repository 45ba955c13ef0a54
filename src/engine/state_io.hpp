#pragma once
// The engine's StateWriter/StateReader implementations over caviar's HDF5 layer.
#include <algorithm>
#include <string>
#include <type_traits>
#include <utility>

#include "engine/state.hpp"
#include "io/h5.hpp"

namespace caviar::engine {

// Attributes live on the file's root object: "model/" prefixes datasets, "model." attributes.
inline std::string attr_key(std::string prefix, const std::string& name) {
  std::replace(prefix.begin(), prefix.end(), '/', '.');
  return prefix + name;
}

// Writes a model's state into an HDF5 file under `prefix` ("" or "model/"). W is io::FileWriter
// (serial, one rank) or io::ParallelRowWriter (collective: every rank calls with the same state, as
// a conjugate model's global state is replicated after the reduction, and rank 0's copy is
// written). Attributes are stored as "prefix.name" attributes of the file's root (attr_key).
template <class W>
class PrefixedStateWriter final : public StateWriter {
 public:
  explicit PrefixedStateWriter(W& w, std::string prefix = "") : w_(w), prefix_(std::move(prefix)) {}
  void array(const std::string& name, std::span<const double> data, const Dims& dims) override {
    if constexpr (std::is_same_v<W, io::ParallelRowWriter>)
      w_.write_global(prefix_ + name, data, dims);
    else
      w_.write(prefix_ + name, data, dims);
  }
  void attr(const std::string& name, double v) override { w_.attr(attr_key(prefix_, name), v); }
  void attr(const std::string& name, std::int64_t v) override {
    w_.attr(attr_key(prefix_, name), v);
  }
  void attr(const std::string& name, const std::string& v) override {
    w_.attr(attr_key(prefix_, name), v);
  }

 private:
  W& w_;
  std::string prefix_;
};
using FileStateWriter = PrefixedStateWriter<io::FileWriter>;
using ParallelStateWriter = PrefixedStateWriter<io::ParallelRowWriter>;

// Any rank: reads what either writer wrote (same prefix).
class FileStateReader final : public StateReader {
 public:
  FileStateReader(const io::FileReader& r, std::string file, std::string prefix = "")
      : r_(r), file_(std::move(file)), prefix_(std::move(prefix)) {}
  bool has(const std::string& name) const override { return r_.has(prefix_ + name); }
  std::vector<double> array(const std::string& name, const Dims& dims) const override;
  double attr_double(const std::string& name) const override {
    return r_.read_double_attr(attr_key(prefix_, name));
  }
  std::string attr_string(const std::string& name) const override {
    return r_.read_string_attr(attr_key(prefix_, name));
  }

 private:
  const io::FileReader& r_;
  std::string file_, prefix_;
};

}  // namespace caviar::engine
