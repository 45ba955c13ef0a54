#!/usr/bin/env -S /usr/bin/python3
"""caviar hmm fit with many states: the forward-backward's vector-matrix kernel works in register
blocks of 32, 16, 8, 4 and 1 states, and K = 37 (32 + 4 + 1) and K = 61 (32 + 16 + 8 + 4 + 1)
use every one of them. From 112 states on, the forward and the backward run in one sweep with
their own scalings (blocks of 8, 4 and 1 rows, vectors of columns and a scalar rest): K = 115
(14 x 8 + 3 rows, 28 x 4 + 3 columns). The posteriors alone take that sweep from 80 states on,
and make each gamma_t in it when both of its halves exist: K = 83 (10 x 8 + 3 rows) and 115, on
sequences of odd and even lengths from 1 step on.

- one Baum-Welch step (categorical; Gaussian full and diag) against the NumPy forward-backward,
  from the initial state the fit itself wrote (--max-iter 0), and its log-likelihood; one CAVI
  step (categorical, K = 115) and its ELBO;
- posteriors against NumPy, of short sequences (categorical and Gaussian; at K = 83 and 115 also
  of 1-6 steps, and Gaussian ones of 100-400 steps, whose emissions the sweep makes from both
  ends) and (K = 83 and 115) of one long enough to keep the forward in the posteriors' own
  rows; `hmm score` equal, to the bit, to the fit's log-likelihood;
- bitwise identical model files at 1x2 and 2x1 ranks x threads.

usage: test_hmm_large_k.py CAVIAR_BIN WORKDIR
"""
import os
import sys

import h5py
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from clitest import Checks, fresh_workdir, h5_differences, summary  # noqa: E402
from hmm_reference import (elog_dir, expected_counts, kl_dir, read_data,  # noqa: E402
                           read_model)

caviar, work = sys.argv[1], sys.argv[2]
path = fresh_workdir(work)
checks = Checks(caviar)
check, run = checks.check, checks.run


def fit(data, extra, out, ranks=1, threads=1):
    return summary(run(["-q", "hmm", "fit", "--data", data, "--out", out, "--tol", "0", "--seed",
                        "3"] + extra, ranks, threads))


def close(a, b):
    return np.allclose(a, b, rtol=1e-9, atol=1e-12)


run(["-q", "generate", "hmm", "--sequences", "24", "--length", "20-60", "--states", "5",
     "--emission", "categorical", "--symbols", "7", "--seed", "2", "--out", path("cat.h5")])
run(["-q", "generate", "hmm", "--sequences", "24", "--length", "20-60", "--states", "5",
     "--emission", "gaussian", "--dim", "3", "--seed", "3", "--out", path("gau.h5")])
cat_seqs, gau_seqs = read_data(path("cat.h5")), read_data(path("gau.h5"))
run(["-q", "generate", "hmm", "--sequences", "1", "--length", "3000-3000", "--states", "5",
     "--emission", "categorical", "--symbols", "7", "--seed", "4", "--out", path("long.h5")])


def gaussian_logb(m):
    """log N(x_t | mu_k, Sigma_k) for every step and state, from a model file's parameters."""
    covs = m["covariances"]
    if covs.ndim == 2:  # diagonal: K x D variances
        covs = np.array([np.diag(c) for c in covs])
    prec, logdet = np.linalg.inv(covs), np.linalg.slogdet(covs)[1]

    def logb(x):
        d = x[:, None, :] - m["means"][None, :, :]
        q = np.einsum("tki,kij,tkj->tk", d, prec, d)
        return -0.5 * (x.shape[1] * np.log(2 * np.pi) + logdet[None, :] + q)
    return logb


def posteriors_close(gam, post):
    """The written posteriors against NumPy's per-sequence gammas."""
    with h5py.File(post, "r") as h:
        g = h["posteriors"][()]
    ref = np.concatenate(gam)
    return g.shape == ref.shape and np.abs(g - ref).max() < 1e-9


