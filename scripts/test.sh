#!/usr/bin/env bash
# README command 2: install dependencies (with a local SLURM for the sbatch test), build, and run
# the whole test suite.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
CAVIAR_WITH_SLURM=1 scripts/install_deps.sh
cmake -B build -S . -DCMAKE_BUILD_TYPE=Release
cmake --build build -j"$(nproc)"
cd build
ctest --output-on-failure -j"$(nproc)"
