#!/usr/bin/env -S /usr/bin/python3
"""`caviar gmm sample --data ... --sampler blocked`: the blocked Gibbs sampler of the Bayesian
mixture on the engine's sampler driver.

On 2-D data with 3 generated components (`caviar generate gmm --seed 8`: centres at least 6.4
apart, standard deviations below 1; 1,500 training and 1,500 held-out rows), a chain of 200
sweeps (50 burn-in) is run. Checks:
  - the chain file and the labels file are the same bits at 1, 2 and 3 ranks and at 1 and 2
    threads (timings and provenance aside), and another seed gives another chain;
  - a chain checkpointed every 70 sweeps and resumed from its last checkpoint (sweep 140) at
    another rank count gives the same bits as the uninterrupted chain, and so does a chain
    stopped by SIGTERM (exit 75) and resumed; that checkpoint resumed to --sweeps 100, or to
    --sweeps 140 with --labels (the labels of sweep 140 are not in it), is refused in one line;
  - the file's shapes: trace/log_joint, trace/heldout, trace/seconds (200), trace/counts
    (200 x 3, each row summing to N), draws/weights (150 x 3, rows summing to 1), draws/means
    (150 x 3 x 2), draws/covariances (150 x 3 x 2 x 2, symmetric positive definite), /labels (N);
  - after matching components (Hungarian, scipy.optimize.linear_sum_assignment), the posterior
    means of the draws are within 0.05 of a `gmm fit --algorithm cavi` fit's means, and the
    final held-out density is within 0.05 nats of CAVI's held-out score;
  - the diagonal sampler runs and its covariances are K x D.

usage: test_gmm_gibbs.py CAVIAR_BIN WORKDIR
"""
import json
import os
import signal
import subprocess
import sys

import h5py
import numpy as np
from scipy.optimize import linear_sum_assignment

from clitest import fresh_workdir, h5_differences, mpirun

N, K, SWEEPS, BURN = 1500, 3, 200, 50


def run(argv, threads=1):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    r = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)
    if r.returncode != 0:
        raise SystemExit(f"FAIL: {' '.join(argv)}\n{r.stderr}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def chain_argv(caviar, p, name, seed=1, sweeps=SWEEPS):
    return [caviar, "gmm", "sample", "--data", p("train.h5") + ":/X", "--components", str(K),
            "--sampler", "blocked", "--sweeps", str(sweeps), "--burn-in", str(BURN), "--thin", "1",
            "--init", "kmeans++", "--seed", str(seed), "--heldout", p("test.h5") + ":/X",
            "--out", p(name + ".h5"), "--labels", p(name + "_labels.h5")]


def chain(caviar, p, name, ranks=1, threads=1, extra=(), seed=1):
    argv = chain_argv(caviar, p, name, seed)
    run(mpirun(ranks) + argv[:1] + ["-q"] + argv[1:] + list(extra), threads)
    return p(name + ".h5"), p(name + "_labels.h5")


def signal_resume(caviar, p, base, base_labels):
    """SIGTERM to a one-process chain of 10^5 sweeps at its first progress line: exit 75 with a
    checkpoint; resumed to 200 sweeps at 2 ranks, it is the uninterrupted chain's bits."""
    ck = p("sig_ck.h5")
    argv = chain_argv(caviar, p, "sig", sweeps=100000) + ["--checkpoint", ck]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)
    for line in proc.stderr:
        if line.startswith("sweep"):
            proc.send_signal(signal.SIGTERM)
            break
    _, err = proc.communicate(timeout=60)
    if proc.returncode != 75:
        raise SystemExit(f"FAIL: SIGTERM gave exit {proc.returncode}, expected 75\n{err}")
    with h5py.File(ck, "r") as f:
        stopped = int(f.attrs["iteration"])
    if not 1 <= stopped < SWEEPS:
        raise SystemExit(f"FAIL: stopped after sweep {stopped}; the test needs 1..{SWEEPS - 1}")
    resumed, resumed_labels = chain(caviar, p, "sig_resumed", ranks=2, extra=["--resume", ck])
    same(f"signal at sweep {stopped}, resume (chain)", base, resumed)
    same(f"signal at sweep {stopped}, resume (labels)", base_labels, resumed_labels)
    print(f"SIGTERM: stopped after sweep {stopped}, resumed at 2 ranks: same bits")


def same(what, first, *others):
    bad = h5_differences(first, *others)
    if bad:
        raise SystemExit(f"FAIL: {what}: differ in {bad}")


