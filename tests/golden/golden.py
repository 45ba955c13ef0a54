#!/usr/bin/env -S /usr/bin/python3
"""Golden hashes: a fixed matrix of fits whose outputs must keep their exact bits through a
refactor.

The matrix: GMM CAVI, SVI, EM and stick-breaking, full and diagonal covariance (with labels and
responsibilities); LDA CAVI and SVI, in memory and --stream; pLSA; HMM EM, CAVI and SVI (Gaussian
full and diagonal, categorical; with --posteriors); black-box VI (full rank, mean field with the
score estimator and control variates, low rank on softmax); the MLP and the convolutional VAE;
each at 1, 2 and 3 ranks.
A run's hash is SHA-256 over every dataset and attribute of its output files, provenance and
timings excepted (tests/cli/clitest.py's h5_contents). The three rank counts must give one hash
(the bitwise guarantee); the hash must equal the recorded one.

Results are the same bits on any machine with the same instruction set (Eigen plans its products
for a fixed L1 size, core/eigen_blocking.cpp), not across instruction
sets: -march=native picks fused multiply-adds and vector widths from the CPU, so the record is
keyed by the CPU's vector features, and `check` on a machine without a record for its features
exits 77 (skipped), saying so.

A record lists the fits it has hashes for. A fit added to the matrix after a key was recorded is
reported as not recorded for that key and not compared, until that key is recorded again on a
machine that can; every fit the record has must reproduce.

A record for another instruction set can be made or checked on a machine that has a superset of
it, with a binary built for that set and the CPU model it was recorded on, and --as-key naming
it: the AVX2 record (made on Zen 3) is reproduced on an AVX-512 Zen 5 machine by a build with
-DCAVIAR_NATIVE=OFF -DCAVIAR_ARCH=znver3 (docs/reproducibility.md, "Cache sizes"). Check such a
binary against the existing record before recording with it.

usage: golden.py record|check CAVIAR_BIN WORKDIR [RECORD_JSON] [--as-key KEY]
"""
import hashlib
import json
import os
import subprocess
import sys

import h5py
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "cli"))
from clitest import fresh_workdir, h5_contents, mpirun  # noqa: E402

RANKS = (1, 2, 3)


def isa_key():
    """The CPU's vector features that change floating-point results of a native build."""
    flags = set()
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    keep = ["sse4_2", "avx", "avx2", "fma", "avx512f", "avx512dq", "avx512bw", "avx512vl"]
    return "+".join(k for k in keep if k in flags)


def digest(files):
    h = hashlib.sha256()
    for path in files:
        for key, value in sorted(h5_contents(path).items()):
            h.update(key.encode())
            h.update(repr(value).encode())
    return h.hexdigest()


