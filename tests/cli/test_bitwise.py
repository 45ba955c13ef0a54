#!/usr/bin/env -S /usr/bin/python3
"""Bitwise reproducibility (docs/reproducibility.md): the same data and seed give byte-for-byte
identical outputs for every rank count P in {1, 2, 3, 4} and thread count T in {1, 2}.

Checked for `generate gmm`, a CAVI checkpoint written at 1 rank and resumed at 4 x 2, the Gaussian mixture fitted by CAVI (k-means++ start, labels and
responsibilities), SVI (in memory and --stream, adaptive steps), EM, the stick-breaking prior with
the data-based prior scale and a held-out score, for LDA (CAVI), the VAE, and the HMM
(`generate hmm`, Gaussian EM, categorical CAVI and Gaussian SVI with posteriors, Viterbi
decoding). Every dataset
and every attribute of every output file is compared, except provenance: the rank and thread
counts, the command line, and wall-clock times.

The test can fail: the same matrix with --fast-reduce (plain double sums) must differ somewhere,
which shows that the comparison sees last-bit differences.

usage: test_bitwise.py CAVIAR_BIN WORKDIR
"""
import os
import subprocess
import sys

import h5py
import numpy as np

from clitest import fresh_workdir, h5_differences, mpirun

MATRIX = [(p, t) for p in (1, 2, 3, 4) for t in (1, 2)]
def run(argv, ranks, threads):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    r = subprocess.run(mpirun(ranks) + argv, capture_output=True, text=True, timeout=300, env=env)
    if r.returncode != 0:
        raise SystemExit(f"FAIL: P={ranks} T={threads}: {' '.join(argv)}\n{r.stderr}")


