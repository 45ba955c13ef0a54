// Fuzz target: ckpt::parse_every, the "--checkpoint-every N|Ts" argument of gmm fit and lda fit.
// Pure string code: the fuzz bytes are the argument.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "core/error.hpp"
#include "inference/checkpoint.hpp"

namespace {
void check(bool ok) {
  if (!ok) std::abort();  // a broken invariant is a crash for libFuzzer
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string s(reinterpret_cast<const char*>(data), size);
  try {
    const caviar::ckpt::Every e = caviar::ckpt::parse_every(s);
    // What the parse promises: "" means only on signals; otherwise exactly one of a count >= 1
    // or a finite number of seconds in (0, 1e9].
    if (s.empty()) {
      check(!e.enabled() && e.iterations == 0 && e.seconds == 0);
    } else if (s.back() == 's') {
      check(e.iterations == 0 && std::isfinite(e.seconds) && e.seconds > 0 && e.seconds <= 1e9);
    } else {
      check(e.seconds == 0 && e.iterations >= 1);
    }
    check(s.empty() || e.enabled());
  } catch (const caviar::Error&) {
    check(!s.empty());
  }
  return 0;
}
