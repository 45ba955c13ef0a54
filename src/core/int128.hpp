#pragma once
// 128-bit integers: the limbs of the exact sums (core/exact_sum.hpp) and the element type of
// their allreduce (comm/comm.hpp). __extension__ because __int128 is a GCC/Clang type, not ISO
// C++; naming it through these typedefs keeps -Wpedantic quiet in every file that uses it.
namespace caviar {

__extension__ typedef __int128 Int128;
__extension__ typedef unsigned __int128 UInt128;

}  // namespace caviar
