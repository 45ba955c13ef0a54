#!/usr/bin/env bash
# README command 2: install dependencies (with a local SLURM for the sbatch tests, valgrind and
# clang's libFuzzer for the memory-safety jobs), build, and run the whole test suite:
#   1. the memory-safety jobs, each on a build tree of its own (build-asan, build-memcheck,
#      build-fuzz): AddressSanitizer + UndefinedBehaviorSanitizer on the unit and MPI tests,
#      valgrind memcheck of one small fit per model on a portable -march=x86-64-v3 build (which
#      also checks that build's reported ISA and start-up CPU check: the portable-build test),
#      and a time-boxed libFuzzer run of caviar's parsers (scripts/check_*.sh say what each
#      covers);
#   2. the ctest suite of the release build (unit, MPI, CLI, determinism, Python, SLURM).
# Every job runs even if an earlier one failed; the exit status is non-zero if any did.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
CAVIAR_WITH_SLURM=1 CAVIAR_WITH_CHECKS=1 scripts/install_deps.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

failed=()
job() {  # job NAME COMMAND...: runs it, timed, and records a failure without stopping
  local name=$1 t0=$SECONDS
  shift
  echo "=== $name"
  if "$@"; then
    echo "=== $name: ok ($((SECONDS - t0)) s)"
  else
    echo "=== $name: FAILED ($((SECONDS - t0)) s)"
    failed+=("$name")
  fi
}
job sanitizers bash scripts/check_sanitizers.sh "$root/build-asan"
job memcheck bash scripts/check_memcheck.sh "$root/build-memcheck"
job fuzz bash scripts/check_fuzz.sh

cmake -B build -S . -DCMAKE_BUILD_TYPE=Release
cmake --build build -j"$(nproc)"
cd build
ctest_status=0
ctest --output-on-failure -j"$(nproc)" || ctest_status=$?
if [[ ${#failed[@]} -gt 0 ]]; then
  echo "memory-safety jobs that failed: ${failed[*]}"
  exit 1
fi
exit "$ctest_status"
