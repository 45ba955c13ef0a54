// Compiled with the binary's own -march: the predefined macros say what the compiler may use.
// Constant data only (no code runs here), so it is safe to read on any x86-64 CPU.
#include "core/isa.hpp"

namespace caviar::isa {

const char* march() {
#ifdef CAVIAR_MARCH
  return CAVIAR_MARCH;
#else
  return "";
#endif
}

const char* const kBuiltFor[] = {
#ifdef __SSE3__
    "sse3",
#endif
#ifdef __SSSE3__
    "ssse3",
#endif
#ifdef __SSE4_1__
    "sse4.1",
#endif
#ifdef __SSE4_2__
    "sse4.2",
#endif
#ifdef __POPCNT__
    "popcnt",
#endif
#ifdef __AVX__
    "avx",
#endif
#ifdef __AVX2__
    "avx2",
#endif
#ifdef __FMA__
    "fma",
#endif
#ifdef __BMI__
    "bmi",
#endif
#ifdef __BMI2__
    "bmi2",
#endif
#ifdef __AVX512F__
    "avx512f",
#endif
#ifdef __AVX512CD__
    "avx512cd",
#endif
#ifdef __AVX512DQ__
    "avx512dq",
#endif
#ifdef __AVX512BW__
    "avx512bw",
#endif
#ifdef __AVX512VL__
    "avx512vl",
#endif
#ifdef __AVX512IFMA__
    "avx512ifma",
#endif
#ifdef __AVX512VBMI__
    "avx512vbmi",
#endif
#ifdef __AVX512VBMI2__
    "avx512vbmi2",
#endif
#ifdef __AVX512VNNI__
    "avx512vnni",
#endif
#ifdef __AVX512BITALG__
    "avx512bitalg",
#endif
#ifdef __AVX512VPOPCNTDQ__
    "avx512vpopcntdq",
#endif
#ifdef __AVX512BF16__
    "avx512bf16",
#endif
    nullptr};

}  // namespace caviar::isa
