# One interface target carries the warning flags, so no global add_compile_options.
add_library(caviar_warnings INTERFACE)
target_compile_options(caviar_warnings INTERFACE -Wall -Wextra -Wpedantic -Wshadow -Wno-unused-parameter)
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
  # GCC 12 reports false positives inside Eigen's AVX-512 intrinsics (avx512fintrin.h).
  target_compile_options(caviar_warnings INTERFACE -Wno-maybe-uninitialized)
endif()
