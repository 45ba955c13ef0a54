#!/usr/bin/env -S /usr/bin/python3
"""`caviar gmm sample --data ... --sampler collapsed`: the collapsed Gibbs sampler of the Bayesian
mixture (parameters integrated out, labels swept in fixed blocks of --block-rows rows).

Checks:
  - exactness: on N = 8 one-dimensional points with K = 2 and --block-rows 8 (one block: the exact
    sequential sampler), the posterior p(z | X) is enumerated over all 2^8 labelings (the
    Dirichlet-multinomial times each component's Normal-Wishart marginal likelihood, Bruno 2022,
    eq. 2.36; Murphy 2007, eq. 266, written out here independently of the C++). The labeling of
    each recorded sweep is read back from draws/sums (the 256 subset sums of the data are
    distinct), and the chain's frequencies are chi-square tested against the enumeration at a
    fixed seed (bins with expected count < 5 merged). The blocked approximation (--block-rows 2)
    is measured against the same enumeration (total variation distance, printed);
  - on 2-D data with 3 generated components (1,500 training and 1,500 held-out rows, as
    test_gmm_gibbs.py), a chain of 200 sweeps (50 burn-in): the chain and labels files are the
    same bits at 1, 2 and 3 ranks and at 2 threads; a chain checkpointed every 70 sweeps and
    resumed at 2 ranks from sweep 140 is the same bits; the shapes of trace/ and draws/; after
    Hungarian matching, the posterior means E[mu_k | z] = (beta0 m0 + sum_k)/(beta0 + N_k)
    averaged over draws are within 0.05 of CAVI's means, and the average held-out density after
    burn-in within 0.05 nats of CAVI's held-out score.

usage: test_gmm_collapsed.py CAVIAR_BIN WORKDIR
"""
import itertools
import json
import os
import subprocess
import sys

import h5py
import numpy as np
from scipy.optimize import linear_sum_assignment
from scipy.special import gammaln
from scipy.stats import chi2

from clitest import fresh_workdir, h5_differences, mpirun

N, K, SWEEPS, BURN = 1500, 3, 200, 50


