#!/usr/bin/env -S /usr/bin/python3
"""Are two builds' results the same bits? One small fit per model and algorithm (the cases of
scripts/check_memcheck.sh, at 2 ranks x 2 threads) with binary A and binary B on the same inputs,
and every dataset and attribute of the outputs compared (timings and provenance excepted).

Made for builds of one commit for different instruction sets (-march=native against a portable
-DCAVIAR_ARCH=x86-64-v3 or baseline x86-64 build): docs/performance.md, "Portable builds", reports
what it printed. It measures and prints; it asserts nothing, since whether the bits agree across
instruction sets is what it is there to find out (exit status 1 only if a run fails).

usage: isa_outputs.py A_BIN B_BIN WORKDIR
"""
import os
import subprocess
import sys

import h5py
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "cli"))
from clitest import fresh_workdir, h5_differences, mpirun  # noqa: E402


def main():
    a, b, work = sys.argv[1:4]
    path = fresh_workdir(work)
    env = dict(os.environ, OMP_NUM_THREADS="2", OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")

    def make(argv):  # inputs come from A alone, so both fits read the same bytes
        subprocess.run([a, "-q"] + argv, check=True, capture_output=True, env=env)

    make(["generate", "gmm", "--n", "600", "--dim", "3", "--components", "3", "--seed", "1",
          "--out", path("gmm.h5") + ":/X"])
    make(["generate", "lda", "--docs", "200", "--words", "80", "--topics", "3", "--seed", "2",
          "--out", path("lda.h5")])
    make(["generate", "hmm", "--sequences", "60", "--length", "5-30", "--states", "3",
          "--emission", "gaussian", "--dim", "2", "--seed", "3", "--out", path("hmm_gauss.h5")])
    make(["generate", "hmm", "--sequences", "60", "--length", "5-30", "--states", "3",
          "--emission", "categorical", "--symbols", "6", "--seed", "4",
          "--out", path("hmm_cat.h5")])
    rng = np.random.default_rng(0)
    with h5py.File(path("vae.h5"), "w") as f:
        f["train"] = (rng.random((700, 12)) < 0.3).astype(np.float32)

    gmm = ["gmm", "fit", "--data", path("gmm.h5") + ":/X", "-k", "3", "--seed", "1"]
    cases = {
        "gmm-cavi-full": gmm + ["--max-iter", "10"],
        "gmm-cavi-diag": gmm + ["--covariance", "diag", "--max-iter", "10"],
        "gmm-svi": gmm + ["--algorithm", "svi", "--batch-size", "128", "--max-iter", "3"],
        "gmm-em": gmm + ["--algorithm", "em", "--max-iter", "10"],
        "gmm-stick-breaking": gmm + ["--weights", "stick-breaking", "--max-iter", "10"],
        "lda-cavi": ["lda", "fit", "--data", path("lda.h5"), "--topics", "3", "--algorithm",
                     "cavi", "--max-iter", "3"],
        "lda-svi": ["lda", "fit", "--data", path("lda.h5"), "--topics", "3", "--algorithm",
                    "svi", "--batch-size", "64", "--max-iter", "2"],
        "plsa": ["plsa", "fit", "--data", path("lda.h5"), "--topics", "3", "--max-iter", "5"],
        "hmm-em-full": ["hmm", "fit", "--data", path("hmm_gauss.h5"), "--states", "3",
                        "--emission", "gaussian", "--covariance", "full", "--algorithm", "em",
                        "--max-iter", "5"],
        "hmm-cavi-categorical": ["hmm", "fit", "--data", path("hmm_cat.h5"), "--states", "3",
                                 "--emission", "categorical", "--algorithm", "cavi",
                                 "--max-iter", "5"],
        "vae-train": ["vae", "train", "--data", path("vae.h5") + ":/train", "--hidden", "8",
                      "--latent", "2", "--batch-size", "64", "--max-iter", "1", "--seed", "5"],
    }
    print(f"A = {a}\nB = {b}\n2 ranks x 2 threads")
    for name, argv in cases.items():
        outs = []
        for which, binary in (("a", a), ("b", b)):
            out = path(f"{name}_{which}.h5")
            r = subprocess.run(mpirun(2) + [binary] + argv + ["--out", out], capture_output=True,
                               text=True, env=env)
            if r.returncode != 0:
                sys.exit(f"FAILED ({which}): {' '.join(argv)}\n{r.stderr}")
            outs.append(out)
        bad = h5_differences(*outs)
        print(f"{name:22s} {'same' if not bad else 'DIFFER: ' + ', '.join(bad[:4])}"
              f"{largest_difference(*outs, bad)}", flush=True)


def largest_difference(first, second, names):
    """How far apart the differing floating-point datasets are: the largest |a - b| / max|a|."""
    worst = 0.0
    with h5py.File(first, "r") as f, h5py.File(second, "r") as g:
        for name in names:
            if not name.startswith("D:"):
                continue
            x, y = np.asarray(f[name[2:]][()]), np.asarray(g[name[2:]][()])
            if x.dtype.kind == "f" and x.shape == y.shape and x.size:
                scale = max(float(np.max(np.abs(x))), np.finfo(float).tiny)
                worst = max(worst, float(np.max(np.abs(x - y))) / scale)
    return f" (largest relative difference {worst:.1e})" if names else ""


if __name__ == "__main__":
    main()
