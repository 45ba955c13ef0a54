#pragma once
// The instruction-set extensions a binary was compiled for, checked against the CPU at start-up.
// A binary built with -march=native on an AVX-512 login node would otherwise die with SIGILL and
// no message on an older compute node.
namespace caviar::isa {

// The -march the binary was built with ("native", "x86-64-v3", or "" for the compiler default).
const char* march();
// Null-terminated list of the extensions the compiler could use ("avx2", "fma", "avx512f", ...),
// in the names of GCC's __builtin_cpu_supports. Defined in isa_built.cpp, which is compiled with
// the binary's -march and holds only constant data, so reading it runs no such instruction.
extern const char* const kBuiltFor[];

}  // namespace caviar::isa