def run(argv, threads=1):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    r = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)
    if r.returncode != 0:
        raise SystemExit(f"FAIL: {' '.join(argv)}\n{r.stderr}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def same(what, first, *others):
    bad = h5_differences(first, *others)
    if bad:
        raise SystemExit(f"FAIL: {what}: differ in {bad}")


def log_marginal_1d(x, beta0=1.0, m0=0.0, w0_inv=1.0, nu0=1.0):
    """log p(x_1..x_n) under N(mu | m0, (beta0 lam)^-1) W(lam | W0, nu0), D = 1 (Murphy 2007,
    eq. 266 with Lambda = W^-1, kappa = beta)."""
    n = len(x)
    if n == 0:
        return 0.0
    xbar = np.mean(x)
    beta, nu = beta0 + n, nu0 + n
    w_inv = w0_inv + np.sum((x - xbar) ** 2) + beta0 * n / beta * (xbar - m0) ** 2
    return (-0.5 * n * np.log(np.pi) + 0.5 * np.log(beta0 / beta) + gammaln(nu / 2)
            - gammaln(nu0 / 2) + 0.5 * nu0 * np.log(w0_inv) - 0.5 * nu * np.log(w_inv))


def exact_posterior(x, k=2, alpha0=0.5):
    """p(z | X) over all k^n labelings, index = sum_i z_i 2^i (k = 2)."""
    n = len(x)
    logp = []
    for z in itertools.product(range(k), repeat=n):
        z = np.array(z[::-1])  # z[i] is bit i of the index
        counts = np.bincount(z, minlength=k)
        lp = gammaln(k * alpha0) - gammaln(n + k * alpha0) + np.sum(gammaln(counts + alpha0) -
                                                                    gammaln(alpha0))
        lp += sum(log_marginal_1d(x[z == j]) for j in range(k))
        logp.append(lp)
    logp = np.array(logp)
    p = np.exp(logp - logp.max())
    return p / p.sum()


def chi_square(counts, expected):
    """Pearson's statistic and degrees of freedom, the smallest expectations merged until every
    bin expects at least 5."""
    obs_bins, exp_bins, acc_o, acc_e = [], [], 0.0, 0.0
    for i in np.argsort(expected):
        acc_o += counts[i]
        acc_e += expected[i]
        if acc_e >= 5:
            obs_bins.append(acc_o)
            exp_bins.append(acc_e)
            acc_o = acc_e = 0.0
    exp_bins[-1] += acc_e
    obs_bins[-1] += acc_o
    o, e = np.array(obs_bins), np.array(exp_bins)
    return float(np.sum((o - e) ** 2 / e)), len(o) - 1


def enumeration_check(caviar, p):
    x = np.array([-2.3137, -1.9021, -1.1468, -0.4213, 0.3719, 1.2087, 1.6423, 2.5171])
    with h5py.File(p("tiny.h5"), "w") as f:
        f["X"] = x[:, None]
    target = exact_posterior(x)
    subset_sums = np.array([x[[(i >> b) & 1 == 0 for b in range(8)]].sum() for i in range(256)])
    assert np.min(np.diff(np.sort(subset_sums))) > 1e-6

    def frequencies(block_rows, sweeps, name):
        out = p(name + ".h5")
        run([caviar, "-q", "gmm", "sample", "--data", p("tiny.h5") + ":/X", "-k", "2",
             "--sampler", "collapsed", "--block-rows", str(block_rows), "--sweeps", str(sweeps),
             "--burn-in", "100", "--thin", "2", "--init", "random", "--seed", "3", "--out", out])
        with h5py.File(out, "r") as f:
            sums = f["draws/sums"][()][:, 0, 0]  # component 0's sum of each recorded sweep
        # Component 0 holds the rows with z_i = 0: bit i of the labeling index is 1 elsewhere.
        idx = np.abs(sums[:, None] - subset_sums[None, :]).argmin(1)
        assert np.all(np.abs(sums - subset_sums[idx]) < 1e-9)
        return np.bincount(idx, minlength=256), len(idx)

    counts, m = frequencies(8, 40100, "exact")
    stat, dof = chi_square(counts, target * m)
    pval = chi2.sf(stat, dof)
    tv = 0.5 * np.abs(counts / m - target).sum()
    print(f"exact sampler (--block-rows 8): {m} draws, chi-square {stat:.1f} on {dof} dof, "
          f"p = {pval:.3g}, total variation to p(z|X) {tv:.4f}")
    if pval < 1e-3:
        raise SystemExit(f"FAIL: the collapsed chain's labelings differ from p(z | X) (p = {pval})")
    # The blocked approximation with 4 blocks of 2 rows (stale counts of the other 6 rows): its
    # departure, measured; and the power of the check above, which must reject it.
    approx, m2 = frequencies(2, 40100, "approx")
    tv2 = 0.5 * np.abs(approx / m2 - target).sum()
    stat2, dof2 = chi_square(approx, target * m2)
    print(f"blocked approximation (--block-rows 2): total variation to p(z|X) {tv2:.4f}, "
          f"chi-square {stat2:.1f} on {dof2} dof, p = {chi2.sf(stat2, dof2):.3g}")
    if not chi2.sf(stat2, dof2) < 1e-3:
        raise SystemExit("FAIL: the chi-square check does not tell the approximation apart")


def chain_argv(caviar, p, name, seed=1, sweeps=SWEEPS):
    return [caviar, "gmm", "sample", "--data", p("train.h5") + ":/X", "--components", str(K),
            "--sampler", "collapsed", "--sweeps", str(sweeps), "--burn-in", str(BURN), "--thin",
            "1", "--init", "kmeans++", "--seed", str(seed), "--heldout", p("test.h5") + ":/X",
            "--out", p(name + ".h5"), "--labels", p(name + "_labels.h5")]


def chain(caviar, p, name, ranks=1, threads=1, extra=(), seed=1):
    argv = chain_argv(caviar, p, name, seed)
    run(mpirun(ranks) + argv[:1] + ["-q"] + argv[1:] + list(extra), threads)
    return p(name + ".h5"), p(name + "_labels.h5")


def main():
    caviar, work = sys.argv[1], sys.argv[2]
    p = fresh_workdir(work)
    enumeration_check(caviar, p)

    run([caviar, "-q", "generate", "gmm", "--n", str(2 * N), "--dim", "2", "--components", str(K),
         "--seed", "8", "--out", p("all.h5") + ":/X"])
    with h5py.File(p("all.h5"), "r") as f:
        x = f["X"][()]
    with h5py.File(p("train.h5"), "w") as f:
        f["X"] = x[:N]
    with h5py.File(p("test.h5"), "w") as f:
        f["X"] = x[N:]

    base, base_labels = chain(caviar, p, "r1")
    runs = [chain(caviar, p, "r2", ranks=2), chain(caviar, p, "r3", ranks=3),
            chain(caviar, p, "t2", threads=2)]
    same("ranks/threads (chain)", base, *[r[0] for r in runs])
    same("ranks/threads (labels)", base_labels, *[r[1] for r in runs])
    other, _ = chain(caviar, p, "seed2", seed=2)
    if not h5_differences(base, other):
        raise SystemExit("FAIL: --seed 2 gave the same chain as --seed 1")
    print("1, 2, 3 ranks and 2 threads: same bits")

    ck = p("ck.h5")
    chain(caviar, p, "ck_run", extra=["--checkpoint", ck, "--checkpoint-every", "70"])
    with h5py.File(ck, "r") as f:
        if int(f.attrs["iteration"]) != 140:
            raise SystemExit(f"FAIL: checkpoint at sweep {f.attrs['iteration']}, expected 140")
    resumed, resumed_labels = chain(caviar, p, "resumed", ranks=2, extra=["--resume", ck])
    same("resume (chain)", base, resumed)
    same("resume (labels)", base_labels, resumed_labels)
    print("checkpoint at sweep 140, resumed at 2 ranks: same bits")

    with h5py.File(base, "r") as f:
        for name in ("log_joint", "heldout", "seconds"):
            assert f["trace/" + name].shape == (SWEEPS,), name
        counts = f["trace/counts"][()]
        dc, ds = f["draws/counts"][()], f["draws/sums"][()]
        heldout = f["trace/heldout"][()]
        assert f.attrs["sampler"] == "collapsed" and f.attrs["n_draws"] == SWEEPS - BURN
    assert counts.shape == (SWEEPS, K) and np.all(counts.sum(1) == N), counts.sum(1)
    assert dc.shape == (SWEEPS - BURN, K) and ds.shape == (SWEEPS - BURN, K, 2)
    with h5py.File(base_labels, "r") as f:
        labels = f["labels"][()]
    assert np.array_equal(np.bincount(labels, minlength=K), counts[-1])
    assert np.allclose(ds[-1], [x[:N][labels == k].sum(0) for k in range(K)])

    cavi = p("cavi.h5")
    fit = run(mpirun(2) + [caviar, "-q", "gmm", "fit", "--data", p("train.h5") + ":/X",
                           "-k", str(K), "--algorithm", "cavi", "--seed", "1", "--max-iter", "300",
                           "--tol", "1e-10", "--heldout", p("test.h5") + ":/X", "--out", cavi])
    with h5py.File(cavi, "r") as f:
        cavi_means = f["means"][()]
    post = (ds / (1.0 + dc[:, :, None])).mean(0)  # beta0 = 1, m0 = 0
    cost = ((post[:, None, :] - cavi_means[None, :, :]) ** 2).sum(-1)
    rows, cols = linear_sum_assignment(cost)
    err = np.abs(post[rows] - cavi_means[cols]).max()
    ho = heldout[BURN:].mean()
    print(f"posterior means vs CAVI: max |diff| = {err:.4f}; held-out: chain {ho:.4f} "
          f"(last {heldout[-1]:.4f}), CAVI {fit['heldout']:.4f}")
    if not err < 0.05:
        raise SystemExit(f"FAIL: posterior means differ from CAVI's by {err}")
    if not abs(ho - fit["heldout"]) < 0.05:
        raise SystemExit(f"FAIL: held-out {ho} vs CAVI {fit['heldout']}")
    print("OK")


if __name__ == "__main__":
    main()
