#include "engine/state_io.hpp"

#include "core/error.hpp"

namespace caviar::engine {

std::vector<double> FileStateReader::array(const std::string& name, const Dims& dims) const {
  const std::string path = prefix_ + name;
  if (!r_.has(path)) throw Error("'" + file_ + "' lacks the dataset '" + path + "'");
  Dims got;
  std::vector<double> v = r_.read(path, &got);
  if (got != dims) {
    auto str = [](const Dims& d) {
      std::string s;
      for (std::size_t i = 0; i < d.size(); ++i) s += (i ? " x " : "") + std::to_string(d[i]);
      return s.empty() ? std::string("a scalar") : s;
    };
    throw Error("'" + file_ + "': the dataset '" + path + "' is " + str(got) + ", expected " +
                str(dims));
  }
  return v;
}

}  // namespace caviar::engine
