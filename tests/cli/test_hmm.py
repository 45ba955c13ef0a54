#!/usr/bin/env -S /usr/bin/python3
"""caviar hmm fit | score | decode | sample and caviar generate hmm, end to end.

- forward-backward (hmm score) and Viterbi (hmm decode) against brute-force enumeration of every
  state path on tiny chains (T <= 6, K <= 3), categorical and Gaussian (full, diag);
- one Baum-Welch step (categorical; Gaussian full) and one CAVI step (categorical; Gaussian full and
  diag) against an independent NumPy implementation, from the initial state the fit itself wrote
  (--max-iter 0), and the objective of both states;
- the EM log-likelihood and the CAVI ELBO never decrease, at 1 and 3 ranks;
- bitwise identical model files and posteriors at 1x2, 2x1 and 3x1 ranks x threads;
- parameter recovery on generated data (transition matrix within 0.02);
- a 10^5-step sequence stays finite;
- hmm sample: empirical transitions and emissions of 10^5 sampled steps match the model;
- checkpoint/resume: a resumed fit (from a count-triggered checkpoint, and after a real SIGTERM,
  exit 75) equals the uninterrupted one bit for bit, at another rank count (SVI included, from a
  pass boundary);
- SVI: one step over the whole data set with rho = 1 is the CAVI step, and with rho < 1 the
  average of the natural parameters (NumPy); bitwise at 1x2, 2x1, 3x1; its held-out score per step
  on generated data is within 0.002 nats of CAVI's and of the generating model's.

usage: test_hmm.py CAVIAR_BIN WORKDIR
"""
import itertools
import os
import signal
import subprocess
import sys

import h5py
import numpy as np
from scipy.special import digamma, multigammaln

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from clitest import Checks, fresh_workdir, h5_differences, summary  # noqa: E402
from hmm_reference import (elog_dir, expected_counts, forward_backward, kl_dir,  # noqa: E402
                           log_gauss, read_data, read_model, write_data)

caviar, work = sys.argv[1], sys.argv[2]
path = fresh_workdir(work)
checks = Checks(caviar)
check, run = checks.check, checks.run


# --- brute force on tiny chains ------------------------------------------------------------------
def brute(pi, A, logb):
    """log p(x) and the most probable path by enumerating all K^T paths."""
    T, K = logb.shape
    best, arg, tot = -np.inf, None, []
    for z in itertools.product(range(K), repeat=T):
        lp = np.log(pi[z[0]]) + logb[0, z[0]] + sum(
            np.log(A[z[t - 1], z[t]]) + logb[t, z[t]] for t in range(1, T))
        tot.append(lp)
        if lp > best:
            best, arg = lp, z
    return np.logaddexp.reduce(tot), np.array(arg)


rng = np.random.default_rng(5)
for emission, cov_kind in [("categorical", None), ("gaussian", "full"), ("gaussian", "diag")]:
    K, V, D = 3, 4, 2
    pi = rng.dirichlet(np.ones(K))
    A = rng.dirichlet(np.ones(K), size=K)
    lengths = [1, 2, 4, 6, 5, 3]
    model = path(f"tiny_{emission}_{cov_kind}.h5")
    with h5py.File(model, "w") as h:
        h.attrs["model"] = "hmm"
        h.attrs["emission"] = emission
        h.attrs["n_states"] = K
        h["startprob"], h["transmat"] = pi, A
        if emission == "categorical":
            B = rng.dirichlet(np.ones(V), size=K)
            h.attrs["n_symbols"] = V
            h["emissionprob"] = B
            seqs = [rng.integers(0, V, size=n) for n in lengths]
        else:
            means = rng.normal(size=(K, D))
            covs = []
            for _ in range(K):
                L = rng.normal(size=(D, D)) * 0.4 + np.eye(D)
                c = L @ L.T
                covs.append(np.diag(np.diag(c)) if cov_kind == "diag" else c)
            covs = np.array(covs)
            h.attrs["n_features"] = D
            h.attrs["covariance"] = cov_kind
            h["means"] = means
            h["covariances"] = covs if cov_kind == "full" else np.array([np.diag(c) for c in covs])
            seqs = [rng.normal(size=(n, D)) for n in lengths]
    write_data(path("tiny.h5"), seqs)
    ref_ll, ref_paths = 0.0, []
    for x in seqs:
        if emission == "categorical":
            logb = np.log(B[:, x].T)
        else:
            logb = np.array([[log_gauss(xt, means[k], covs[k]) for k in range(K)] for xt in x])
        ll, z = brute(pi, A, logb)
        ref_ll += ll
        ref_paths.append(z)
    for ranks in (1, 2):
        sc = summary(run(["hmm", "score", "--model", model, "--data", path("tiny.h5")], ranks))
        check(abs(sc["log_likelihood"] - ref_ll) < 1e-10 * abs(ref_ll),
              f"{emission} {cov_kind or ''} score at {ranks} rank(s): {sc['log_likelihood']:.12g} == "
              f"brute force {ref_ll:.12g}")
        check(abs(sc["score"] - ref_ll / sum(lengths)) < 1e-10 * abs(ref_ll), "score is per step")
        run(["-q", "hmm", "decode", "--model", model, "--data", path("tiny.h5"),
             "--out", path("paths.h5")], ranks)
        with h5py.File(path("paths.h5"), "r") as h:
            got = h["states"][()]
        check(got.dtype == np.int64 and np.array_equal(got, np.concatenate(ref_paths)),
              f"{emission} {cov_kind or ''} Viterbi at {ranks} rank(s) == brute-force argmax path")


