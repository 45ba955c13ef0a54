#!/usr/bin/env -S /usr/bin/python3
"""Adversarial bitwise test: outputs must not depend on where the heap or the stack puts a buffer.

Every model and algorithm is run on small problems (N from 1 to 300: below, at and above one
256-row block; K = N; N = P; a rank holding one row) once as a reference (1 rank, 1 thread, the
plain allocator) and then under varied memory layouts, each at another (ranks, threads) pair
(half of the layouts at each size, the other half at the next, so that every problem meets
every layout within each of the two ctest parts):

  - offset shim (heap_offset.so, LD_PRELOAD): every heap block 8, 16, 32 or 48 bytes past a
    64-byte boundary, or a per-allocation random offset in {0, 16, 32, 48};
  - glibc malloc tunables: every block of 4 KiB or more from mmap (page aligned), a large top pad,
    no thread cache;
  - the size of the environment (shifts the initial stack and whatever is copied from it).

Every dataset and attribute of every output file must be the same bytes as the reference's
(provenance and timings excepted, as in test_bitwise.py).

usage: test_heap_layout.py CAVIAR_BIN HEAP_OFFSET_SO WORKDIR [--quick] [--only SUBSTRING]
                          [--sizes small|blocks]

--sizes runs a part of the N values (ctest runs the two parts as two tests, each within its own
time limit): small = 1, 2, 3, 6, 10; blocks = 255, 256, 257, 300.
"""
import concurrent.futures
import os
import subprocess
import sys

import h5py
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "cli"))
from clitest import fresh_workdir, h5_differences, mpirun  # noqa: E402

SIZES = {"small": [1, 2, 3, 6, 10], "blocks": [255, 256, 257, 300]}
N_VALUES = SIZES["small"] + SIZES["blocks"]


def layouts(shim):
    """(name, extra environment) of each adversarial layout."""
    pre = {"LD_PRELOAD": shim}
    return [
        ("offset8", dict(pre, CAVIAR_HEAP_OFFSET="8")),
        ("offset16", dict(pre, CAVIAR_HEAP_OFFSET="16")),
        ("offset32", dict(pre, CAVIAR_HEAP_OFFSET="32")),
        ("offset48", dict(pre, CAVIAR_HEAP_OFFSET="48")),
        ("random1", dict(pre, CAVIAR_HEAP_OFFSET="random:1")),
        ("random2", dict(pre, CAVIAR_HEAP_OFFSET="random:2")),
        ("tunables", {"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=4096:"
                                        "glibc.malloc.top_pad=1048611:glibc.malloc.tcache_count=0"}),
        ("envpad", {"CAVIAR_ENV_PAD": "x" * 1000 + "y" * 37}),
    ]


def variants(n, shim, half):
    """The adversarial runs of one problem: half of the layouts (half 0: the even-numbered ones,
    half 1: the odd), each at its own (ranks, threads) pair. A half covers P = 1..min(4, N), and
    the two halves give each P the other thread count, so a problem run at two sizes, one per
    half, meets every layout and every P x T pair in {1..4} x {1, 2}. (All 8 layouts at every
    size took 250 s per test of the two, about a third of ctest's time; measured to be CPU-bound
    on the 2 cores, so more workers do not help.)"""
    ranks = list(range(1, min(4, n) + 1))
    out = []
    for j, (name, env) in enumerate(layouts(shim)[half::2]):
        out.append((name, ranks[j % len(ranks)], 1 + (j + half) % 2, env))
    return out


def command(caviar, ranks, env):
    """Ranks start under `env` (LD_PRELOAD reaches caviar only, not mpirun); one rank runs
    without mpirun, as a singleton."""
    pre = ["env"] + [f"{k}={v}" for k, v in env.items()]
    if ranks == 1:
        return pre + [caviar]
    return mpirun(ranks) + pre + [caviar]


