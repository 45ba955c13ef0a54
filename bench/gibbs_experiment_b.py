#!/usr/bin/env -S /usr/bin/python3
"""Bruno 2022's experiment B, side by side in one run: on the STL-shaped histograms of
bench/stl_shape.py (N = 30,000 training rows, D = 192, K = 30; default priors, k-means++ start,
1 rank x T threads), the time and the held-out average log predictive density of
  - 2 collapsed Gibbs sweeps (`gmm sample --sampler collapsed`; Bruno 2022 reports about 4.5 hours
    for 2 sweeps of its Python sampler on real STL-10 histograms),
  - 200 blocked Gibbs sweeps (`gmm sample --sampler blocked`, the first --burn-in of them burn-in),
  - CAVI to convergence (`gmm fit`, default --tol).
The training and held-out rows are one draw of stl_shape.histograms (seed 770, the same cluster
profiles), split: the first N rows train, the next --heldout rows are held out.

Times are each run's own `seconds` (its JSON summary: the fit or chain, without reading the data;
the held-out evaluations are not counted) and the whole run's wall time. Held-out density: the
collapsed chain's after its last sweep; the blocked chain's posterior predictive, the log of the
density averaged over the draws after burn-in (with, for comparison, each draw's own density
averaged over the draws, a lower bound by Jensen's inequality); CAVI's at convergence (its model
file's heldout_score). Also the collapsed sweeps' predictive evaluations per second (N K per
sweep).

usage: gibbs_experiment_b.py CAVIAR_BIN WORKDIR [--n 30000] [--heldout 3000] [--threads 2]
       [--sweeps 2] [--blocked-sweeps 200] [--burn-in 50] [--block-rows 256]
"""
import argparse
import json
import os
import subprocess
import sys
import time

import h5py
import numpy as np

from gibbs_experiment_a import posterior_predictive
from stl_shape import histograms


def run(argv, threads):
    t0 = time.perf_counter()
    r = subprocess.run(argv, capture_output=True, text=True,
                       env=dict(os.environ, OMP_NUM_THREADS=str(threads)))
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        sys.exit(f"FAILED: {' '.join(argv)}\n{r.stderr}")
    return json.loads(r.stdout.strip().splitlines()[-1]), wall


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("caviar")
    ap.add_argument("workdir")
    ap.add_argument("--n", type=int, default=30_000)
    ap.add_argument("--heldout", type=int, default=3_000)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--sweeps", type=int, default=2)
    ap.add_argument("--blocked-sweeps", type=int, default=200)
    ap.add_argument("--burn-in", type=int, default=50)
    ap.add_argument("--block-rows", type=int, default=256)
    a = ap.parse_args()
    if not 0 <= a.burn_in < a.blocked_sweeps:
        sys.exit("--burn-in must be below --blocked-sweeps")
    os.makedirs(a.workdir, exist_ok=True)
    data = os.path.join(a.workdir, f"stl_shape_{a.n}_{a.heldout}.h5")
    if not os.path.exists(data):
        x = histograms(a.n + a.heldout, 770)
        with h5py.File(data + ".tmp", "w") as f:
            f["X"] = x[:a.n]
            f["heldout"] = x[a.n:]
        os.replace(data + ".tmp", data)
    print(f"load average at start: {os.getloadavg()}", flush=True)
    common = ["--data", data + ":/X", "-k", "30", "--init", "kmeans++", "--seed", "1",
              "--heldout", data + ":/heldout"]
    rows = []

    out = os.path.join(a.workdir, "collapsed_chain.h5")
    js, wall = run([a.caviar, "-q", "gmm", "sample", "--sampler", "collapsed", "--sweeps",
                    str(a.sweeps), "--block-rows", str(a.block_rows), "--out", out] + common,
                   a.threads)
    with h5py.File(out) as f:
        sweep_seconds = np.diff(np.concatenate([[0.0], f["trace/seconds"][()]]))
        ho = f["trace/heldout"][()]
    evals = a.n * 30 * a.sweeps
    print(f"collapsed, --block-rows {a.block_rows}: {a.sweeps} sweeps in {js['seconds']:.1f} s "
          f"(per sweep {np.round(sweep_seconds, 2).tolist()}), "
          f"{evals / js['seconds']:.3g} predictive evaluations/s", flush=True)
    rows.append((f"collapsed Gibbs, {a.sweeps} sweeps (--block-rows {a.block_rows})",
                 js["seconds"], wall, f"{ho[-1]:.4f} (after sweep {len(ho)})"))

    out = os.path.join(a.workdir, "blocked_chain.h5")
    js, wall = run([a.caviar, "-q", "gmm", "sample", "--sampler", "blocked", "--sweeps",
                    str(a.blocked_sweeps), "--burn-in", str(a.burn_in), "--out", out] + common,
                   a.threads)
    with h5py.File(out) as f:
        ho = f["trace/heldout"][()]
    with h5py.File(data) as f:
        pred = posterior_predictive(out, f["heldout"][()])
    rows.append((f"blocked Gibbs, {a.blocked_sweeps} sweeps", js["seconds"], wall,
                 f"{pred:.4f} (posterior predictive over the {len(ho) - a.burn_in} draws after "
                 f"burn-in; each draw's own density averaged: {ho[a.burn_in:].mean():.4f})"))
    print(f"blocked: {a.blocked_sweeps} sweeps in {js['seconds']:.1f} s", flush=True)

    out = os.path.join(a.workdir, "cavi_model.h5")
    js, wall = run([a.caviar, "-q", "gmm", "fit", "--out", out] + common, a.threads)
    with h5py.File(out) as f:
        ho = float(f.attrs["heldout_score"])
    rows.append((f"CAVI to convergence ({js['iterations']} iterations, "
                 f"converged: {str(js['converged']).lower()})", js["seconds"], wall,
                 f"{ho:.4f}"))
    print(f"cavi: {js['iterations']} iterations in {js['seconds']:.1f} s", flush=True)

    print(f"\nN = {a.n} training and {a.heldout} held-out rows, D = 192, K = 30, 1 rank x "
          f"{a.threads} threads; load average {os.getloadavg()[0]:.2f} at the end\n")
    print("| run | seconds | whole run (wall) | held-out average log predictive density |")
    print("|---|---|---|---|")
    for name, sec, wall, ho in rows:
        print(f"| {name} | {sec:.1f} | {wall:.1f} | {ho} |")


if __name__ == "__main__":
    main()