def main():
    caviar, work = sys.argv[1], sys.argv[2]
    path = fresh_workdir(work)
    failures = []

    def case(name, argv_for, outputs):
        """Runs argv_for(tag) over the matrix; outputs(tag) lists the files to compare."""
        for p, t in MATRIX:
            run(argv_for(f"{p}{t}"), p, t)
        for i in range(len(outputs("11"))):
            bad = h5_differences(*[outputs(f"{p}{t}")[i] for p, t in MATRIX])
            status = "identical" if not bad else f"DIFFERENT: {bad[:6]}"
            print(f"{name} [{os.path.basename(outputs('11')[i])}]: {status}", flush=True)
            if bad:
                failures.append(name)
        return

    # The generator, and the data of every GMM case (N not a multiple of 256: a partial block).
    case("generate gmm",
         lambda tag: [caviar, "generate", "gmm", "--n", "20001", "--dim", "3", "--components", "4",
                      "--seed", "3", "--out", path(f"gen{tag}.h5") + ":/X"],
         lambda tag: [path(f"gen{tag}.h5")])
    data = path("gen11.h5") + ":/X"
    gmm = [caviar, "gmm", "fit", "--data", data, "--components", "4", "--tol", "0"]
    cases = {
        "cavi": ["--max-iter", "25"],
        "svi": ["--algorithm", "svi", "--batch-size", "300", "--max-iter", "3"],
        "svi-stream-adaptive": ["--algorithm", "svi", "--stream", "--batch-size", "256",
                                "--max-iter", "2", "--schedule", "adaptive",
                                "--adaptive-memory", "5"],
        "em": ["--algorithm", "em", "--max-iter", "20"],
        "cavi-stream": ["--stream", "--chunk-rows", "1000", "--max-iter", "15"],
        "dp-heldout": ["--weights", "stick-breaking", "--prior-scale", "data", "--prior-mean",
                       "data", "--max-iter", "15", "--heldout", data],
        "cavi-diag": ["--covariance", "diag", "--init", "random", "--max-iter", "15"],
        "cavi-single": ["--precision", "single", "--max-iter", "15"],
        "cavi-tied": ["--covariance", "tied", "--max-iter", "15"],
        "svi-spherical": ["--covariance", "spherical", "--algorithm", "svi", "--batch-size",
                          "300", "--max-iter", "2", "--schedule", "adaptive"],
        "em-spherical": ["--covariance", "spherical", "--algorithm", "em", "--max-iter", "15"],
    }
    for name, extra in cases.items():
        labels = name in ("cavi", "em")
        case(f"gmm {name}",
             lambda tag, extra=extra, labels=labels, name=name:
                 gmm + extra + ["--out", path(f"{name}{tag}.h5")] +
                 (["--labels", path(f"{name}_labels{tag}.h5"), "--save-responsibilities"]
                  if labels else []),
             lambda tag, labels=labels, name=name:
                 [path(f"{name}{tag}.h5")] + ([path(f"{name}_labels{tag}.h5")] if labels else []))

    # A checkpoint written at 1 rank and resumed at 4 ranks x 2 threads ends where every
    # uninterrupted run of the matrix ended.
    run(gmm + ["--max-iter", "10", "--checkpoint", path("ck.h5"), "--checkpoint-every", "5"], 1, 1)
    run(gmm + ["--max-iter", "25", "--resume", path("ck.h5"), "--out", path("resumed.h5")], 4, 2)
    bad = h5_differences(*[path("cavi11.h5"), path("resumed.h5")])
    print(f"gmm cavi resumed across rank counts: {'identical' if not bad else bad[:6]}")
    if bad:
        failures.append("resume across rank counts")

    # LDA (batch CAVI) and the VAE, which reduce in int64 fixed point.
    run([caviar, "generate", "lda", "--docs", "600", "--words", "150", "--topics", "4", "--seed",
         "2", "--out", path("lda.h5")], 1, 1)
    case("lda cavi",
         lambda tag: [caviar, "lda", "fit", "--data", path("lda.h5"), "--topics", "4",
                      "--algorithm", "cavi", "--max-iter", "4", "--out", path(f"lda{tag}.h5")],
         lambda tag: [path(f"lda{tag}.h5")])
    # The HMM: whole sequences sharded by length, expected counts in fixed point.
    case("generate hmm",
         lambda tag: [caviar, "generate", "hmm", "--sequences", "300", "--length", "5-60",
                      "--states", "3", "--emission", "gaussian", "--dim", "3", "--seed", "4",
                      "--out", path(f"hmmgen{tag}.h5")],
         lambda tag: [path(f"hmmgen{tag}.h5")])
    case("hmm em gaussian full",
         lambda tag: [caviar, "hmm", "fit", "--data", path("hmmgen11.h5"), "--states", "3",
                      "--emission", "gaussian", "--max-iter", "15", "--tol", "0",
                      "--out", path(f"hmm{tag}.h5"), "--posteriors", path(f"hmmp{tag}.h5")],
         lambda tag: [path(f"hmm{tag}.h5"), path(f"hmmp{tag}.h5")])
    run([caviar, "generate", "hmm", "--sequences", "300", "--length", "5-60", "--states", "3",
         "--symbols", "6", "--seed", "4", "--out", path("hmmcat.h5")], 1, 1)
    case("hmm cavi categorical",
         lambda tag: [caviar, "hmm", "fit", "--data", path("hmmcat.h5"), "--states", "3",
                      "--algorithm", "cavi", "--max-iter", "15", "--tol", "0",
                      "--out", path(f"hmmc{tag}.h5"), "--posteriors", path(f"hmmcp{tag}.h5")],
         lambda tag: [path(f"hmmc{tag}.h5"), path(f"hmmcp{tag}.h5")])
    case("hmm svi gaussian full",
         lambda tag: [caviar, "hmm", "fit", "--data", path("hmmgen11.h5"), "--states", "3",
                      "--emission", "gaussian", "--algorithm", "svi", "--batch-size", "40",
                      "--max-iter", "3", "--tol", "0", "--out", path(f"hmms{tag}.h5"),
                      "--posteriors", path(f"hmmsp{tag}.h5")],
         lambda tag: [path(f"hmms{tag}.h5"), path(f"hmmsp{tag}.h5")])
    case("hmm decode",
         lambda tag: [caviar, "hmm", "decode", "--model", path("hmm11.h5"), "--data",
                      path("hmmgen11.h5"), "--out", path(f"hmmd{tag}.h5")],
         lambda tag: [path(f"hmmd{tag}.h5")])
    rng = np.random.default_rng(0)
    with h5py.File(path("vae_data.h5"), "w") as f:
        f["train"] = (rng.random((700, 12)) < 0.3).astype(np.float32)
    case("vae train",
         lambda tag: [caviar, "vae", "train", "--data", path("vae_data.h5") + ":/train",
                      "--hidden", "8", "--latent", "2", "--batch-size", "64", "--max-iter", "2",
                      "--seed", "5", "--out", path(f"vae{tag}.h5")],
         lambda tag: [path(f"vae{tag}.h5")])

    # Sensitivity: plain double sums must show the last-bit differences the exact sums remove.
    for p, t in MATRIX:
        run(gmm + ["--max-iter", "25", "--fast-reduce", "--out", path(f"fast{p}{t}.h5")], p, t)
    fast_bad = h5_differences(*[path(f"fast{p}{t}.h5") for p, t in MATRIX])
    print(f"gmm cavi --fast-reduce: {len(fast_bad)} outputs differ across the matrix "
          f"(e.g. {fast_bad[:3]})")
    if not fast_bad:
        failures.append("--fast-reduce gave identical outputs: the comparison sees nothing")

    if failures:
        raise SystemExit(f"FAIL: not bitwise identical across P x T: {failures}")
    print("PASS: bitwise identical outputs for P in {1,2,3,4} x T in {1,2}")


if __name__ == "__main__":
    main()