def make_data(caviar, path, n):
    """The inputs for size n: dense rows (D = 2 and D = 5) and binary rows, and a corpus."""
    rng = np.random.RandomState(n)
    files = {}
    with h5py.File(path(f"x{n}.h5"), "w") as f:
        f["X"] = rng.rand(n, 2)
        f["Y"] = rng.randn(n, 5) + np.repeat(rng.randn(3, 5) * 3, n // 3 + 1, axis=0)[:n]
        f["B"] = (rng.rand(n, 12) < 0.3).astype(np.float32)
    files["dense"] = path(f"x{n}.h5")
    corpus = path(f"corpus{n}.h5")
    r = subprocess.run([caviar, "generate", "lda", "--docs", str(n), "--words", "40", "--topics",
                        "3", "--seed", str(n), "--out", corpus], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"FAIL: generate lda --docs {n}: {r.stderr}")
    files["corpus"] = corpus
    for emission, extra in (("gaussian", ["--dim", "2"]), ("categorical", ["--symbols", "5"])):
        seqs = path(f"hmm_{emission}{n}.h5")
        r = subprocess.run([caviar, "generate", "hmm", "--sequences", str(n), "--length", "2-12",
                            "--states", "3", "--emission", emission, "--seed", str(n), "--out",
                            seqs] + extra, capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(f"FAIL: generate hmm --sequences {n}: {r.stderr}")
        files[f"hmm_{emission}"] = seqs
    return files


def problems(files, n):
    """(name, argv without the binary and outputs, output flags) for size n."""
    dense, corpus = files["dense"], files["corpus"]
    k = min(3, n)
    gmm = ["gmm", "fit", "--seed", "2055650130", "--tol", "0.001", "--max-iter", "30"]
    out = {
        "gmm-cavi-full": gmm + ["--data", dense + ":/X", "-k", str(k), "--prior-mean", "data",
                                "--prior-scale", "data"],
        "gmm-cavi-full-d5": gmm + ["--data", dense + ":/Y", "-k", str(k)],
        "gmm-cavi-diag": gmm + ["--data", dense + ":/Y", "-k", str(k), "--covariance", "diag"],
        "gmm-cavi-tied": gmm + ["--data", dense + ":/Y", "-k", str(k), "--covariance", "tied"],
        "gmm-em-spherical": gmm + ["--data", dense + ":/Y", "-k", str(k), "--algorithm", "em",
                                   "--covariance", "spherical"],
        "gmm-cavi-kn": gmm + ["--data", dense + ":/X", "-k", str(n), "--init", "random"],
        "gmm-cavi-single": gmm + ["--data", dense + ":/Y", "-k", str(k), "--precision", "single"],
        "gmm-svi": gmm + ["--data", dense + ":/Y", "-k", str(k), "--algorithm", "svi",
                          "--batch-size", str(max(1, n // 3))],
        "gmm-svi-stream": gmm + ["--data", dense + ":/X", "-k", str(k), "--algorithm", "svi",
                                 "--stream", "--init", "random", "--schedule", "adaptive",
                                 "--batch-size", str(max(1, n // 2))],
        "gmm-em-full": gmm + ["--data", dense + ":/Y", "-k", str(k), "--algorithm", "em"],
        "gmm-em-diag": gmm + ["--data", dense + ":/X", "-k", str(k), "--algorithm", "em",
                              "--covariance", "diag"],
        "gmm-stick": gmm + ["--data", dense + ":/X", "-k", str(k), "--weights",
                            "stick-breaking", "--heldout", dense + ":/X"],
        "lda-cavi": ["lda", "fit", "--data", corpus, "-k", "3", "--algorithm", "cavi",
                     "--max-iter", "5", "--seed", "3"],
        "lda-svi": ["lda", "fit", "--data", corpus, "-k", "3", "--algorithm", "svi",
                    "--max-iter", "2", "--batch-size", str(max(1, n // 2)), "--seed", "3"],
        "lda-cavi-stream": ["lda", "fit", "--data", corpus, "-k", "3", "--algorithm", "cavi",
                            "--max-iter", "5", "--seed", "3", "--stream"],
        "plsa": ["plsa", "fit", "--data", corpus, "--topics", "3", "--max-iter", "5", "--seed",
                 "3", "--smooth", "0.5", "--heldout", corpus],
        "hmm-em-full": ["hmm", "fit", "--data", files["hmm_gaussian"], "--states", "3",
                        "--emission", "gaussian", "--covariance", "full", "--algorithm", "em",
                        "--max-iter", "10", "--seed", "3"],
        "hmm-cavi-diag": ["hmm", "fit", "--data", files["hmm_gaussian"], "--states", "3",
                          "--emission", "gaussian", "--covariance", "diag", "--algorithm", "cavi",
                          "--max-iter", "10", "--seed", "3"],
        "hmm-cavi-cat": ["hmm", "fit", "--data", files["hmm_categorical"], "--states", "3",
                         "--emission", "categorical", "--algorithm", "cavi", "--max-iter", "10",
                         "--seed", "3"],
        "vae": ["vae", "train", "--data", dense + ":/B", "--hidden", "8", "--latent", "2",
                "--batch-size", str(max(1, n // 2)), "--micro-blocks", str(min(4, max(1, n // 2))),
                "--max-iter", "2", "--seed", "5"],
    }
    return out


def outputs_of(name, path, tag):
    """Output flags and the files they write."""
    if name.startswith("gmm") and "stream" not in name:  # --stream writes no labels
        files = [path(f"{tag}.h5"), path(f"{tag}_labels.h5")]
        return ["--out", files[0], "--labels", files[1], "--save-responsibilities"], files
    if name.startswith("hmm"):
        files = [path(f"{tag}.h5"), path(f"{tag}_posteriors.h5")]
        return ["--out", files[0], "--posteriors", files[1]], files
    if name.startswith("plsa"):
        files = [path(f"{tag}.h5"), path(f"{tag}_doc_topics.h5")]
        return ["--out", files[0], "--doc-topics", files[1]], files
    files = [path(f"{tag}.h5")]
    return ["--out", files[0]], files


def run_one(caviar, argv, ranks, threads, env, timeout=300):
    full_env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    r = subprocess.run(command(caviar, ranks, env) + argv, capture_output=True, text=True,
                       timeout=timeout, env=full_env)
    return r.returncode, r.stderr


def main():
    args = sys.argv[1:]
    quick = "--quick" in args
    only = None
    if "--only" in args:
        only = args[args.index("--only") + 1]
        del args[args.index("--only"):args.index("--only") + 2]
    n_values = [3, 10, 257] if quick else N_VALUES
    if "--sizes" in args:
        n_values = SIZES[args[args.index("--sizes") + 1]]
        del args[args.index("--sizes"):args.index("--sizes") + 2]
    args = [a for a in args if a != "--quick"]
    caviar, shim, work = args[0], args[1], args[2]
    path = fresh_workdir(work)
    failures, checked = [], 0
    jobs = []  # (problem, n, reference argv+files, variant list)
    for s, n in enumerate(n_values):
        files = make_data(caviar, path, n)
        for i, (name, argv) in enumerate(problems(files, n).items()):
            if only and only not in name:
                continue
            # Consecutive sizes take the two halves of the layouts in turn (see variants()).
            jobs.append((name, n, argv, (i + s) % 2))

    def do_problem(job):
        name, n, argv, half = job
        flags, ref_files = outputs_of(name, path, f"{name}_{n}_ref")
        rc, err = run_one(caviar, argv + flags, 1, 1, {})
        if rc != 0:
            # A problem the command refuses (e.g. too few rows) must be refused the same way under
            # every layout; it has no outputs to compare.
            line = err.strip().splitlines()[-1] if err.strip() else f"exit {rc}"
            results = []
            for lay, p, t, env in variants(n, shim, half):
                rc2, err2 = run_one(caviar, argv + flags, p, t, env)
                same = rc2 == rc
                results.append((lay, p, t, same, f"exit {rc2} vs {rc}" if not same else ""))
            return name, n, f"refused: {line}", results
        results = []
        for lay, p, t, env in variants(n, shim, half):
            vflags, vfiles = outputs_of(name, path, f"{name}_{n}_{lay}")
            rc2, err2 = run_one(caviar, argv + vflags, p, t, env)
            if rc2 != 0:
                results.append((lay, p, t, False, f"exit {rc2}: {err2.strip()[-300:]}"))
                continue
            bad = []
            for a, b in zip(ref_files, vfiles):
                bad += h5_differences(a, b)
            results.append((lay, p, t, not bad, ", ".join(bad[:5])))
            for f in vfiles:
                os.remove(f)
        return name, n, "ok", results

    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        for name, n, status, results in pool.map(do_problem, jobs):
            bad = [r for r in results if not r[3]]
            checked += len(results)
            tag = "identical" if not bad else "DIFFERENT"
            print(f"{name:18s} N={n:<4d} {status[:60]:12s} {len(results)} layouts: {tag}",
                  flush=True)
            for lay, p, t, _, why in bad:
                print(f"    {lay} P={p} T={t}: {why}", flush=True)
                failures.append(f"{name} N={n} {lay} P={p} T={t}")
    if failures:
        raise SystemExit(f"FAIL: {len(failures)} of {checked} runs differ from their reference: "
                         f"{failures[:10]}")
    print(f"PASS: {checked} runs under varied heap/stack layouts, ranks and threads, all "
          f"identical to their references")


if __name__ == "__main__":
    main()