def kl_nw(m, beta, W, nu, m0, beta0, W0inv, nu0):
    """KL(NW(m, beta, W, nu) || NW(m0, beta0, W0, nu0)) from Bishop (2006) B.79-B.82, 10.74, 10.77."""
    p = len(m)
    _, ldw = np.linalg.slogdet(W)
    ldw0 = -np.linalg.slogdet(W0inv)[1]
    elogdet = digamma(0.5 * (nu + 1 - np.arange(1, p + 1))).sum() + p * np.log(2) + ldw
    logB = lambda ld, n: -0.5 * n * ld - 0.5 * n * p * np.log(2) - multigammaln(0.5 * n, p)
    H = -logB(ldw, nu) - 0.5 * (nu - p - 1) * elogdet + 0.5 * nu * p
    e_q = 0.5 * elogdet + 0.5 * p * np.log(beta / (2 * np.pi)) - 0.5 * p - H
    dm = m - m0
    e_p = (0.5 * (p * np.log(beta0 / (2 * np.pi)) + elogdet - p * beta0 / beta
                  - beta0 * nu * dm @ W @ dm) + logB(ldw0, nu0) + 0.5 * (nu0 - p - 1) * elogdet
           - 0.5 * nu * np.trace(W0inv @ W))
    return e_q - e_p


def nw_logb(x, m, beta, W, nu, diag):
    """E[ln N(x | mu, Lambda^-1)] under NW (Bishop 10.64), every step x state."""
    K, D = m.shape
    out = np.zeros((len(x), K))
    for k in range(K):
        if diag:
            w = np.diag(W[k])
            el = sum(digamma(nu[k] / 2) + np.log(2) + np.log(W[k][j]) for j in range(D))
        else:
            w = W[k]
            el = digamma(0.5 * (nu[k] + 1 - np.arange(1, D + 1))).sum() + D * np.log(2) + \
                np.linalg.slogdet(w)[1]
        d = x - m[k]
        out[:, k] = 0.5 * el - 0.5 * D * np.log(2 * np.pi) - 0.5 * (
            D / beta[k] + nu[k] * np.einsum("ti,ij,tj->t", d, w, d))
    return out


def fit(data, extra, out, ranks=1, threads=1):
    tol = [] if "--tol" in extra else ["--tol", "0"]
    return summary(run(["-q", "hmm", "fit", "--data", data, "--out", out] + tol + extra, ranks,
                       threads))


run(["-q", "generate", "hmm", "--sequences", "40", "--length", "3-15", "--states", "3",
     "--emission", "categorical", "--symbols", "5", "--seed", "2", "--out", path("cat.h5")])
run(["-q", "generate", "hmm", "--sequences", "40", "--length", "3-15", "--states", "3",
     "--emission", "gaussian", "--dim", "2", "--seed", "3", "--out", path("gau.h5")])
cat_seqs, gau_seqs = read_data(path("cat.h5")), read_data(path("gau.h5"))
with h5py.File(path("cat.h5"), "r") as h:
    check(h["X"].dtype == np.int64 and h["offsets"][0] == 0 and h["offsets"][-1] == len(h["X"])
          and h["true/transmat"].shape == (3, 3), "generate hmm: /X int64, /offsets, /true/")

# EM, categorical.
args = ["--data", path("cat.h5"), "--states", "3", "--seed", "4"]
fit(path("cat.h5"), args[2:] + ["--max-iter", "0"], path("em0.h5"))
fit(path("cat.h5"), args[2:] + ["--max-iter", "1"], path("em1.h5"))
m0, m1 = read_model(path("em0.h5")), read_model(path("em1.h5"))
B0 = m0["emissionprob"]
ll, st, tr, gam = expected_counts(cat_seqs, m0["startprob"], m0["transmat"],
                                  lambda x: np.log(B0[:, x].T), 3)
em = np.zeros_like(B0)
for x, g in zip(cat_seqs, gam):
    for v in range(B0.shape[1]):
        em[:, v] += g[x == v].sum(0)
