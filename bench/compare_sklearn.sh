#!/usr/bin/env bash
# Side-by-side time per iteration, caviar vs scikit-learn, at the benchmark shapes.
#   bench/compare_sklearn.sh [--scale 0.1] [--shapes 0,1,2] [--threads 2] [--algorithm cavi|em]
#                            [--covariance full|diag] [--init random-from-data|random]
# Builds caviar if needed; numpy runs on OpenBLAS-pthread (libopenblas0-pthread, installed by
# scripts/install_deps.sh) with the same number of threads as caviar uses cores.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
[[ -x "$root/build/caviar" ]] || { cmake -B "$root/build" -S "$root" && cmake --build "$root/build" -j"$(nproc)"; }
threads=2
for ((i = 1; i <= $#; i++)); do [[ "${!i}" == --threads ]] && { j=$((i + 1)); threads=${!j}; }; done
export OPENBLAS_NUM_THREADS=$threads OMP_NUM_THREADS=$threads
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
exec /usr/bin/python3 "$root/bench/compare_sklearn.py" "$root/build/caviar" "${TMPDIR:-/tmp}/caviar-bench" "$@"
