#!/usr/bin/env -S /usr/bin/python3
"""The time of collapsed Gibbs sweeps on Bruno 2022's experiment-B shape: the STL-shaped
histograms of bench/stl_shape.py (N = 30,000, D = 192, K = 30), k-means++ start, default priors,
`gmm sample --sampler collapsed --sweeps 2` at 1 rank x T threads (Bruno 2022 reports about 4.5
hours for 2 sweeps of its Python sampler on real STL-10 histograms). Prints the chain's seconds
(sampling only, as the JSON summary reports it), the whole run's wall time, the seconds of each
sweep (trace/seconds), and the predictive evaluations per second (N K per sweep).

usage: gibbs_experiment_b.py CAVIAR_BIN WORKDIR [--n 30000] [--threads 2] [--sweeps 2]
       [--block-rows 256]
"""
import argparse
import json
import os
import subprocess
import sys
import time

import h5py
import numpy as np

from stl_shape import histograms


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("caviar")
    ap.add_argument("workdir")
    ap.add_argument("--n", type=int, default=30_000)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--sweeps", type=int, default=2)
    ap.add_argument("--block-rows", type=int, default=256)
    a = ap.parse_args()
    os.makedirs(a.workdir, exist_ok=True)
    data = os.path.join(a.workdir, f"stl_shape_{a.n}.h5")
    if not os.path.exists(data):  # the same data as stl_shape.py (its seed 770)
        with h5py.File(data + ".tmp", "w") as f:
            f["X"] = histograms(a.n, 770)
        os.replace(data + ".tmp", data)
    out = os.path.join(a.workdir, "collapsed_chain.h5")
    argv = [a.caviar, "-q", "gmm", "sample", "--data", data + ":/X", "-k", "30", "--sampler",
            "collapsed", "--sweeps", str(a.sweeps), "--block-rows", str(a.block_rows),
            "--init", "kmeans++", "--seed", "1", "--out", out]
    t0 = time.perf_counter()
    r = subprocess.run(argv, capture_output=True, text=True,
                       env=dict(os.environ, OMP_NUM_THREADS=str(a.threads)))
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        sys.exit(r.stderr)
    js = json.loads(r.stdout.strip().splitlines()[-1])
    with h5py.File(out) as f:
        sweep_seconds = np.diff(np.concatenate([[0.0], f["trace/seconds"][()]]))
    evals = a.n * 30 * a.sweeps
    print(f"collapsed, N={a.n}, D=192, K=30, 1 rank x {a.threads} threads, "
          f"--block-rows {a.block_rows}: {a.sweeps} sweeps in {js['seconds']:.1f} s "
          f"(whole run {wall:.1f} s; per sweep {np.round(sweep_seconds, 2).tolist()}), "
          f"{evals / js['seconds']:.3g} predictive evaluations/s")
    print(f"load average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
