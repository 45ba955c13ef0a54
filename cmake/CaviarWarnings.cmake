# One interface target carries the warning flags, so no global add_compile_options.
add_library(caviar_warnings INTERFACE)
target_compile_options(caviar_warnings INTERFACE -Wall -Wextra -Wpedantic -Wshadow -Wno-unused-parameter)
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
  # GCC 12 reports false positives inside Eigen's AVX-512 intrinsics (avx512fintrin.h).
  target_compile_options(caviar_warnings INTERFACE -Wno-maybe-uninitialized)
  # LDA's 512-bit vectors (GCC's generic vectors, split in two where AVX-512 is missing) passed by
  # value between its own inline functions: GCC notes that such a call's ABI differs from an
  # AVX-512 build's. No such function crosses a library boundary, so the note is not ours to act on.
  target_compile_options(caviar_warnings INTERFACE -Wno-psabi)
endif()