ok = (np.allclose(m1["startprob"], st / st.sum(), rtol=1e-10, atol=1e-13)
      and np.allclose(m1["transmat"], tr / tr.sum(1, keepdims=True), rtol=1e-10, atol=1e-13)
      and np.allclose(m1["emissionprob"], em / em.sum(1, keepdims=True), rtol=1e-10, atol=1e-13))
check(ok, "one Baum-Welch step (categorical) == NumPy")
ll1 = expected_counts(cat_seqs, m1["startprob"], m1["transmat"],
                      lambda x: np.log(m1["emissionprob"][:, x].T), 3)[0]
check(abs(m1["trace"][0] - ll) < 1e-10 * abs(ll) and abs(m1["trace"][1] - ll1) < 1e-10 * abs(ll1),
      f"EM trace == NumPy log-likelihoods ({m1['trace'][0]:.10g} {ll:.10g}, {m1['trace'][1]:.10g})")

# EM, Gaussian full.
gargs = ["--states", "3", "--seed", "4", "--emission", "gaussian", "--min-covar", "1e-3"]
fit(path("gau.h5"), gargs + ["--max-iter", "0"], path("gem0.h5"))
fit(path("gau.h5"), gargs + ["--max-iter", "1"], path("gem1.h5"))
g0, g1 = read_model(path("gem0.h5")), read_model(path("gem1.h5"))
lb = lambda x, mm: np.stack([log_gauss(x, mu, cov) for mu, cov in zip(mm["means"], mm["covariances"])],
                           axis=1)  # every step's log density under each state (T x K)
ll, st, tr, gam = expected_counts(gau_seqs, g0["startprob"], g0["transmat"], lambda x: lb(x, g0), 3)
X, G = np.concatenate(gau_seqs), np.concatenate(gam)
N = G.sum(0)
mu = (G.T @ X) / N[:, None]
cov = np.array([((X - mu[k]).T * G[:, k]) @ (X - mu[k]) / N[k] + 1e-3 * np.eye(2) for k in range(3)])
ok = (np.allclose(g1["means"], mu, rtol=1e-9, atol=1e-11)
      and np.allclose(g1["covariances"], cov, rtol=1e-9, atol=1e-11)
      and np.allclose(g1["transmat"], tr / tr.sum(1, keepdims=True), rtol=1e-10, atol=1e-13))
check(ok and abs(g1["trace"][0] - ll) < 1e-10 * abs(ll),
      "one Baum-Welch step (Gaussian, full) == NumPy, and its log-likelihood")

# CAVI, categorical.
vargs = ["--states", "3", "--seed", "4", "--algorithm", "cavi", "--prior-start", "0.7",
         "--prior-trans", "1.3", "--prior-emission", "0.5"]
fit(path("cat.h5"), vargs + ["--max-iter", "0"], path("vb0.h5"))
fit(path("cat.h5"), vargs + ["--max-iter", "1"], path("vb1.h5"))
v0, v1 = read_model(path("vb0.h5")), read_model(path("vb1.h5"))


def vb_cat(v):
    a_s, a_t, a_e = v["posterior/start"], v["posterior/trans"], v["posterior/emission"]
    ll, st, tr, gam = expected_counts(cat_seqs, np.exp(elog_dir(a_s)), np.exp(elog_dir(a_t)),
                                      lambda x: elog_dir(a_e)[:, x].T, 3)
    elbo = ll - kl_dir(a_s, 0.7) - sum(kl_dir(r, 1.3) for r in a_t) - sum(kl_dir(r, 0.5) for r in a_e)
    em = np.zeros_like(a_e)
    for x, g in zip(cat_seqs, gam):
        for v_ in range(a_e.shape[1]):
            em[:, v_] += g[x == v_].sum(0)
    return elbo, 0.7 + st, 1.3 + tr, 0.5 + em


elbo0, a_s, a_t, a_e = vb_cat(v0)
ok = (np.allclose(v1["posterior/start"], a_s, rtol=1e-10) and
      np.allclose(v1["posterior/trans"], a_t, rtol=1e-10) and
      np.allclose(v1["posterior/emission"], a_e, rtol=1e-10))
check(ok, "one CAVI step (categorical) == NumPy")
elbo1 = vb_cat(v1)[0]
check(abs(v1["trace"][0] - elbo0) < 1e-10 * abs(elbo0) and
      abs(v1["trace"][1] - elbo1) < 1e-10 * abs(elbo1),
      f"CAVI ELBO (categorical) == NumPy ({v1['trace'][0]:.10g} {elbo0:.10g}; "
      f"{v1['trace'][1]:.10g} {elbo1:.10g})")

