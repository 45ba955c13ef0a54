#!/usr/bin/env -S /usr/bin/python3
"""`caviar vae score`: the importance-weighted estimate of log p(x) (Burda, Grosse &
Salakhutdinov 2016) on a linear-Gaussian VAE, whose log p(x) is known in closed form.

The model file of a small trained Gaussian VAE (hidden 4, latent 2, D = 4) is overwritten with
weights that make it linear: every ReLU unit gets a bias of 20, so its input never falls below
zero for the data and latent draws used, and the decoder's log-variance weights are zero. Then
  p(z) = N(0, I),  p(x | z) = N(M z + c, s2 I),  so  p(x) = N(c, M M^T + s2 I),
with the columns of M orthogonal, so the exact posterior p(z | x) = N(S M^T (x - c) / s2, S),
S = (I + M^T M / s2)^-1, is diagonal and the encoder can equal it.

Checks:
  1. Encoder = exact posterior: every importance weight equals p(x), so the estimate equals the
     closed form for any k, row by row (float32 forward passes: within 2e-3 nats).
  2. A shifted encoder: the estimate grows with k (k = 1 < 30 < 2000 on the mean), and at
     k = 2000 it is within 0.01 nats per row of the closed form, while k = 1 is > 0.05 below it
     (the check is not vacuous); the k = 1 mean agrees with the reported ELBO within 5 standard
     errors (both estimate the ELBO, with different draws).
  3. The per-row /log_px file and the summary are the same bits at 1 and 3 ranks and at 1 and 2
     threads.
  4. --importance-samples 0 is refused with one line.
  5. A full-covariance encoder (vae train --posterior full): with M's columns not orthogonal the
     exact posterior has a full covariance S = L L^T, which that encoder can equal (sigma =
     diag L, L'_ij = L_ij / L_ii below the diagonal), so again every weight is p(x) (within 2e-3);
     training it at 1 and 2 ranks gives the same bits.

usage: test_vae_score.py CAVIAR_BIN WORKDIR
"""
import os
import sys

import h5py
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from clitest import Checks, fresh_workdir, h5_differences, summary  # noqa: E402

D, Z, N, S2, BIAS = 4, 2, 600, 0.25, 20.0

caviar, work = sys.argv[1], sys.argv[2]
path = fresh_workdir(work)
checks = Checks(caviar)
check, run = checks.check, checks.run

rng = np.random.default_rng(11)
q, _ = np.linalg.qr(rng.normal(size=(D, D)))
M = q[:, :Z] * np.array([2.0, 1.0])  # orthogonal columns
c = rng.normal(scale=0.5, size=D)
x = rng.normal(size=(N, Z)) @ M.T + c + np.sqrt(S2) * rng.normal(size=(N, D))
with h5py.File(path("x.h5"), "w") as f:
    f["X"] = x

cov = M @ M.T + S2 * np.eye(D)
r = x - c
exact = -0.5 * (D * np.log(2 * np.pi) + np.linalg.slogdet(cov)[1]
                + np.einsum("ni,ij,nj->n", r, np.linalg.inv(cov), r))


def write_linear(model, mu_shift=0.0, logvar_shift=0.0, M=M):
    """The linear-Gaussian weights described above, into a model file of the right layout (with
    the lower-triangle head of the exact posterior's Cholesky factor if the file has one)."""
    post_cov = np.linalg.inv(np.eye(Z) + M.T @ M / S2)
    chol = np.linalg.cholesky(post_cov)
    w_mu = post_cov @ M.T / S2  # mu = W_mu (x - c)
    dec_w1 = np.zeros((D, Z))
    dec_w1[:Z, :Z] = np.eye(Z)  # hidden = z (first Z units) + BIAS
    dec_w2 = np.zeros((D, D))
    dec_w2[:, :Z] = M
    weights = {
        "encoder/hidden0": (np.eye(D), np.full(D, BIAS)),  # h = x + BIAS
        "encoder/mu": (w_mu, -w_mu @ (np.full(D, BIAS) + c) + mu_shift),
        "encoder/logvar": (np.zeros((Z, D)), 2 * np.log(np.diag(chol)) + logvar_shift),
        "decoder/hidden0": (dec_w1, np.full(D, BIAS)),
        "decoder/mean": (dec_w2, c - dec_w2 @ np.full(D, BIAS)),
        "decoder/logvar": (np.zeros((D, D)), np.full(D, np.log(S2))),
    }
    with h5py.File(model, "r+") as f:
        if "encoder/lower" in f:
            # L = diag(sigma) (I + M (.) L'): the triangle is taken relative to row i's sigma.
            lower = np.array([chol[i, j] / chol[i, i] for i in range(Z) for j in range(i)])
            weights["encoder/lower"] = (np.zeros((len(lower), D)), lower)
        else:
            assert np.allclose(post_cov, np.diag(np.diag(post_cov))), "diagonal encoder, full S"
        for name, (w, b) in weights.items():
            assert f[name + "/W"].shape == w.shape and f[name + "/b"].shape == b.shape, name
            f[name + "/W"][...] = w
            f[name + "/b"][...] = b


def score(model, k, out, ranks=1, threads=1, seed=3):
    r = run(["-q", "vae", "score", "--model", model, "--data", path("x.h5") + ":/X",
             "--importance-samples", str(k), "--seed", str(seed), "--out", out], ranks, threads)
    with h5py.File(out, "r") as f:
        return summary(r), f["log_px"][()]


