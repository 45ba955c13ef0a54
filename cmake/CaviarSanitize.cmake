# CAVIAR_SANITIZE=ON: AddressSanitizer + UndefinedBehaviorSanitizer on every caviar target
# (scripts/check_sanitizers.sh builds and runs the tests this way).
#
# The flags ride on caviar_warnings, the interface target that every caviar library, test and
# benchmark already links, so no global add_compile_options is needed and a target cannot
# be built half-instrumented. Link options reach the executables through the same target.
#
# - -fno-sanitize-recover=undefined: the first UB report aborts the process (non-zero exit), so
#   a ctest run cannot pass with a report buried in its output.
# - -fno-omit-frame-pointer -g1: readable stacks from ASan's fast unwinder. -g1 (function names
#   and line tables, no variable info) is all a report's stack needs; measured on
#   gmm_driver.cpp, it compiles in 52 s against 80 s with full -g.
# - -march=native (CAVIAR_NATIVE) is left as configured: ASan and UBSan handle AVX-512, and
#   checking the code paths that production builds run is the point. (valgrind cannot execute
#   AVX-512, which is why scripts/check_memcheck.sh uses CAVIAR_NATIVE=OFF instead.)
# - The optimisation level is the build type's; check_sanitizers.sh uses -O1 -g1 without NDEBUG
#   (Eigen's index assertions then run too) to keep the instrumented tests fast enough.
option(CAVIAR_SANITIZE "Build with -fsanitize=address,undefined (tests under ASan/UBSan)" OFF)

if(CAVIAR_SANITIZE)
  if(NOT TARGET caviar_warnings)
    message(FATAL_ERROR "include CaviarSanitize.cmake after CaviarWarnings.cmake")
  endif()
  set(caviar_sanitize_flags -fsanitize=address,undefined -fno-sanitize-recover=undefined
                            -fno-omit-frame-pointer)
  target_compile_options(caviar_warnings INTERFACE ${caviar_sanitize_flags} -g1)
  target_link_options(caviar_warnings INTERFACE ${caviar_sanitize_flags})
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    # With the instrumentation GCC 12 turns its -Wmaybe-uninitialized false positive in
    # avx512fintrin.h (`__m512 __Y = __Y;`, reached through Eigen's packet math) into ~150
    # -Wuninitialized warnings per build. Silenced in this build only; normal builds keep it.
    target_compile_options(caviar_warnings INTERFACE -Wno-uninitialized)
  endif()
  message(STATUS "caviar: building with ${caviar_sanitize_flags}")
endif()