def main():
    caviar, work = sys.argv[1], sys.argv[2]
    p = fresh_workdir(work)
    run([caviar, "-q", "generate", "gmm", "--n", str(2 * N), "--dim", "2", "--components", str(K),
         "--seed", "8", "--out", p("all.h5") + ":/X"])
    with h5py.File(p("all.h5"), "r") as f:
        x = f["X"][()]
    with h5py.File(p("train.h5"), "w") as f:
        f["X"] = x[:N]
    with h5py.File(p("test.h5"), "w") as f:
        f["X"] = x[N:]

    # Bitwise: ranks, threads; another seed differs.
    base, base_labels = chain(caviar, p, "r1")
    runs = [chain(caviar, p, "r2", ranks=2), chain(caviar, p, "r3", ranks=3),
            chain(caviar, p, "t2", threads=2)]
    same("ranks/threads (chain)", base, *[r[0] for r in runs])
    same("ranks/threads (labels)", base_labels, *[r[1] for r in runs])
    other, _ = chain(caviar, p, "seed2", ranks=2, seed=2)
    if not h5_differences(base, other):
        raise SystemExit("FAIL: --seed 2 gave the same chain as --seed 1")

    # Checkpoint every 70 sweeps at 1 rank (last at sweep 140), resume at 2 ranks.
    ck = p("ck.h5")
    chain(caviar, p, "ck_run", extra=["--checkpoint", ck, "--checkpoint-every", "70"])
    with h5py.File(ck, "r") as f:
        if int(f.attrs["iteration"]) != 140:
            raise SystemExit(f"FAIL: checkpoint at sweep {f.attrs['iteration']}, expected 140")
    resumed, resumed_labels = chain(caviar, p, "resumed", ranks=2, extra=["--resume", ck])
    same("resume (chain)", base, resumed)
    same("resume (labels)", base_labels, resumed_labels)
    # A checkpoint of 140 sweeps cannot be resumed to fewer, nor give the labels of sweep 140.
    for sweeps, extra, msg in ((100, [], "more than --sweeps 100"),
                               (140, ["--labels", p("l140.h5")], "not the labels of the last")):
        argv = chain_argv(caviar, p, "short", sweeps=sweeps)
        argv = argv[:argv.index("--labels")] + extra + ["--resume", ck]
        r = subprocess.run(mpirun(2) + argv, capture_output=True, text=True, timeout=60)
        errors = [line for line in r.stderr.splitlines() if line.startswith("caviar: ")]
        if r.returncode == 0 or len(errors) != 1 or msg not in errors[0]:
            raise SystemExit(f"FAIL: resume to --sweeps {sweeps}: rc {r.returncode}, {errors}")
        print(f"resume to --sweeps {sweeps}: {errors[0]}")

    signal_resume(caviar, p, base, base_labels)

    # Shapes and invariants.
    with h5py.File(base, "r") as f:
        for name in ("log_joint", "heldout", "seconds"):
            assert f["trace/" + name].shape == (SWEEPS,), name
        counts = f["trace/counts"][()]
        w, m, c = f["draws/weights"][()], f["draws/means"][()], f["draws/covariances"][()]
        heldout = f["trace/heldout"][()]
        assert f.attrs["model"] == "gmm" and f.attrs["n_draws"] == SWEEPS - BURN
    D = SWEEPS - BURN
    assert counts.shape == (SWEEPS, K) and np.all(counts.sum(1) == N), counts.sum(1)
    assert w.shape == (D, K) and np.allclose(w.sum(1), 1), w.shape
    assert m.shape == (D, K, 2) and c.shape == (D, K, 2, 2), (m.shape, c.shape)
    assert np.allclose(c, c.transpose(0, 1, 3, 2)) and np.all(np.linalg.eigvalsh(c) > 0)
    with h5py.File(base_labels, "r") as f:
        labels = f["labels"][()]
    assert labels.shape == (N,) and np.array_equal(np.bincount(labels, minlength=K), counts[-1])

    # Against CAVI (priors: gmm fit's defaults, as the sampler's).
    cavi = p("cavi.h5")
    fit = run(mpirun(2) + [caviar, "-q", "gmm", "fit", "--data", p("train.h5") + ":/X",
                           "-k", str(K), "--algorithm", "cavi", "--seed", "1", "--max-iter", "300",
                           "--tol", "1e-10", "--heldout", p("test.h5") + ":/X", "--out", cavi])
    with h5py.File(cavi, "r") as f:
        cavi_means = f["means"][()]
    post = m.mean(0)
    cost = ((post[:, None, :] - cavi_means[None, :, :]) ** 2).sum(-1)
    rows, cols = linear_sum_assignment(cost)
    err = np.abs(post[rows] - cavi_means[cols]).max()
    print(f"posterior means vs CAVI: max |diff| = {err:.4f}; held-out: chain {heldout[BURN:].mean():.4f}"
          f" (last {heldout[-1]:.4f}), CAVI {fit['heldout']:.4f}")
    if not err < 0.05:
        raise SystemExit(f"FAIL: posterior means differ from CAVI's by {err}")
    if not abs(heldout[BURN:].mean() - fit["heldout"]) < 0.05:
        raise SystemExit(f"FAIL: held-out {heldout[BURN:].mean()} vs CAVI {fit['heldout']}")

    # Diagonal covariance.
    diag, _ = chain(caviar, p, "diag", ranks=2, extra=["--covariance", "diag"])
    with h5py.File(diag, "r") as f:
        assert f["draws/covariances"].shape == (D, K, 2), f["draws/covariances"].shape
        assert np.all(f["draws/covariances"][()] > 0)
    print("OK")


if __name__ == "__main__":
    main()