run(["-q", "vae", "train", "--data", path("x.h5") + ":/X", "--likelihood", "gaussian",
     "--hidden", str(D), "--latent", str(Z), "--epochs", "1", "--out", path("exact.h5")])
with h5py.File(path("exact.h5"), "r") as f:
    check(list(f["architecture/hidden"][()]) == [D], "trained layout: one hidden layer of D")
write_linear(path("exact.h5"))

# 1. Exact posterior: every weight is p(x).
for k in (1, 300):
    s, lp = score(path("exact.h5"), k, path(f"exact_{k}.h5"))
    err = np.abs(lp - exact).max()
    check(err < 2e-3, f"exact encoder, k = {k}: per-row log p(x) = closed form "
                      f"(max error {err:.1e} nats; mean {s['log_px']:.6f} vs {exact.mean():.6f})")

# 2. A shifted encoder: a proper lower bound that tightens with k.
os.replace(path("exact.h5"), path("shifted.h5"))
write_linear(path("shifted.h5"), mu_shift=0.3, logvar_shift=0.2)
means = {}
for k in (1, 30, 2000):
    s, lp = score(path("shifted.h5"), k, path(f"shifted_{k}.h5"))
    means[k] = lp.mean()
    if k == 1:
        elbo, lp1 = s["elbo"], lp
print("shifted encoder: mean estimate by k %s; closed form %.6f"
      % ({k: round(v, 6) for k, v in means.items()}, exact.mean()))
check(means[1] < means[30] < means[2000], "the estimate grows with k")
check(abs(means[2000] - exact.mean()) < 0.01, "k = 2000 is within 0.01 nats of log p(x)")
check(exact.mean() - means[1] > 0.05, "k = 1 is more than 0.05 nats below (a real gap)")
se = np.sqrt(2) * lp1.std() / np.sqrt(N)
check(abs(elbo - means[1]) < 5 * se,
      f"k = 1 agrees with the reported ELBO ({means[1]:.4f} vs {elbo:.4f}, 5 se = {5 * se:.4f})")

# 3. Rank and thread invariance.
s1, _ = score(path("shifted.h5"), 500, path("r1.h5"))
s3, _ = score(path("shifted.h5"), 500, path("r3.h5"), ranks=3)
s2t, _ = score(path("shifted.h5"), 500, path("t2.h5"), threads=2)
same = lambda a, b: {k: v for k, v in a.items() if k != "seconds"} == \
    {k: v for k, v in b.items() if k != "seconds"}  # noqa: E731
check(not h5_differences(path("r1.h5"), path("r3.h5"), path("t2.h5")) and same(s1, s3)
      and same(s1, s2t), "1 rank, 3 ranks and 2 threads: the same bits")

# 4. Bad input.
r = run(["vae", "score", "--model", path("shifted.h5"), "--data", path("x.h5") + ":/X",
         "--importance-samples", "0"], ranks=2, ok=False)
lines = [line for line in r.stderr.splitlines() if line.startswith("caviar: ")]  # errors only
check(r.returncode != 0 and len(lines) == 1 and "--importance-samples must be >= 1" in lines[0],
      f"--importance-samples 0: one line, non-zero exit ({r.returncode}: {lines})")

# 5. A full-covariance encoder on data whose exact posterior is not diagonal.
M_full = M @ np.array([[1.0, 0.8], [0.0, 1.0]])
x_full = rng.normal(size=(N, Z)) @ M_full.T + c + np.sqrt(S2) * rng.normal(size=(N, D))
with h5py.File(path("x_full.h5"), "w") as f:
    f["X"] = x_full
cov_full = M_full @ M_full.T + S2 * np.eye(D)
r_full = x_full - c
exact_full = -0.5 * (D * np.log(2 * np.pi) + np.linalg.slogdet(cov_full)[1]
                     + np.einsum("ni,ij,nj->n", r_full, np.linalg.inv(cov_full), r_full))
train_full = ["-q", "vae", "train", "--data", path("x_full.h5") + ":/X", "--likelihood",
              "gaussian", "--hidden", str(D), "--latent", str(Z), "--epochs", "2",
              "--posterior", "full"]
run(train_full + ["--out", path("full1.h5")])
run(train_full + ["--out", path("full2.h5")], ranks=2)
check(not h5_differences(path("full1.h5"), path("full2.h5")),
      "vae train --posterior full: the same bits at 1 and 2 ranks")
with h5py.File(path("full1.h5"), "r") as f:
    check(f.attrs.get("posterior") == "full" and f["encoder/lower/W"].shape == (1, D),
          "the model file records the full posterior and its lower-triangle head")
write_linear(path("full1.h5"), M=M_full)
run(["-q", "vae", "score", "--model", path("full1.h5"), "--data", path("x_full.h5") + ":/X",
     "--importance-samples", "50", "--out", path("full_50.h5")])
with h5py.File(path("full_50.h5"), "r") as f:
    lp_full = f["log_px"][()]
err = np.abs(lp_full - exact_full).max()
check(err < 2e-3, f"full encoder = exact full posterior: per-row log p(x) = closed form "
                  f"(max error {err:.1e} nats)")

checks.finish()
