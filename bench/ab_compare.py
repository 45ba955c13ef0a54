#!/usr/bin/env -S /usr/bin/python3
"""A/B timing of two caviar binaries on the same workloads, interleaved in one session.

Each workload runs with binary A, then B, then A, ... (REPS times each, order alternating), and
the median wall time of each is printed with the ratio B/A. Interleaving keeps the machine's
drift out of the ratio; absolute times on these shared machines are not comparable across runs.
The outputs of A and B are also compared (every dataset and attribute, timings and provenance
excepted): a change meant to keep the bits must show "same".

usage: ab_compare.py A_BIN B_BIN WORKDIR [--reps 5] [--ranks 2] [--threads 1] [--only NAME]
                     [--legacy-names]

--legacy-names spells the lengths of LDA's SVI and of the VAE as --passes and --epochs, the names
of binaries from before --max-iter was every fit's length (today's binaries still accept them).
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

import h5py
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "cli"))
from clitest import fresh_workdir, h5_differences, mpirun  # noqa: E402


def workloads(path, make, legacy=False):
    """name -> argv (without binary and --out). Sizes give runs of a few seconds at 2 ranks."""
    gen = path("gmm.h5")
    make(["generate", "gmm", "--n", "200000", "--dim", "16", "--components", "20", "--seed", "1",
          "--out", gen + ":/X"])
    small = path("gmm2.h5")
    make(["generate", "gmm", "--n", "1000000", "--dim", "2", "--components", "10", "--seed", "1",
          "--out", small + ":/X"])
    corpus = path("corpus.h5")
    make(["generate", "lda", "--docs", "20000", "--words", "2000", "--topics", "20", "--seed", "1",
          "--out", corpus])
    rng = np.random.default_rng(0)
    with h5py.File(path("bin.h5"), "w") as f:
        f["X"] = (rng.random((20000, 784)) < 0.2).astype(np.float32)
    fit = ["gmm", "fit", "--tol", "0", "--init", "random", "--seed", "1"]
    return {
        "gmm-cavi-d16": fit + ["--data", gen + ":/X", "-k", "20", "--max-iter", "15"],
        "gmm-cavi-d2": fit + ["--data", small + ":/X", "-k", "10", "--max-iter", "15"],
        "gmm-em-diag-d16": fit + ["--data", gen + ":/X", "-k", "20", "--max-iter", "15",
                                  "--algorithm", "em", "--covariance", "diag"],
        "gmm-svi-d16": fit + ["--data", gen + ":/X", "-k", "20", "--max-iter", "3",
                              "--algorithm", "svi"],
        "lda-cavi": ["lda", "fit", "--data", corpus, "-k", "20", "--algorithm", "cavi",
                     "--max-iter", "5", "--tol", "0"],
        "lda-svi": ["lda", "fit", "--data", corpus, "-k", "20", "--algorithm", "svi",
                    "--passes" if legacy else "--max-iter", "2"],
        "vae": ["vae", "train", "--data", path("bin.h5") + ":/X", "--hidden", "200",
                "--latent", "10", "--epochs" if legacy else "--max-iter", "2", "--batch-size",
                "100"],
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("workdir")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--only")
    ap.add_argument("--legacy-names", action="store_true")
    args = ap.parse_args()
    path = fresh_workdir(args.workdir)
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")

    def make(argv):
        subprocess.run([args.a] + argv, check=True, capture_output=True, env=env)

    print(f"A = {args.a}\nB = {args.b}\n{args.ranks} ranks x {args.threads} threads, "
          f"{args.reps} runs each, interleaved")
    print(f"{'workload':18s} {'A median s':>11s} {'B median s':>11s} {'B/A':>6s}  outputs")
    for name, argv in workloads(path, make, args.legacy_names).items():
        if args.only and args.only not in name:
            continue
        times = {"a": [], "b": []}
        for rep in range(args.reps):
            for which in (("a", "b") if rep % 2 == 0 else ("b", "a")):
                binary = args.a if which == "a" else args.b
                out = path(f"{name}_{which}.h5")
                t0 = time.perf_counter()
                r = subprocess.run(mpirun(args.ranks) + [binary] + argv + ["--out", out],
                                   capture_output=True, text=True, env=env)
                times[which].append(time.perf_counter() - t0)
                if r.returncode != 0:
                    sys.exit(f"FAILED ({which}): {' '.join(argv)}\n{r.stderr}")
        bad = h5_differences(path(f"{name}_a.h5"), path(f"{name}_b.h5"))
        ma, mb = statistics.median(times["a"]), statistics.median(times["b"])
        print(f"{name:18s} {ma:11.3f} {mb:11.3f} {mb / ma:6.3f}  "
              f"{'same' if not bad else 'DIFFER: ' + ', '.join(bad[:3])}", flush=True)


if __name__ == "__main__":
    main()
