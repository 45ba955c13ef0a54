#!/usr/bin/env bash
# caviar vae train --arch conv vs the same convolutional VAE in PyTorch (Debian python3-torch) on
# Fashion-MNIST, side by side in one run: channels 32,64, Z=20, B=100, lr=1e-3, Bernoulli
# likelihood, batch norm. Prints seconds per epoch (training passes only, no evaluation), the
# final test ELBO of each, and caviar's time as a fraction of PyTorch's (2 threads) for 1 rank x
# 2 threads and 2 ranks x 1 thread; PyTorch runs at 2 threads and at 1. The last line of stdout
# is a JSON summary. bench/cvae_vs_torch.py does the work; see its docstring for the network.
#
# usage: bench/cvae_vs_torch.sh [CAVIAR_BIN] [EPOCHS] [WORKDIR] [cvae_vs_torch.py options...]
#   e.g. bench/cvae_vs_torch.sh build/caviar 1 /tmp/cvae --rows 2000 --torch-threads 1
#   (other options: --channels 32,64,128 --latent 20 --data FILE.h5 --caviar-runs 1x2,2x1)
# Needs: scripts/install_bench_deps.sh (python3-torch), a built caviar.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
caviar="${1:-$here/../build/caviar}"
epochs="${2:-10}"
work="${3:-${TMPDIR:-/tmp}/caviar-cvae-bench}"
shift $(($# < 3 ? $# : 3))
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
exec /usr/bin/python3 "$here/cvae_vs_torch.py" --caviar "$caviar" --epochs "$epochs" \
  --work "$work" "$@"