# CAVI, Gaussian full and diag.
for cov_kind in ("full", "diag"):
    diag = cov_kind == "diag"
    vg = ["--states", "3", "--seed", "4", "--algorithm", "cavi", "--emission", "gaussian",
          "--covariance", cov_kind, "--prior-beta", "0.5"]
    fit(path("gau.h5"), vg + ["--max-iter", "0"], path("gvb0.h5"))
    fit(path("gau.h5"), vg + ["--max-iter", "1"], path("gvb1.h5"))
    w0, w1 = read_model(path("gvb0.h5")), read_model(path("gvb1.h5"))
    X = np.concatenate(gau_seqs)
    m0v, W0inv = X.mean(0), 4.0 * np.diag(X.var(0))
    check(np.allclose(w1["prior/m"], m0v, rtol=1e-12) and np.allclose(w1["prior/W_inv"], W0inv, rtol=1e-12),
          f"NW prior ({cov_kind}): m0 = data mean, W0^-1 = (D + 2) diag(var)")

    def vb_gau(v):
        a_s, a_t = v["posterior/start"], v["posterior/trans"]
        m, beta, W, nu = v["posterior/m"], v["posterior/beta"], v["posterior/W"], v["posterior/nu"]
        ll, st, tr, gam = expected_counts(gau_seqs, np.exp(elog_dir(a_s)), np.exp(elog_dir(a_t)),
                                          lambda x: nw_logb(x, m, beta, W, nu, diag), 3)
        kl = kl_dir(a_s, 1.0) + sum(kl_dir(r, 1.0) for r in a_t)
        for k in range(3):
            if diag:
                kl += sum(kl_nw(m[k, j:j + 1], beta[k], np.array([[W[k, j]]]), nu[k], m0v[j:j + 1], 0.5,
                                W0inv[j:j + 1, j:j + 1], 4.0) for j in range(2))
            else:
                kl += kl_nw(m[k], beta[k], W[k], nu[k], m0v, 0.5, W0inv, 4.0)
        G = np.concatenate(gam)
        N = G.sum(0)
        xbar = (G.T @ X) / N[:, None]
        beta_n, nu_n = 0.5 + N, 4.0 + N
        m_n = (0.5 * m0v + N[:, None] * xbar) / beta_n[:, None]
        W_n = []
        for k in range(3):
            S = ((X - xbar[k]).T * G[:, k]) @ (X - xbar[k])
            dm = xbar[k] - m0v
            Wi = W0inv + S + 0.5 * N[k] / beta_n[k] * np.outer(dm, dm)
            W_n.append(1 / np.diag(Wi) if diag else np.linalg.inv(Wi))
        return ll - kl, 1.0 + st, 1.0 + tr, m_n, beta_n, np.array(W_n), nu_n

    e0, a_s, a_t, m_n, beta_n, W_n, nu_n = vb_gau(w0)
    ok = (np.allclose(w1["posterior/start"], a_s, rtol=1e-10) and
          np.allclose(w1["posterior/trans"], a_t, rtol=1e-10) and
          np.allclose(w1["posterior/m"], m_n, rtol=1e-9, atol=1e-12) and
          np.allclose(w1["posterior/beta"], beta_n, rtol=1e-10) and
          np.allclose(w1["posterior/nu"], nu_n, rtol=1e-10) and
          np.allclose(w1["posterior/W"], W_n, rtol=1e-8, atol=1e-14))
    check(ok, f"one CAVI step (Gaussian, {cov_kind}) == NumPy")
    e1 = vb_gau(w1)[0]
    check(abs(w1["trace"][0] - e0) < 1e-9 * abs(e0) and abs(w1["trace"][1] - e1) < 1e-9 * abs(e1),
          f"CAVI ELBO (Gaussian, {cov_kind}) == NumPy ({w1['trace'][0]:.10g} {e0:.10g}; "
          f"{w1['trace'][1]:.10g} {e1:.10g})")

# --- monotone objectives at 1 and 3 ranks --------------------------------------------------------
for name, data, extra in [
        ("EM categorical", "cat.h5", ["--states", "4"]),
        ("CAVI categorical", "cat.h5", ["--states", "4", "--algorithm", "cavi"]),
        ("EM gaussian full", "gau.h5", ["--states", "3", "--emission", "gaussian"]),
        ("EM gaussian diag", "gau.h5", ["--states", "3", "--emission", "gaussian", "--covariance", "diag"]),
        ("CAVI gaussian full", "gau.h5", ["--states", "4", "--emission", "gaussian", "--algorithm", "cavi"]),
        ("CAVI gaussian diag", "gau.h5", ["--states", "4", "--emission", "gaussian", "--algorithm", "cavi",
                                          "--covariance", "diag"])]:
    for ranks in (1, 3):
        fit(path(data), extra + ["--max-iter", "40", "--seed", "1"], path("mono.h5"), ranks)
        tr = read_model(path("mono.h5"))["trace"]
        drops = np.diff(tr)
        worst = drops.min()
        check(len(tr) == 41 and np.all(np.isfinite(tr)) and worst >= -1e-12 * np.abs(tr).max(),
              f"{name} at {ranks} rank(s): objective never decreases over 40 iterations "
              f"(smallest step {worst:.3g}, {tr[0]:.6g} -> {tr[-1]:.6g})")

