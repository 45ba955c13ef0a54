#!/usr/bin/env bash
# README command 1: install dependencies, build, and run the default demo under MPI.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
scripts/install_deps.sh
cmake -B build -S . -DCMAKE_BUILD_TYPE=Release
cmake --build build -j"$(nproc)"
scripts/run_demo.sh "$root/build/caviar" "$root/out"