for K in (37, 61, 83, 115):
    # EM, categorical.
    fit(path("cat.h5"), ["-k", str(K), "--max-iter", "0", "--posteriors", path(f"cp_{K}.h5")],
        path(f"c0_{K}.h5"))
    fit(path("cat.h5"), ["-k", str(K), "--max-iter", "1"], path(f"c1_{K}.h5"))
    m0, m1 = read_model(path(f"c0_{K}.h5")), read_model(path(f"c1_{K}.h5"))
    B = m0["emissionprob"]
    ll, st, tr, gam = expected_counts(cat_seqs, m0["startprob"], m0["transmat"],
                                      lambda x: np.log(B[:, x].T), K)
    em = np.zeros_like(B)
    for x, g in zip(cat_seqs, gam):
        for v in range(B.shape[1]):
            em[:, v] += g[x == v].sum(0)
    check(close(m1["startprob"], st / st.sum()) and close(m1["transmat"], tr / tr.sum(1)[:, None])
          and close(m1["emissionprob"], em / em.sum(1)[:, None])
          and abs(m1["trace"][0] - ll) < 1e-10 * abs(ll),
          f"K = {K}: one Baum-Welch step (categorical) == NumPy, and its log-likelihood")
    check(posteriors_close(gam, path(f"cp_{K}.h5")),
          f"K = {K}: posteriors of short sequences == NumPy")
    score = summary(run(["hmm", "score", "--model", path(f"c0_{K}.h5"), "--data", path("cat.h5")]))
    check(score["log_likelihood"] == m1["trace"][0],
          f"K = {K}: hmm score == the fit's log-likelihood, to the bit "
          f"({score['log_likelihood']!r}, {m1['trace'][0]!r})")

    # EM, Gaussian, full and diagonal covariances.
    for cov in ("full", "diag"):
        args = ["-k", str(K), "--emission", "gaussian", "--covariance", cov, "--min-covar", "1e-3"]
        fit(path("gau.h5"), args + ["--max-iter", "0", "--posteriors", path(f"gp_{cov}_{K}.h5")],
            path(f"g0_{cov}_{K}.h5"))
        fit(path("gau.h5"), args + ["--max-iter", "1"], path(f"g1_{cov}_{K}.h5"))
        g0, g1 = read_model(path(f"g0_{cov}_{K}.h5")), read_model(path(f"g1_{cov}_{K}.h5"))
        ll, st, tr, gam = expected_counts(gau_seqs, g0["startprob"], g0["transmat"],
                                          gaussian_logb(g0), K)
        X, G = np.concatenate(gau_seqs), np.concatenate(gam)
        mu = (G.T @ X) / G.sum(0)[:, None]
        check(close(g1["means"], mu) and close(g1["transmat"], tr / tr.sum(1)[:, None])
              and abs(g1["trace"][0] - ll) < 1e-10 * abs(ll),
              f"K = {K}: one Baum-Welch step (Gaussian, {cov}) == NumPy, and its log-likelihood")
        check(posteriors_close(gam, path(f"gp_{cov}_{K}.h5")),
              f"K = {K}: posteriors (Gaussian, {cov}) == NumPy")

# Sequences of 1 to 6 steps: the sweep's two halves meet at every place (odd and even lengths;
# one step, where gamma_0 = alpha_0).
run(["-q", "generate", "hmm", "--sequences", "40", "--length", "1-6", "--states", "5",
     "--emission", "categorical", "--symbols", "7", "--seed", "5", "--out", path("tiny.h5")])


def categorical_posteriors_close(data, K):
    """Posteriors written by a fit with --max-iter 0 against NumPy's under the fit's own start."""
    fit(path(data), ["-k", str(K), "--max-iter", "0", "--posteriors", path(f"p_{K}_{data}")],
        path(f"m_{K}_{data}"))
    m = read_model(path(f"m_{K}_{data}"))
    _, _, _, gam = expected_counts(read_data(path(data)), m["startprob"], m["transmat"],
                                   lambda x: np.log(m["emissionprob"][:, x].T), K)
    return posteriors_close(gam, path(f"p_{K}_{data}"))