# --- bitwise identical at 1x2, 2x1, 3x1 ----------------------------------------------------------
for name, data, extra in [
        ("cavi categorical", "cat.h5", ["--states", "3", "--algorithm", "cavi"]),
        ("svi categorical", "cat.h5", ["--states", "3", "--algorithm", "svi", "--batch-size", "7"]),
        ("svi gaussian full", "gau.h5", ["--states", "3", "--emission", "gaussian", "--algorithm", "svi",
                                         "--batch-size", "6"]),
        ("em gaussian full", "gau.h5", ["--states", "3", "--emission", "gaussian"]),
        ("cavi gaussian diag", "gau.h5", ["--states", "3", "--emission", "gaussian", "--algorithm", "cavi",
                                          "--covariance", "diag"])]:
    outs = []
    for ranks, threads in ((1, 2), (2, 1), (3, 1)):
        m, p = path(f"bw_{ranks}x{threads}.h5"), path(f"bwp_{ranks}x{threads}.h5")
        s = fit(path(data), extra + ["--max-iter", "15", "--posteriors", p], m, ranks, threads)
        outs.append((m, p, s["objective"]))
    diff = h5_differences(outs[0][0], *[o[0] for o in outs[1:]]) + \
        h5_differences(outs[0][1], *[o[1] for o in outs[1:]])
    check(not diff and len({o[2] for o in outs}) == 1,
          f"{name}: model file and posteriors bitwise identical at 1x2, 2x1, 3x1 {diff[:4]}")
with h5py.File(outs[0][1], "r") as h:
    g = h["posteriors"][()]
check(g.shape == (sum(len(s) for s in gau_seqs), 3) and np.allclose(g.sum(1), 1, atol=1e-12),
      "posteriors: one row per step, each summing to 1")

# --- SVI: the natural-gradient step against NumPy ------------------------------------------------
# The initial state is the same for CAVI and SVI (--max-iter 0 writes it). One SVI pass with one
# minibatch of every sequence (scale N / |B| = 1) and rho_1 = (tau0 + 1)^-kappa: tau0 = 0 gives
# rho = 1, the CAVI step itself; tau0 = 1, kappa = 0.7 gives the average of the initial and the
# CAVI-step natural parameters, (1 - rho) lambda + rho lambda_hat.
def natural(v, gaussian):
    out = [v["posterior/start"], v["posterior/trans"]]
    if not gaussian:
        return out + [v["posterior/emission"]]
    beta, dm = v["posterior/beta"], v["posterior/m"] - v["prior/m"]
    second = v["posterior/W_inv"] + beta[:, None, None] * np.einsum("ki,kj->kij", dm, dm)
    return out + [beta, beta[:, None] * dm, second, v["posterior/nu"]]


for data, extra, gaussian in [("cat.h5", ["--prior-emission", "0.5"], False),
                              ("gau.h5", ["--emission", "gaussian", "--prior-beta", "0.5"], True)]:
    n_seq = len(cat_seqs if not gaussian else gau_seqs)
    base = ["--states", "3", "--seed", "4"] + extra
    fit(path(data), base + ["--algorithm", "cavi", "--max-iter", "0"], path("sv0.h5"))
    fit(path(data), base + ["--algorithm", "cavi", "--max-iter", "1"], path("sv_cavi1.h5"))
    one = ["--algorithm", "svi", "--max-iter", "1", "--batch-size", str(n_seq)]
    fit(path(data), base + one + ["--tau0", "0"], path("sv_rho1.h5"))
    fit(path(data), base + one + ["--tau0", "1", "--kappa", "0.7"], path("sv_rho.h5"))
    lam0, lam_hat = natural(read_model(path("sv0.h5")), gaussian), \
        natural(read_model(path("sv_cavi1.h5")), gaussian)
    rho = 2.0 ** -0.7
    ok1 = all(np.allclose(a, b, rtol=1e-10, atol=1e-12) for a, b in
              zip(natural(read_model(path("sv_rho1.h5")), gaussian), lam_hat))
    ok2 = all(np.allclose(a, (1 - rho) * a0 + rho * b, rtol=1e-10, atol=1e-12) for a, a0, b in
              zip(natural(read_model(path("sv_rho.h5")), gaussian), lam0, lam_hat))
    kind = "gaussian" if gaussian else "categorical"
    check(ok1, f"svi ({kind}): one step with rho = 1 over every sequence == the CAVI step")
    check(ok2, f"svi ({kind}): one step with rho = 2^-0.7 == (1 - rho) lambda + rho lambda_hat")
    check(read_model(path("sv_rho.h5"))["attrs"]["inference"] == "svi", "the model file says svi")

