#!/usr/bin/env -S /usr/bin/python3
"""Time per iteration, caviar against scikit-learn, side by side in one run on the same generated
data, and print the ratios: CAVI against BayesianGaussianMixture and EM against GaussianMixture
(--algorithm), full, diagonal, tied or spherical covariance (--covariance; the variational tied
and spherical models are caviar's exact conjugate ones, not scikit-learn's, so their iterations
are the same work, not the same numbers). caviar runs with its default exact
(bitwise reproducible) sums, and also with --fast-reduce, whose ratio to the former is the cost of
reproducibility, and (full covariance) with --precision single, whose objective after the same
iterations is compared with the double fit's.

Both are timed per iteration from their own progress output, and the median is taken (robust to
other processes on a shared machine): caviar's trace/seconds (cumulative seconds, differenced)
and sklearn's `verbose=2, verbose_interval=1` "time lapse" lines. Both times include the bound
(ELBO) evaluation each iteration. sklearn runs with full covariance, the Dirichlet-distribution weight prior, tol=0 (so it runs every
iteration) and numpy on whatever BLAS Debian's alternatives select (OpenBLAS-pthread when
libopenblas0-pthread is installed) with OPENBLAS_NUM_THREADS threads.

usage: compare_sklearn.py CAVIAR_BIN WORKDIR [--scale 0.1] [--shapes 0,1,2] [--threads 2]
                          [--algorithm cavi|em] [--covariance full|diag|tied|spherical]
                          [--init random-from-data|random]
"""
import argparse
import contextlib
import io
import json
import os
import re
import subprocess
import sys
import time
import warnings

import h5py
import numpy as np

SHAPES = [(1_000_000, 2, 10), (200_000, 16, 20), (30_000, 192, 30)]
# Iterations per timed fit: enough for a stable median, few enough to keep the run short.
SKLEARN_ITERS = [6, 6, 4]
CAVIAR_ITERS = [12, 12, 8]


def mpirun(n):
    extra = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    return ["mpirun", "-n", str(n), "--oversubscribe", "--bind-to", "none"] + extra


