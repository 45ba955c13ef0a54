#!/usr/bin/env bash
# caviar vae train vs PyTorch (Debian python3-torch, 2 threads) on Fashion-MNIST, side by side in
# one run: H=400, Z=20, B=100, lr=1e-3, Bernoulli likelihood. Prints seconds per epoch (training
# passes only, no evaluation), the final test ELBO of each, and caviar's time as a fraction of
# PyTorch's for 1 rank x 2 threads and 2 ranks x 1 thread.
#
# usage: bench/vae_vs_torch.sh [CAVIAR_BIN] [EPOCHS] [WORKDIR]
# Needs: scripts/install_bench_deps.sh (python3-torch), a built caviar.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
caviar="${1:-$here/../build/caviar}"
epochs="${2:-10}"
work="${3:-${TMPDIR:-/tmp}/caviar-vae-bench}"
py=/usr/bin/python3
mkdir -p "$work"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1

data="$work/fmnist.h5"
[[ -f "$data" ]] || "$caviar" prep fashion-mnist --out "$data" >/dev/null

common=(vae train --data "$data:/train/images" --test "$data:/test/images" --hidden 400
        --latent 20 --max-iter "$epochs" --batch-size 100 --lr 1e-3 --seed 1)

echo "# machine load before: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
torch_json=$($py "$here/vae_vs_torch.py" --data "$data" --epochs "$epochs" --threads 2)
# PyTorch on one thread as well: on a loaded machine its two OpenMP threads wait for each other
# at every one of the step's many parallel regions, and one thread can be much faster.
torch1_json=$($py "$here/vae_vs_torch.py" --data "$data" --epochs "$epochs" --threads 1)
c12_json=$(OMP_NUM_THREADS=2 "$caviar" "${common[@]}")
c21_json=$(OMP_NUM_THREADS=1 mpirun -n 2 "$caviar" "${common[@]}")
echo "# machine load after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2

$py - "$torch_json" "$c12_json" "$c21_json" "$torch1_json" <<'EOF'
import json, sys
t, a, b, t1 = (json.loads(s) for s in sys.argv[1:5])
ts = t["seconds_per_epoch"]
print(f"{'run':<28}{'s/epoch':>10}{'test ELBO':>12}{'ratio':>8}")
print(f"{'torch ' + t['version'] + ' x2 threads':<28}{ts:>10.2f}{t['test_elbo']:>12.2f}{1.0:>8.2f}")
s1 = t1["seconds_per_epoch"]
print(f"{'torch ' + t1['version'] + ' x1 thread':<28}{s1:>10.2f}{t1['test_elbo']:>12.2f}{s1 / ts:>8.2f}")
for name, r in (("caviar 1 rank x 2 threads", a), ("caviar 2 ranks x 1 thread", b)):
    s = r["seconds_per_epoch"]
    print(f"{name:<28}{s:>10.2f}{r['test_elbo']:>12.2f}{s / ts:>8.2f}"
          f"   ({s / s1:.2f} of torch x1)")
EOF