# --- SVI against CAVI on generated data ----------------------------------------------------------
# Held-out sequences drawn (hmm sample) from the generating model; SVI (minibatches of 20 of the 600
# sequences, 15 passes) and CAVI from the same start, at 2 ranks; the per-step held-out scores.
run(["-q", "generate", "hmm", "--sequences", "600", "--length", "30-80", "--states", "3",
     "--emission", "gaussian", "--dim", "2", "--seed", "11", "--out", path("svi_tr.h5")])
with h5py.File(path("svi_tr.h5"), "r") as g, h5py.File(path("svi_true.h5"), "w") as h:
    h.attrs.update({"model": "hmm", "emission": "gaussian", "n_states": 3, "n_features": 2,
                    "covariance": "full"})
    for k in ("startprob", "transmat", "means", "covariances"):
        h[k] = g["true/" + k][()]
run(["-q", "hmm", "sample", "--model", path("svi_true.h5"), "--sequences", "200", "--length", "60",
     "--seed", "9", "--out", path("svi_ho.h5")])
sargs = ["--states", "3", "--emission", "gaussian", "--seed", "1"]
fit(path("svi_tr.h5"), sargs + ["--algorithm", "cavi", "--max-iter", "200", "--tol", "1e-9"],
    path("svi_cavi.h5"), 2)
s_svi = fit(path("svi_tr.h5"), sargs + ["--algorithm", "svi", "--batch-size", "20", "--tau0", "1",
                                        "--kappa", "0.6", "--max-iter", "15"], path("svi_svi.h5"), 2)
sc = {m: summary(run(["hmm", "score", "--model", path(f"svi_{m}.h5"), "--data", path("svi_ho.h5")],
                     2))["score"] for m in ("true", "cavi", "svi")}
tr = read_model(path("svi_svi.h5"))["trace"]
check(len(tr) == 15 and np.all(np.isfinite(tr)) and s_svi["iterations"] == 15,
      f"svi: one ELBO estimate per pass ({tr[0]:.6g} -> {tr[-1]:.6g})")
check(abs(sc["svi"] - sc["cavi"]) < 2e-3 and abs(sc["svi"] - sc["true"]) < 2e-3,
      f"svi: held-out score per step {sc['svi']:.6f} within 0.002 of CAVI's {sc['cavi']:.6f} and "
      f"of the generating model's {sc['true']:.6f}")

# --- recovery on generated data ------------------------------------------------------------------
run(["-q", "generate", "hmm", "--sequences", "3000", "--length", "50-150", "--states", "3",
     "--emission", "gaussian", "--dim", "2", "--seed", "11", "--out", path("rec.h5")])
best = None
for seed in range(3):
    s = fit(path("rec.h5"), ["--states", "3", "--emission", "gaussian", "--max-iter", "200",
                             "--tol", "1e-9", "--seed", str(seed)], path(f"rec_{seed}.h5"), 2, 1)
    if best is None or s["objective"] > best[0]:
        best = (s["objective"], seed)
rec = read_model(path(f"rec_{best[1]}.h5"))
with h5py.File(path("rec.h5"), "r") as h:
    true_a, true_m = h["true/transmat"][()], h["true/means"][()]
perm = min(itertools.permutations(range(3)),
           key=lambda p: np.abs(rec["means"][list(p)] - true_m).sum())
est_a = rec["transmat"][np.ix_(perm, perm)]
err = np.abs(est_a - true_a).max()
check(err < 0.02, f"recovery: transition matrix within 0.02 of the truth (max error {err:.4f}, "
                  f"{len(read_data(path('rec.h5')))} sequences)")
score = summary(run(["hmm", "score", "--model", path(f"rec_{best[1]}.h5"), "--data", path("rec.h5")], 2))
check(abs(score["log_likelihood"] - rec["trace"][-1]) < 1e-9 * abs(score["log_likelihood"]),
      "hmm score of the fitted model == the fit's last log-likelihood")

# --- posteriors against NumPy ---------------------------------------------------------------------
def check_posteriors(data, m, g, what):
    ref = np.concatenate([forward_backward(m["startprob"], m["transmat"], lb(x, m))[1]
                          for x in read_data(data)])
    err = np.abs(g - ref).max() if g.shape == ref.shape else np.inf
    check(err < 1e-9, f"{what} == NumPy's scaled forward-backward under the written model "
                      f"(max difference {err:.3g})")


fit(path("gau.h5"), ["--states", "3", "--emission", "gaussian", "--max-iter", "4",
                     "--posteriors", path("gau_p.h5")], path("gau_m.h5"), 2)
