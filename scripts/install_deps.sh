#!/usr/bin/env bash
# Installs caviar's build, test and plotting dependencies from Debian packages (lmod: the install
# test loads caviar's modulefile with it; iproute2: the two-host test's network namespaces;
# python3-emcee: the MCMC reference of tests/cli/test_bbvi_mcmc.py).
# Safe to run twice: apt-get skips what is already installed.
set -euo pipefail

pkgs=(
  build-essential cmake pkg-config
  libopenmpi-dev openmpi-bin
  libhdf5-openmpi-dev hdf5-tools
  libeigen3-dev libcli11-dev nlohmann-json3-dev
  libgtest-dev googletest libbenchmark-dev
  zlib1g-dev dataset-fashion-mnist
  libopenblas0-pthread
  lmod iproute2
  python3-h5py python3-numpy python3-scipy python3-sklearn python3-matplotlib python3-pytest
  python3-emcee
)
if [[ "${CAVIAR_WITH_SLURM:-0}" == 1 ]]; then
  pkgs+=(slurm-wlm munge)
fi
# The test command's memory-safety jobs: valgrind (scripts/check_memcheck.sh), clang's libFuzzer
# with ASan/UBSan (scripts/check_fuzz.sh); GCC's sanitizers need nothing more.
if [[ "${CAVIAR_WITH_CHECKS:-0}" == 1 ]]; then
  pkgs+=(valgrind clang libclang-rt-dev)
fi

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [[ ${#missing[@]} -eq 0 ]]; then
  echo "install_deps: all ${#pkgs[@]} packages present"
  exit 0
fi
SUDO=""
[[ $(id -u) -ne 0 ]] && SUDO=sudo
echo "install_deps: installing ${missing[*]}"
$SUDO apt-get update -q
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