def matrix(caviar, path):
    """name -> (argv without --out, output files given a tag, extra flags given a tag)."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    gen = path("gmm.h5")
    subprocess.run([caviar, "generate", "gmm", "--n", "3001", "--dim", "3", "--components", "4",
                    "--seed", "7", "--out", gen + ":/X"], check=True, capture_output=True, env=env)
    corpus = path("corpus.h5")
    subprocess.run([caviar, "generate", "lda", "--docs", "900", "--words", "120", "--topics", "4",
                    "--seed", "7", "--out", corpus], check=True, capture_output=True, env=env)
    rng = np.random.default_rng(7)
    with h5py.File(path("bin.h5"), "w") as f:
        f["X"] = (rng.random((600, 16)) < 0.3).astype(np.float32)
    gmm = ["gmm", "fit", "--data", gen + ":/X", "-k", "4", "--seed", "3", "--tol", "0"]
    out = {}
    for cov in ("full", "diag"):
        for name, extra in (("cavi", ["--max-iter", "20"]),
                            ("svi", ["--algorithm", "svi", "--batch-size", "256", "--max-iter",
                                     "3"]),
                            ("em", ["--algorithm", "em", "--max-iter", "20"]),
                            ("stick", ["--weights", "stick-breaking", "--max-iter", "20"])):
            out[f"gmm-{name}-{cov}"] = (gmm + extra + ["--covariance", cov], True)
    lda = ["lda", "fit", "--data", corpus, "-k", "4", "--seed", "3"]
    for stream in ((), ("--stream",)):
        tag = "-stream" if stream else ""
        out[f"lda-cavi{tag}"] = (lda + ["--algorithm", "cavi", "--max-iter", "6", "--tol", "0"]
                                 + list(stream), False)
        out[f"lda-svi{tag}"] = (lda + ["--algorithm", "svi", "--max-iter", "3", "--batch-size",
                                       "128"] + list(stream), False)
    out["vae"] = (["vae", "train", "--data", path("bin.h5") + ":/X", "--hidden", "12",
                   "--latent", "2", "--batch-size", "50", "--max-iter", "2", "--seed", "3"], False)
    out["vae-conv"] = (["vae", "train", "--data", path("bin.h5") + ":/X", "--arch", "conv",
                        "--image", "1x4x4", "--channels", "3,4", "--latent", "2", "--batch-size",
                        "50", "--max-iter", "2", "--seed", "3"], False)
    out["plsa"] = (["plsa", "fit", "--data", corpus, "-k", "4", "--seed", "3", "--max-iter", "6",
                    "--tol", "0", "--doc-topics", "{tag}_doc_topics.h5"], False)
    for emission, extra in (("gaussian", ["--dim", "3"]), ("categorical", ["--symbols", "6"])):
        subprocess.run([caviar, "generate", "hmm", "--sequences", "80", "--length", "20-90",
                        "--states", "3", "--emission", emission, "--seed", "7", "--out",
                        path(f"hmm_{emission}.h5")] + extra,
                       check=True, capture_output=True, env=env)
    for name, emission, extra in (
            ("em-full", "gaussian", ["--algorithm", "em", "--covariance", "full"]),
            ("cavi-diag", "gaussian", ["--algorithm", "cavi", "--covariance", "diag"]),
            ("svi-categorical", "categorical", ["--algorithm", "svi", "--batch-size", "16"])):
        out[f"hmm-{name}"] = (["hmm", "fit", "--data", path(f"hmm_{emission}.h5"), "--states", "4",
                               "--emission", emission, "--seed", "3", "--max-iter", "8", "--tol",
                               "0", "--posteriors", "{tag}_posteriors.h5"] + extra, False)
    for family in ("logistic", "poisson", "softmax"):
        subprocess.run([caviar, "generate", "glm", "--family", family, "--n", "1500", "--dim",
                        "5", "--seed", "7", "--out", path(f"glm_{family}.h5")]
                       + (["--classes", "3"] if family == "softmax" else []),
                       check=True, capture_output=True, env=env)
    for name, family, extra in (
            ("fullrank", "logistic", ["--family", "fullrank", "--estimator", "reparam"]),
            ("meanfield-score-cv", "poisson", ["--family", "meanfield", "--estimator",
                                               "score-cv"]),
            ("lowrank-softmax", "softmax", ["--family", "lowrank", "--rank", "2", "--estimator",
                                            "reparam", "--classes", "3"])):
        glm = path(f"glm_{family}.h5")
        out[f"bbvi-{name}"] = (["bbvi", "fit", "--model", family, "--data", glm + ":/X",
                                "--response", glm + ":/y", "--batch-size", "128", "--samples",
                                "4", "--max-iter", "60", "--tol", "0", "--elbo-every", "20",
                                "--elbo-rows", "500", "--elbo-samples", "4",
                                "--diagnostic-samples", "100", "--seed", "3"] + extra, False)
    return out


def run_matrix(caviar, work):
    # Runs inside the work directory with relative names: file names are recorded in the outputs
    # (the "data" attribute), and must not depend on where the work directory is.
    fresh_workdir(work)
    caviar = os.path.abspath(caviar)
    os.chdir(work)

    def path(name):
        return name

    env = dict(os.environ, OMP_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    hashes, disagree = {}, []
    for name, (argv, labels) in matrix(caviar, path).items():
        per_rank = {}
        for p in RANKS:
            files = [path(f"{name}_{p}.h5")]
            flags = ["--out", files[0]]
            # A second output named in argv ("{tag}_..."): per rank count, and hashed too.
            argv_p = [a.replace("{tag}", f"{name}_{p}") for a in argv]
            files += [a for a, b in zip(argv_p, argv) if a != b]
            if labels:
                files.append(path(f"{name}_{p}_labels.h5"))
                flags += ["--labels", files[-1], "--save-responsibilities"]
            r = subprocess.run(mpirun(p) + [caviar] + argv_p + flags, capture_output=True,
                               text=True, env=env, timeout=600)
            if r.returncode != 0:
                sys.exit(f"FAIL: {name} at {p} ranks: {r.stderr.strip()[-400:]}")
            per_rank[p] = digest(files)
        if len(set(per_rank.values())) != 1:
            disagree.append(name)
        hashes[name] = per_rank[1]
        print(f"{name:18s} {per_rank[1][:16]}"
              f"{'' if len(set(per_rank.values())) == 1 else '  RANKS DISAGREE'}", flush=True)
    return hashes, disagree


def main():
    args = sys.argv[1:]
    key = isa_key()
    if "--as-key" in args:
        i = args.index("--as-key")
        if i + 1 >= len(args):
            sys.exit("golden.py: --as-key needs a key, e.g. sse4_2+avx+avx2+fma")
        key = args[i + 1]
        del args[i:i + 2]
        if not set(key.split("+")) <= set(isa_key().split("+")):
            sys.exit(f"golden.py: this CPU ({isa_key()}) cannot run a binary for {key}")
    if len(args) not in (3, 4) or args[0] not in ("record", "check"):
        sys.exit(__doc__.rsplit("usage: ", 1)[1].strip())
    mode, caviar, work = args[0], args[1], args[2]
    record = args[3] if len(args) > 3 else os.path.join(HERE, "hashes.json")
    stored = json.load(open(record)) if os.path.exists(record) else {}
    if mode == "check" and key not in stored:
        print(f"SKIP: no golden hashes recorded for this CPU's vector features ({key}); "
              f"recorded: {sorted(stored)}")
        sys.exit(77)
    hashes, disagree = run_matrix(caviar, work)
    if disagree:
        sys.exit(f"FAIL: rank counts {RANKS} give different outputs for {disagree}")
    if mode == "record":
        stored[key] = hashes
        with open(record, "w") as f:
            json.dump(stored, f, indent=1, sort_keys=True)
            f.write("\n")
        print(f"recorded {len(hashes)} hashes for {key} in {record}")
        return
    want = stored[key]
    missing = sorted(set(want) - set(hashes))
    if missing:
        sys.exit(f"FAIL: the record has fits the matrix no longer runs: {missing}")
    unrecorded = sorted(set(hashes) - set(want))
    if unrecorded:
        print(f"NOT COMPARED: no record for {key} of {unrecorded}; record that key again on a "
              f"machine that has it")
    changed = sorted(k for k in want if want[k] != hashes[k])
    if changed:
        sys.exit(f"FAIL: outputs changed bits against the golden record: {changed}")
    print(f"PASS: {len(want)} golden hashes reproduced at {RANKS} ranks")


if __name__ == "__main__":
    main()