with h5py.File(path("gau_p.h5"), "r") as h:
    check_posteriors(path("gau.h5"), read_model(path("gau_m.h5")), h["posteriors"][()],
                     "EM posteriors of short sequences at 2 ranks")

# --- a 10^5-step sequence ------------------------------------------------------------------------
run(["-q", "generate", "hmm", "--sequences", "1", "--length", "100000-100000", "--states", "3",
     "--emission", "gaussian", "--dim", "2", "--seed", "7", "--out", path("long.h5")])
for alg in ("em", "cavi"):
    s = fit(path("long.h5"), ["--states", "3", "--emission", "gaussian", "--algorithm", alg,
                              "--max-iter", "3", "--posteriors", path("long_p.h5")], path("long_m.h5"))
    with h5py.File(path("long_p.h5"), "r") as h:
        g = h["posteriors"][()]
    m = read_model(path("long_m.h5"))
    check(np.all(np.isfinite(m["trace"])) and np.all(np.isfinite(g)) and g.shape == (100000, 3)
          and np.all(np.isfinite(m["transmat"])),
          f"{alg}: a 10^5-step sequence stays finite (objective {m['trace'][-1]:.6g})")
    if alg == "em":
        # A sequence this long keeps the forward's alpha in the posteriors' own rows (the
        # in-place backward); the short sequences of gau.h5 do not.
        check_posteriors(path("long.h5"), m, g, "posteriors of a 10^5-step sequence")
sc = summary(run(["hmm", "score", "--model", path("long_m.h5"), "--data", path("long.h5")]))
check(np.isfinite(sc["log_likelihood"]), "score of a 10^5-step sequence is finite")

# --- hmm sample ----------------------------------------------------------------------------------
# Draws from a known model: the empirical transitions, emissions and Gaussian moments of 10^5 steps
# match the parameters, and the result does not depend on the rank count.
pi_s, A_s = np.array([0.3, 0.7]), np.array([[0.8, 0.2], [0.35, 0.65]])
with h5py.File(path("smp_cat.h5"), "w") as h:
    h.attrs.update({"model": "hmm", "emission": "categorical", "n_states": 2, "n_symbols": 3})
    h["startprob"], h["transmat"] = pi_s, A_s
    h["emissionprob"] = np.array([[0.6, 0.3, 0.1], [0.1, 0.2, 0.7]])
mu_s = np.array([[-1.0, 2.0], [1.5, 0.0]])
cov_s = np.array([[[1.0, 0.4], [0.4, 0.5]], [[0.3, -0.1], [-0.1, 2.0]]])
with h5py.File(path("smp_gau.h5"), "w") as h:
    h.attrs.update({"model": "hmm", "emission": "gaussian", "n_states": 2, "n_features": 2,
                    "covariance": "full"})
    h["startprob"], h["transmat"], h["means"], h["covariances"] = pi_s, A_s, mu_s, cov_s
for kind in ("cat", "gau"):
    for ranks in (1, 2):
        run(["-q", "hmm", "sample", "--model", path(f"smp_{kind}.h5"), "--sequences", "400",
             "--length", "250", "--seed", "3", "--out", path(f"smp_{kind}_out{ranks}.h5")], ranks)
    diff = h5_differences(path(f"smp_{kind}_out1.h5"), path(f"smp_{kind}_out2.h5"))
    with h5py.File(path(f"smp_{kind}_out1.h5"), "r") as h:
        x, z, off = h["X"][()], h["states"][()], h["offsets"][()]
    first = z[off[:-1]]
    inner = np.ones(len(z), bool)
    inner[off[:-1]] = False  # steps with a predecessor in their sequence
    prev, cur = z[np.nonzero(inner)[0] - 1], z[inner]
    trans = np.array([[np.mean(cur[prev == i] == j) for j in range(2)] for i in range(2)])
    ok = (not diff and np.abs(trans - A_s).max() < 0.02 and abs(np.mean(first == 0) - 0.3) < 0.1
          and len(z) == 100000 and off[-1] == 100000)
    if kind == "cat":
        emit = np.array([[np.mean(x[z == k] == v) for v in range(3)] for k in range(2)])
        ok = ok and np.abs(emit - [[0.6, 0.3, 0.1], [0.1, 0.2, 0.7]]).max() < 0.02
    else:
        ok = ok and all(np.abs(x[z == k].mean(0) - mu_s[k]).max() < 0.05 and
                        np.abs(np.cov(x[z == k].T) - cov_s[k]).max() < 0.1 for k in range(2))
    check(ok, f"hmm sample ({kind}): transitions (max error {np.abs(trans - A_s).max():.4f}), "
              f"emissions match the model; same bits at 1 and 2 ranks {diff[:3]}")
