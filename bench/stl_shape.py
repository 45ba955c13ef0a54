#!/usr/bin/env -S /usr/bin/python3
"""The STL-10 shape of Bruno 2022, section 2.1.1 (docs/performance.md): CAVI to convergence on
N = 30 000 colour histograms (D = 3 x 64 = 192 bins of 96 x 96 pixels), K = 30, from k-means++
(Bruno 2022 starts from k-means). Its Python took about 4 minutes on real STL-10 histograms
(Coates et al. 2011; Bruno 2022, section 2.1.1); the target here is under 30 s.

Real STL-10 is not available offline, so the data are synthetic histograms with STL-10's shape and
structure: 30 clusters, each a smooth two-bump intensity profile per channel; an image draws its
own per-channel bin probabilities from a Dirichlet around its cluster's profile (concentration
200, so clusters overlap) and then its 9216 pixel counts per channel from a multinomial. Like real
histograms the data are non-negative integers whose three channel sums are constant, so the
sample covariance is singular (rank 189): the Wishart prior has to carry the fit.

Prints iterations, fit seconds and s/iter for 1 rank x T threads and T ranks x 1 thread: exact sums,
--fast-reduce, and exact sums with --precision single (float32 E-step products).

usage: stl_shape.py CAVIAR_BIN WORKDIR [--n 30000] [--threads 2] [--seed 1]
"""
import argparse
import json
import os
import subprocess
import sys

import h5py
import numpy as np

from compare_sklearn import mpirun


def histograms(n, seed, k=30, bins=64, pixels=96 * 96, concentration=200.0):
    rng = np.random.default_rng(seed)
    grid = np.linspace(0, 1, bins)
    profiles = np.empty((k, 3, bins))
    for c in range(k):
        for ch in range(3):
            mu, sd, w = rng.uniform(0.05, 0.95, 2), rng.uniform(0.05, 0.3, 2), rng.dirichlet([1, 1])
            p = sum(w[i] * np.exp(-0.5 * ((grid - mu[i]) / sd[i]) ** 2) for i in range(2)) + 1e-3
            profiles[c, ch] = p / p.sum()
    z = rng.choice(k, size=n, p=rng.dirichlet(np.full(k, 5.0)))
    x = np.empty((n, 3 * bins))
    for ch in range(3):
        g = rng.gamma(concentration * profiles[z, ch])
        x[:, ch * bins:(ch + 1) * bins] = rng.multinomial(pixels, g / g.sum(1, keepdims=True))
    return x


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("caviar")
    ap.add_argument("workdir")
    ap.add_argument("--n", type=int, default=30_000)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    os.makedirs(a.workdir, exist_ok=True)
    data = os.path.join(a.workdir, f"stl_shape_{a.n}.h5")
    if not os.path.exists(data):
        with h5py.File(data + ".tmp", "w") as f:
            f["X"] = histograms(a.n, 770)
        os.replace(data + ".tmp", data)
    t = a.threads
    rows = []
    for ranks, threads in ((1, t), (t, 1)):
        for mode in ("exact", "fast", "exact, single"):
            out = os.path.join(a.workdir, "stl_model.h5")
            argv = mpirun(ranks) + [a.caviar, "gmm", "fit", "--data", data + ":/X", "-k", "30",
                                    "--seed", str(a.seed), "--out", out]
            if mode == "fast":
                argv.append("--fast-reduce")
            if mode.endswith("single"):
                argv += ["--precision", "single"]
            r = subprocess.run(argv, capture_output=True, text=True,
                               env=dict(os.environ, OMP_NUM_THREADS=str(threads)))
            if r.returncode != 0:
                sys.exit(r.stderr)
            js = json.loads(r.stdout.strip().splitlines()[-1])
            with h5py.File(out) as f:
                per_iter = float(np.median(np.diff(f["trace/seconds"][...])))
            rows.append((ranks, threads, mode, js))
            print(f"| {ranks} x {threads} | {mode} | {js['iterations']} | "
                  f"{js['stop_reason']} | {js['seconds']:.1f} | {per_iter:.3f} | "
                  f"{js['elbo'] / a.n:.6f} |", flush=True)
    print(f"load average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    print("| ranks x threads | sums, precision | iterations | stop | fit seconds | s/iter (median) | "
          "ELBO per point |\n|---|---|---|---|---|---|---|", flush=True)
    main()
