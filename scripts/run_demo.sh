#!/usr/bin/env bash
# The default demo: the two simulation studies of Bruno 2022, section 1.2.3, fitted by CAVI on 2
# MPI ranks.
#   1. three 2-D Gaussians, N = 1500, K = 3, random initial responsibilities (Figures 1.5-1.6);
#   2. two 2-D Gaussians, N = 1000, K = 4: CAVI leaves the two extra components nearly empty
#      (Figure 1.7).
# usage: run_demo.sh CAVIAR_BIN OUT_DIR
set -euo pipefail
caviar=${1:?usage: run_demo.sh CAVIAR_BIN OUT_DIR}
out=${2:?usage: run_demo.sh CAVIAR_BIN OUT_DIR}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
mkdir -p "$out"

mpirun=(mpirun -n 2)
[[ $(id -u) -eq 0 ]] && mpirun+=(--allow-run-as-root)
py=/usr/bin/python3

echo "== generating the demo data (embedded in caviar) -> $out/demo.h5"
"${mpirun[@]}" "$caviar" generate demo --out "$out/demo.h5"

echo "== study 1: 3 clusters, K = 3, CAVI from random responsibilities"
"${mpirun[@]}" "$caviar" gmm fit --data "$out/demo.h5:/three/X" --components 3 --init random \
  --seed 1 --out "$out/three_model.h5" --labels "$out/three_labels.h5"
"$py" "$here/plot_gmm.py" --data "$out/demo.h5:/three/X" --model "$out/three_model.h5" \
  --labels "$out/three_labels.h5" --out "$out/three_clusters.png" \
  --title "CAVI, 3 clusters (Bruno 2022, Fig. 1.5)"

echo "== study 2: 2 clusters, K = 4: the extra components empty out"
"${mpirun[@]}" "$caviar" gmm fit --data "$out/demo.h5:/two/X" --components 4 --seed 1 \
  --out "$out/two_model.h5" --labels "$out/two_labels.h5"
"$py" "$here/plot_gmm.py" --data "$out/demo.h5:/two/X" --model "$out/two_model.h5" \
  --labels "$out/two_labels.h5" --out "$out/two_clusters_k4.png" \
  --title "CAVI, 2 clusters fitted with K = 4 (Bruno 2022, Fig. 1.7)"
"$py" - "$out/two_model.h5" <<'PY'
import sys, h5py
w = h5py.File(sys.argv[1], "r")["weights"][:]
print("study 2 weights:", " ".join(f"{v:.4f}" for v in w))
PY

echo "== study 1 model on 1500 held-out points: average log predictive density (Bishop 2006, eq. 10.81)"
"${mpirun[@]}" "$caviar" gmm score --model "$out/three_model.h5" --data "$out/demo.h5:/three_heldout/X"

echo "== done: results in $out (models *_model.h5, labels *_labels.h5, plots *.png)"