for K in (83, 115):
    check(categorical_posteriors_close("tiny.h5", K),
          f"K = {K}: posteriors of sequences of 1-6 steps == NumPy")

# Gaussian sequences of 100-400 steps at K = 83 and 115: the posteriors' sweep makes the emissions
# a chunk of 32 steps at a time from both ends, and the ends meet at different places (a chunk
# cut short). Several sequences, so that no emission row left over from another one goes unseen.
run(["-q", "generate", "hmm", "--sequences", "5", "--length", "100-400", "--states", "5",
     "--emission", "gaussian", "--dim", "3", "--seed", "6", "--out", path("glong.h5")])
for K in (83, 115):
    args = ["-k", str(K), "--emission", "gaussian", "--min-covar", "1e-3", "--max-iter", "0"]
    fit(path("glong.h5"), args + ["--posteriors", path(f"glp_{K}.h5")], path(f"glm_{K}.h5"))
    m = read_model(path(f"glm_{K}.h5"))
    _, _, _, gam = expected_counts(read_data(path("glong.h5")), m["startprob"], m["transmat"],
                                   gaussian_logb(m), K)
    check(posteriors_close(gam, path(f"glp_{K}.h5")),
          f"K = {K}: posteriors of Gaussian sequences of 100-400 steps == NumPy")

# One CAVI step at K = 115 (categorical): the forward-backward on exp E[ln A] and exp E[ln B],
# whose rows do not sum to one.
vargs = ["-k", "115", "--algorithm", "cavi", "--prior-start", "0.7", "--prior-trans", "1.3",
         "--prior-emission", "0.5"]
fit(path("cat.h5"), vargs + ["--max-iter", "0"], path("vb0.h5"))
fit(path("cat.h5"), vargs + ["--max-iter", "1"], path("vb1.h5"))
v0, v1 = read_model(path("vb0.h5")), read_model(path("vb1.h5"))
a_s, a_t, a_e = v0["posterior/start"], v0["posterior/trans"], v0["posterior/emission"]
ll, st, tr, gam = expected_counts(cat_seqs, np.exp(elog_dir(a_s)), np.exp(elog_dir(a_t)),
                                  lambda x: elog_dir(a_e)[:, x].T, 115)
elbo = (ll - kl_dir(a_s, 0.7) - sum(kl_dir(r, 1.3) for r in a_t)
        - sum(kl_dir(r, 0.5) for r in a_e))
em = np.zeros_like(a_e)
for x, g in zip(cat_seqs, gam):
    for v in range(a_e.shape[1]):
        em[:, v] += g[x == v].sum(0)
check(np.allclose(v1["posterior/start"], 0.7 + st, rtol=1e-10)
      and np.allclose(v1["posterior/trans"], 1.3 + tr, rtol=1e-10)
      and np.allclose(v1["posterior/emission"], 0.5 + em, rtol=1e-10)
      and abs(v1["trace"][0] - elbo) < 1e-10 * abs(elbo),
      f"K = 115: one CAVI step (categorical) == NumPy, and its ELBO ({v1['trace'][0]!r}, {elbo!r})")

# One 3,000-step sequence at K = 83 and 115: 2-2.8 MB of forward, kept in the posteriors' rows.
for K in (83, 115):
    check(categorical_posteriors_close("long.h5", K),
          f"K = {K}: posteriors of a 3,000-step sequence == NumPy")

# Rank and thread invariance at K = 37 and 115, 3 iterations (EM, Gaussian full; CAVI,
# categorical).
for K in (37, 115):
    for name, data, extra in (("gem", "gau.h5", ["--emission", "gaussian"]),
                              ("cvb", "cat.h5", ["--algorithm", "cavi"])):
        outs = []
        for ranks, threads in ((1, 2), (2, 1)):
            outs.append(path(f"{name}_{K}_{ranks}x{threads}.h5"))
            fit(path(data), ["-k", str(K), "--max-iter", "3"] + extra, outs[-1], ranks, threads)
        diff = h5_differences(*outs)
        check(not diff, f"K = {K} {name}: bitwise identical at 1x2 and 2x1 {diff}")

checks.finish()
