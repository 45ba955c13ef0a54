// Fuzz target: io::DataRef::parse, the "FILE.h5[:/path]" argument of --data, --init, --heldout,
// --out, --topics, --vocab. Pure string code: the fuzz bytes are the argument.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "core/error.hpp"
#include "io/h5.hpp"

namespace {
void check(bool ok) {
  if (!ok) std::abort();  // a broken invariant is a crash for libFuzzer
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string spec(reinterpret_cast<const char*>(data), size);
  const std::string def = "/X";
  try {
    const caviar::io::DataRef r = caviar::io::DataRef::parse(spec, def);
    // What the parse promises: a non-empty file name, and either the default path (no ":/" in
    // the spec) or a path starting with '/' that, joined back with ':', gives the spec.
    check(!r.file.empty());
    if (spec.find(":/") == std::string::npos) {
      check(r.file == spec && r.path == def);
    } else {
      check(!r.path.empty() && r.path[0] == '/');
      check(r.file + ":" + r.path == spec);
      check(r.path.find(":/") == std::string::npos);  // split at the last ":/"
    }
  } catch (const caviar::Error&) {
    check(spec.empty() || spec.rfind(":/") == 0);  // only an empty file name is refused
  }
  return 0;
}