sc = summary(run(["hmm", "score", "--model", path("smp_gau.h5"), "--data", path("smp_gau_out1.h5")]))
check(np.isfinite(sc["score"]), "a sampled file is hmm data (hmm score reads it)")

# --- checkpoint / resume -------------------------------------------------------------------------
for data, extra in [("cat.h5", ["--algorithm", "em"]),
                    ("gau.h5", ["--emission", "gaussian", "--algorithm", "em"]),
                    ("gau.h5", ["--emission", "gaussian", "--algorithm", "cavi"]),
                    ("gau.h5", ["--emission", "gaussian", "--algorithm", "svi", "--batch-size", "7"])]:
    base = ["--states", "3", "--max-iter", "12"] + extra
    fit(path(data), base, path("ck_ref.h5"), 2)
    fit(path(data), base + ["--checkpoint", path("ck.h5"), "--checkpoint-every", "5"],
        path("ck_first.h5"), 2)
    with h5py.File(path("ck.h5"), "r") as h:
        check(int(h.attrs["iteration"]) == 10, "checkpoint every 5: iteration 10")
    fit(path(data), base + ["--resume", path("ck.h5")], path("ck_res.h5"), 3)
    diff = h5_differences(path("ck_ref.h5"), path("ck_res.h5"))
    check(not diff, f"{data} {' '.join(extra)}: resumed at 3 ranks from a 2-rank checkpoint: "
                    f"bitwise the uninterrupted fit {diff[:4]}")
# SVI inside a pass: --checkpoint-every 1e-6s saves at every minibatch boundary, so the last
# checkpoint stands before the last minibatch of the last pass (40 sequences, 6 minibatches a
# pass); resumed at 3 ranks from it, the 2-rank fit must end bitwise as the uninterrupted one.
svi = ["--states", "3", "--max-iter", "4", "--emission", "gaussian", "--algorithm", "svi",
       "--batch-size", "7"]
fit(path("gau.h5"), svi, path("mid_ref.h5"), 2)
fit(path("gau.h5"), svi + ["--checkpoint", path("mid_ck.h5"), "--checkpoint-every", "0.000001s"],
    path("mid_first.h5"), 2)
with h5py.File(path("mid_ck.h5"), "r") as h:
    at = (int(h.attrs["iteration"]), int(h.attrs["driver.step_in_epoch"]))
check(at == (3, 5), f"SVI timed checkpoint: the last one inside pass 3, before minibatch 5 ({at})")
fit(path("gau.h5"), svi + ["--resume", path("mid_ck.h5")], path("mid_res.h5"), 3)
diff = h5_differences(path("mid_ref.h5"), path("mid_res.h5"))
check(not diff, f"SVI resumed mid-pass at 3 ranks from a 2-rank checkpoint: bitwise the "
                f"uninterrupted fit {diff[:4]}")
# A real SIGTERM during the fit: exit 75 after writing the checkpoint; the resume completes it.
long = ["hmm", "fit", "--data", path("rec.h5"), "--states", "3", "--algorithm", "cavi",
        "--emission", "gaussian", "--max-iter", "60", "--tol", "0"]
proc = subprocess.Popen([caviar] + long + ["--checkpoint", path("sig.h5"), "--out", path("sig_m.h5")],
                        stderr=subprocess.PIPE, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
seen = 0
while seen < 5:  # some iterations in
    line = proc.stderr.readline()
    seen += line.startswith("iter")
proc.send_signal(signal.SIGTERM)
err = proc.stderr.read()
rc = proc.wait(timeout=120)
check(rc == 75 and os.path.exists(path("sig.h5")) and not os.path.exists(path("sig_m.h5")),
      f"SIGTERM: exit {rc}, checkpoint written, no model file ({err.strip()[-100:]})")
run(["-q"] + long + ["--resume", path("sig.h5"), "--out", path("sig_m.h5")], 2, 2)
run(["-q"] + long + ["--out", path("sig_full.h5")])
diff = h5_differences(path("sig_full.h5"), path("sig_m.h5"))
check(not diff, f"stopped by SIGTERM, resumed at 2x2: bitwise the uninterrupted fit {diff[:4]}")
# ck.h5 is the Gaussian SVI fit's checkpoint: the same fit with EM must be refused.
r = run(["-q", "hmm", "fit", "--data", path("gau.h5"), "--out", path("ck_bad.h5"), "--resume",
         path("ck.h5"), "--states", "3", "--max-iter", "12", "--emission", "gaussian",
         "--algorithm", "em"], ok=False)
err = [l for l in r.stderr.splitlines() if l.startswith("caviar: error:")]
check(r.returncode == 1 and len(err) == 1 and "--algorithm" in err[0],
      f"resume with another --algorithm refused: {err}")

checks.finish()
