#!/usr/bin/env -S /usr/bin/python3
"""The shape of Bruno 2022's experiment A for the blocked Gibbs sampler against CAVI: 2-D data
from K = 3 components (`caviar generate gmm`), 1,500 training and 1,500 held-out rows, priors
alpha0 = 1/K, beta0 = 1, m0 = 0, W0 = I, nu0 = D (caviar's defaults), 200 sweeps of which 50 are
burn-in. Prints a Markdown table: after matching the chain's components to CAVI's (Hungarian, on
the means), each component's weight, mean and covariance from both, and the held-out average log
predictive density of both with the chain's Monte-Carlo standard error (batch means).

The chain's covariance is the mean of its Sigma_k = Lambda_k^-1 draws; CAVI's is the model file's
`covariances` (scikit-learn's convention, W_k^-1 / nu_k); they differ by nu_k / (nu_k - D - 1),
under 1% here. The chain's held-out density is its plug-in density per sweep (trace/heldout),
averaged over the sweeps after burn-in.

usage: gibbs_experiment_a.py [--caviar build/caviar] [--workdir /tmp/gibbs_a] [--ranks 2]
       [--data-seed 8] [--seed 1]
"""
import argparse
import os
import shutil
import subprocess
import sys

import h5py
import numpy as np
from scipy.linalg import solve_triangular
from scipy.optimize import linear_sum_assignment

K, N, SWEEPS, BURN = 3, 1500, 200, 50


def run(args, argv):
    mpi = ["mpirun", "-n", str(args.ranks), "--oversubscribe"]
    if os.geteuid() == 0:
        mpi.append("--allow-run-as-root")
    r = subprocess.run((mpi if args.ranks > 1 else []) + [args.caviar, "-q"] + argv,
                       capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("gibbs_experiment_a: caviar %s failed:\n%s" % (argv[0], r.stderr))
    return r


def batch_se(v, batches=10):
    """Standard error of the mean of a correlated series by batch means."""
    b = np.array_split(np.asarray(v), batches)
    return np.std([x.mean() for x in b], ddof=1) / np.sqrt(batches)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--caviar", default="build/caviar")
    ap.add_argument("--workdir", default="/tmp/gibbs_a")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--data-seed", type=int, default=8)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    shutil.rmtree(args.workdir, ignore_errors=True)
    os.makedirs(args.workdir)
    p = lambda name: os.path.join(args.workdir, name)  # noqa: E731
    run(args, ["generate", "gmm", "--n", str(2 * N), "--dim", "2", "--components", str(K),
               "--seed", str(args.data_seed), "--out", p("all.h5") + ":/X"])
    with h5py.File(p("all.h5"), "r") as f:
        x = f["X"][()]
    for name, rows in (("train.h5", x[:N]), ("test.h5", x[N:])):
        with h5py.File(p(name), "w") as f:
            f["X"] = rows
    run(args, ["gmm", "fit", "--data", p("train.h5") + ":/X", "-k", str(K), "--algorithm", "cavi",
               "--seed", str(args.seed), "--max-iter", "500", "--tol", "1e-10", "--heldout",
               p("test.h5") + ":/X", "--out", p("cavi.h5")])
    run(args, ["gmm", "sample", "--data", p("train.h5") + ":/X", "-k", str(K), "--sampler",
               "blocked", "--sweeps", str(SWEEPS), "--burn-in", str(BURN), "--init", "kmeans++",
               "--seed", str(args.seed), "--heldout", p("test.h5") + ":/X", "--out",
               p("chain.h5")])
    with h5py.File(p("cavi.h5"), "r") as f:
        cw, cm, cc = f["weights"][()], f["means"][()], f["covariances"][()]
        c_held = float(f.attrs["heldout_score"]) if "heldout_score" in f.attrs else float("nan")
    with h5py.File(p("chain.h5"), "r") as f:
        gw, gm = f["draws/weights"][()].mean(0), f["draws/means"][()].mean(0)
        gc = f["draws/covariances"][()].mean(0)
        held = f["trace/heldout"][()][BURN:]
    rows, cols = linear_sum_assignment(((gm[:, None] - cm[None]) ** 2).sum(-1))
    print("| component | weight (Gibbs / CAVI) | mean (Gibbs) | mean (CAVI) | covariance (Gibbs) "
          "| covariance (CAVI) |")
    print("|---|---|---|---|---|---|")
    worst = 0.0
    for r, c in zip(rows, cols):
        fmt = lambda v: "(" + ", ".join("%.3f" % t for t in np.ravel(v)) + ")"  # noqa: E731
        print("| %d | %.3f / %.3f | %s | %s | %s | %s |"
              % (c + 1, gw[r], cw[c], fmt(gm[r]), fmt(cm[c]), fmt(gc[r]), fmt(cc[c])))
        worst = max(worst, np.abs(gm[r] - cm[c]).max(), np.abs(gc[r] - cc[c]).max())
    print()
    print("largest difference in a mean or covariance entry: %.4f" % worst)
    print("held-out average log density: Gibbs plug-in %.4f +- %.4f (the mean over %d sweeps of "
          "each draw's density; batch-means se), Gibbs posterior predictive %.4f (log of the "
          "density averaged over the draws), CAVI %.4f"
          % (held.mean(), batch_se(held), len(held), posterior_predictive(p("chain.h5"), x[N:]), c_held))


def posterior_predictive(chain, xt):
    """A blocked chain's posterior predictive density of the rows xt, (1/T) sum_t p(x | theta_t)
    over its recorded draws (draws/weights, means, covariances), as the average over rows of its
    log (log-sum-exp over components and over draws)."""
    with h5py.File(chain, "r") as f:
        w, m, c = f["draws/weights"][()], f["draws/means"][()], f["draws/covariances"][()]
    logp = np.empty((len(w), len(xt)))
    for t in range(len(w)):
        comp = []
        for k in range(w.shape[1]):
            chol = np.linalg.cholesky(c[t, k])
            z = solve_triangular(chol, (xt - m[t, k]).T, lower=True)
            comp.append(np.log(w[t, k]) - 0.5 * (z**2).sum(0) - np.log(np.diag(chol)).sum()
                        - 0.5 * xt.shape[1] * np.log(2 * np.pi))
        logp[t] = np.logaddexp.reduce(np.array(comp), axis=0)
    return float(np.mean(np.logaddexp.reduce(logp, axis=0) - np.log(len(w))))

if __name__ == "__main__":
    main()