def run(argv, env=None):
    r = subprocess.run(argv, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        sys.exit(f"FAILED: {' '.join(argv)}\n{r.stderr}")
    return r


def caviar_per_iter(caviar, data, k, ranks, threads, iters, workdir, algorithm, covariance,
                    init, fast=False, single=False):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    argv = mpirun(ranks) + [caviar, "gmm", "fit", "--data", data, "-k", str(k), "--init", init,
                            "--seed", "1", "--max-iter", str(iters), "--tol", "0",
                            "--algorithm", algorithm, "--covariance", covariance,
                            "--out", os.path.join(workdir, "caviar_model.h5")]
    if fast:
        argv.append("--fast-reduce")
    if single:
        argv += ["--precision", "single"]
    r = run(argv, env)
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    return (per_iteration_seconds(os.path.join(workdir, "caviar_model.h5"), iters),
            summary.get("elbo", summary.get("log_likelihood")))


def per_iteration_seconds(model_file, iters):
    """Median seconds per iteration from the model file's trace/seconds (seconds since the fit
    started, at full precision: the progress lines' milliseconds can round an iteration of a small
    problem to zero)."""
    with h5py.File(model_file) as f:
        t = f["trace/seconds"][...]
    if len(t) != iters + 1:
        sys.exit(f"{model_file}: expected {iters + 1} trace entries, found {len(t)}")
    return float(np.median(np.diff(t)))


def sklearn_per_iter(x, k, iters, algorithm, covariance):
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.mixture import BayesianGaussianMixture, GaussianMixture
    common = dict(n_components=k, covariance_type=covariance, max_iter=iters, tol=0.0,
                  init_params="random_from_data", random_state=0, verbose=2, verbose_interval=1)
    if algorithm == "em":
        est = GaussianMixture(**common)
    else:
        est = BayesianGaussianMixture(
            weight_concentration_prior_type="dirichlet_distribution", **common)
    out = io.StringIO()
    with warnings.catch_warnings(), contextlib.redirect_stdout(out):
        warnings.simplefilter("ignore", ConvergenceWarning)
        est.fit(x)
    lapses = [float(v) for v in re.findall(r"Iteration \d+\s+time lapse ([0-9.]+)s", out.getvalue())]
    if len(lapses) != iters:
        sys.exit(f"could not read sklearn's per-iteration times:\n{out.getvalue()}")
    return float(np.median(lapses))


def dgemm_peak(threads):
    """The machine's DGEMM rate through numpy's BLAS (OpenBLAS) on `threads` threads: best of a
    few 4096^3 products, in GFLOP/s."""
    a = np.random.default_rng(0).standard_normal((4096, 4096))
    b = np.random.default_rng(1).standard_normal((4096, 4096))
    a @ b  # warm up (threads, pages)
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return 2 * 4096**3 / best * 1e-9


def nominal_gflops(n, d, k, seconds, covariance):
    """caviar's dense-equivalent rate: the flops per point and component per iteration of its
    kernels with every responsibility kept, 3 D^2 below D = 64 (E-step GEMM 2 D^2, scatter D^2),
    2 D^2 from D = 64 (triangular E-step D^2, symmetric update D^2), 5 D diagonal. Above D = 32
    the update skips rows with negligible responsibilities, so on separated data this rate can
    exceed the DGEMM peak: it is then work avoided, not work done. Tied: the scatter D^2 per
    component, and one shared E-step product, 2 D^2 / K per component."""
    if covariance == "full":
        per = (2.0 if d >= 64 else 3.0) * d * d
    elif covariance == "tied":
        per = d * d + 2.0 * d * d / k
    else:
        per = 5.0 * d
    return per * n * k / seconds * 1e-9


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("caviar")
    ap.add_argument("workdir")
    ap.add_argument("--scale", type=float, default=1.0, help="multiply every N (for a quick run)")
    ap.add_argument("--shapes", default="0,1,2")
    ap.add_argument("--threads", type=int, default=2, help="cores to use, for both sides")
    ap.add_argument("--algorithm", default="cavi", choices=["cavi", "em"])
    ap.add_argument("--covariance", default="full", choices=["full", "diag", "tied", "spherical"])
    ap.add_argument("--init", default="random-from-data", choices=["random-from-data", "random"],
                    help="caviar's start: one point per component, one-hot (the start scikit-learn "
                         "is given here, init_params='random_from_data', though not the same "
                         "points), or dense random responsibilities (the hard case: every row "
                         "weighs on every component in the first iterations)")
    args = ap.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    threads = args.threads

    rows = []
    for si in [int(s) for s in args.shapes.split(",")]:
        n, d, k = SHAPES[si]
        n = max(int(n * args.scale), 10 * k)
        data = os.path.join(args.workdir, f"shape{si}.h5")
        run(mpirun(1) + [args.caviar, "-q", "generate", "gmm", "--n", str(n), "--dim",
                                    str(d), "--components", str(k), "--seed", "1", "--out", data])
        with h5py.File(data) as f:
            x = f["X"][:]
        sk = sklearn_per_iter(x, k, SKLEARN_ITERS[si], args.algorithm, args.covariance)
        kind = (args.caviar, data + ":/X", k)
        opts = (CAVIAR_ITERS[si], args.workdir, args.algorithm, args.covariance, args.init)
        one, elbo = caviar_per_iter(*kind, 1, threads, *opts)
        two, _ = caviar_per_iter(*kind, threads, 1, *opts)
        fast, _ = caviar_per_iter(*kind, 1, threads, *opts, fast=True)
        # --precision single (full covariance only): its time and its objective's relative
        # difference from the double fit's after the same iterations.
        single, rel = float("nan"), float("nan")
        if args.covariance == "full":
            single, elbo32 = caviar_per_iter(*kind, 1, threads, *opts, single=True)
            rel = abs(elbo32 - elbo) / abs(elbo)
        rows.append((n, d, k, sk, one, two, fast, single, rel))
        print(f"# shape {si}: N={n} D={d} K={k}: sklearn {sk:.4f} s/iter, caviar 1x{threads} "
              f"{one:.4f}, {threads}x1 {two:.4f}, 1x{threads} --fast-reduce {fast:.4f}, "
              f"1x{threads} --precision single {single:.4f}", file=sys.stderr, flush=True)

    peak = dgemm_peak(threads)
    load = os.getloadavg()[0]
    peer = "GaussianMixture" if args.algorithm == "em" else "BayesianGaussianMixture"
    print(f"\n{args.algorithm.upper()} time per iteration ({args.covariance} covariance) against "
          f"sklearn {peer}, {threads} cores, caviar --init {args.init}; load average "
          f"{load:.2f} at the end (other processes inflate both sides)")
    print(f"| N | D | K | sklearn s/iter | caviar 1 rank x {threads} threads | ratio | "
          f"caviar {threads} ranks x 1 thread | ratio | 1x{threads} --fast-reduce | exact/fast | "
          f"caviar dense-equivalent GFLOP/s (% of DGEMM) | 1x{threads} --precision single | double/single | "
          f"objective rel. diff. single |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for n, d, k, sk, one, two, fast, single, rel in rows:
        g = nominal_gflops(n, d, k, min(one, two), args.covariance)
        print(f"| {n} | {d} | {k} | {sk:.4f} | {one:.4f} | {sk / one:.1f}x | {two:.4f} | "
              f"{sk / two:.1f}x | {fast:.4f} | {one / fast:.2f} | {g:.1f} ({100 * g / peak:.0f}%) | "
              f"{single:.4f} | {one / single:.2f} | {rel:.1e} |")
    print(f"DGEMM peak measured in this run (numpy/OpenBLAS, {threads} threads, 4096^3): "
          f"{peak:.1f} GFLOP/s")
    print(json.dumps({"algorithm": args.algorithm, "covariance": args.covariance,
                      "init": args.init, "dgemm_gflops": peak,
                      "rows": [dict(n=r[0], d=r[1], k=r[2], sklearn=r[3], caviar_1xT=r[4],
                                    caviar_Tx1=r[5], caviar_fast_1xT=r[6], caviar_single_1xT=r[7],
                                    single_rel_diff=r[8]) for r in rows]}))


if __name__ == "__main__":
    main()
