// Start-up check of the CPU against the extensions the binary was built for (core/isa.hpp).
//
// Compiled for the baseline x86-64 whatever the binary's -march (CMakeLists.txt sets this file's
// options), and run as a high-priority constructor, before any other static initialiser of the
// program and before main: nothing compiled for the newer extensions has run yet. On a CPU that
// lacks one, every process (every MPI rank) prints one line and exits with status 1.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/isa.hpp"

namespace caviar::isa {
namespace {

bool cpu_has(const char* ext) {
  // Test hook: CAVIAR_TEST_ISA_MISSING=avx2 pretends that this CPU lacks avx2.
  if (const char* fake = std::getenv("CAVIAR_TEST_ISA_MISSING");
      fake && std::strcmp(fake, ext) == 0)
    return false;
    // __builtin_cpu_supports takes a string literal only: one branch per name kBuiltFor can hold.
#define CAVIAR_ISA(name) \
  if (std::strcmp(ext, name) == 0) return __builtin_cpu_supports(name);
  CAVIAR_ISA("sse3")
  CAVIAR_ISA("ssse3")
  CAVIAR_ISA("sse4.1")
  CAVIAR_ISA("sse4.2")
  CAVIAR_ISA("popcnt")
  CAVIAR_ISA("avx")
  CAVIAR_ISA("avx2")
  CAVIAR_ISA("fma")
  CAVIAR_ISA("bmi")
  CAVIAR_ISA("bmi2")
  CAVIAR_ISA("avx512f")
  CAVIAR_ISA("avx512cd")
  CAVIAR_ISA("avx512dq")
  CAVIAR_ISA("avx512bw")
  CAVIAR_ISA("avx512vl")
  CAVIAR_ISA("avx512ifma")
  CAVIAR_ISA("avx512vbmi")
  CAVIAR_ISA("avx512vbmi2")
  CAVIAR_ISA("avx512vnni")
  CAVIAR_ISA("avx512bitalg")
  CAVIAR_ISA("avx512vpopcntdq")
  CAVIAR_ISA("avx512bf16")
#undef CAVIAR_ISA
  return true;  // a name this check does not know: nothing to say
}

__attribute__((constructor(101))) void check_cpu() {
  __builtin_cpu_init();
  std::string missing;
  for (const char* const* e = kBuiltFor; *e; ++e)
    if (!cpu_has(*e)) missing += std::string(missing.empty() ? "" : ", ") + *e;
  if (missing.empty()) return;
  // Every rank exits; only the first says why (the launchers' rank variables, set before exec).
  for (const char* var : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"})
    if (const char* r = std::getenv(var); r && std::strcmp(r, "0") != 0) std::_Exit(1);
  const std::string built = *march() ? std::string(" (-march=") + march() + ")" : std::string();
  // x86-64-v3 is AVX2 + FMA + BMI1/2; a CPU without those needs x86-64-v2.
  const bool v3 = cpu_has("avx2") && cpu_has("fma") && cpu_has("bmi2");
  std::fprintf(stderr,
               "caviar: error: this CPU lacks %s, which this binary was built to use%s; build a "
               "portable binary with cmake -DCAVIAR_NATIVE=OFF -DCAVIAR_ARCH=%s\n",
               missing.c_str(), built.c_str(), v3 ? "x86-64-v3" : "x86-64-v2");
  std::fflush(stderr);
  std::_Exit(1);
}

}  // namespace
}  // namespace caviar::isa
