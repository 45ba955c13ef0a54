#!/usr/bin/env -S /usr/bin/python3
"""caviar gmm summarize against an independent computation in numpy/scipy.

- blocked chain (2-D data from `caviar generate gmm`, K = 3) and a CAVI fit: the matching equals
  scipy's linear_sum_assignment on the squared distances between each draw's means and the
  reference's; weights, means, covariances (mean and sd, ddof 1) of the relabelled draws, the
  reference datasets and the max-difference attributes agree to 1e-12;
- collapsed chain (--alpha0 0.5 --beta0 2, so the prior matters): each draw's weights and means
  are (alpha0 + N_k) / (K alpha0 + N) and (beta0 m0 + S_k) / (beta0 + N_k), from draws/counts and
  draws/sums, then the same check; no covariances;
- a copy of the reference with its components permuted gives the summary permuted the same way;
  a copy of the chain with each draw's components shuffled gives the same summary;
- 1 and 2 ranks give the same file contents (provenance aside) and the same JSON line;
- --plot writes a PNG (signature) and leaves no temporary file.

usage: test_gmm_summarize.py CAVIAR_BIN WORKDIR
"""
import os
import sys

import h5py
import numpy as np
from scipy.optimize import linear_sum_assignment

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from clitest import Checks, fresh_workdir, h5_differences, json_summary, summary  # noqa: E402

K, TOL = 3, 1e-12
caviar, work = sys.argv[1], sys.argv[2]
p = fresh_workdir(work)
checks = Checks(caviar)
check, run = checks.check, checks.run


def close(a, b):
    a, b = np.asarray(a, float), np.asarray(b, float)
    return a.shape == b.shape and np.allclose(a, b, rtol=TOL, atol=TOL, equal_nan=True)


def expected(means, weights, covs, ref):
    """The summary computed here: matching by scipy, then numpy means and sds of the draws."""
    rm = ref["means"]
    n = len(means)
    match = np.empty((n, K), dtype=np.int64)
    for t in range(n):
        cost = ((rm[:, None, :] - means[t][None, :, :]) ** 2).sum(-1)  # ref k x chain j
        rows, cols = linear_sum_assignment(cost)
        match[t, rows] = cols
    idx = np.arange(n)[:, None]
    out = {"matching": match}
    for name, v in (("weights", weights), ("means", means), ("covariances", covs)):
        if v is None:
            continue
        rel = v[idx, match]
        out[name + "/mean"], out[name + "/sd"] = rel.mean(0), rel.std(0, ddof=1)
    return out


def read_ref(path):
    with h5py.File(path, "r") as f:
        return {k: f[k][()] for k in ("weights", "means", "covariances")}


def compare(label, out, exp, ref, with_cov):
    with h5py.File(out, "r") as f:
        check(np.array_equal(f["matching"][()], exp["matching"]),
              f"{label}: matching = linear_sum_assignment per draw")
        for key in ("weights/mean", "weights/sd", "means/mean", "means/sd") + (
                ("covariances/mean", "covariances/sd") if with_cov else ()):
            check(close(f[key][()], exp[key]), f"{label}: {key} to {TOL}")
        check(with_cov == ("covariances" in f), f"{label}: covariances only from a blocked chain")
        for key in ("weights", "means", "covariances"):
            check(np.array_equal(f["reference/" + key][()], ref[key]), f"{label}: reference/{key}")
        a = f.attrs
        check(a["n_draws"] == len(exp["matching"]), f"{label}: n_draws attribute")
        check(close(a["max_abs_diff_mean"], np.abs(exp["means/mean"] - ref["means"]).max()),
              f"{label}: max_abs_diff_mean")
        if with_cov:
            check(close(a["max_abs_diff_covariance"],
                        np.abs(exp["covariances/mean"] - ref["covariances"]).max()),
                  f"{label}: max_abs_diff_covariance")
        check(all(k in a for k in ("version", "command", "ranks", "threads", "seed", "data")),
              f"{label}: provenance attributes")


run(["-q", "generate", "gmm", "--n", "400", "--dim", "2", "--components", str(K), "--seed", "8",
     "--out", p("x.h5") + ":/X"])
run(["-q", "gmm", "fit", "--data", p("x.h5") + ":/X", "-k", str(K), "--seed", "1", "--out",
     p("cavi.h5")])
run(["-q", "gmm", "sample", "--data", p("x.h5") + ":/X", "-k", str(K), "--sampler", "blocked",
     "--sweeps", "40", "--burn-in", "10", "--thin", "2", "--seed", "2", "--out", p("blocked.h5")])
run(["-q", "gmm", "sample", "--data", p("x.h5") + ":/X", "-k", str(K), "--sampler", "collapsed",
     "--sweeps", "30", "--burn-in", "5", "--alpha0", "0.5", "--beta0", "2", "--seed", "3",
     "--out", p("collapsed.h5")])
ref = read_ref(p("cavi.h5"))

# Blocked.
r1 = run(["gmm", "summarize", "--chain", p("blocked.h5"), "--reference", p("cavi.h5"), "--out",
          p("sum_b1.h5"), "--plot", p("sum_b.png")])
with h5py.File(p("blocked.h5"), "r") as f:
    bw, bm, bc = (f["draws/" + k][()] for k in ("weights", "means", "covariances"))
exp_b = expected(bm, bw, bc, ref)
compare("blocked", p("sum_b1.h5"), exp_b, ref, True)
j = summary(r1)
check(j["sampler"] == "blocked" and j["n_draws"] == 15 and j["k"] == K and j["d"] == 2,
      "blocked: JSON sampler, n_draws (40 - 10) / 2, k, d")
check("component" in r1.stderr and r1.stderr.count("\n") >= K + 1, "blocked: table on stderr")
with open(p("sum_b.png"), "rb") as f:
    check(f.read(8) == b"\x89PNG\r\n\x1a\n", "--plot: a PNG")
check(not [f for f in os.listdir(work) if "tmp-caviar" in f], "no temporary files left")

# 2 ranks: the same contents and JSON line.
r2 = run(["gmm", "summarize", "--chain", p("blocked.h5"), "--reference", p("cavi.h5"), "--out",
          p("sum_b2.h5")], ranks=2)
check(not h5_differences(p("sum_b1.h5"), p("sum_b2.h5")), "1 and 2 ranks: the same contents")
drop = lambda j: {k: v for k, v in j.items() if k not in ("out", "plot")}  # noqa: E731
check(drop(json_summary(r1.stdout)) == drop(json_summary(r2.stdout)),
      "1 and 2 ranks: the same JSON line (but for --out, --plot)")

# Label switching: the reference's components permuted, the summary permuted the same way.
perm = np.array([2, 0, 1])
with h5py.File(p("cavi.h5"), "r") as src, h5py.File(p("cavi_perm.h5"), "w") as dst:
    for k in src.attrs:
        dst.attrs[k] = src.attrs[k]
    for k in ("weights", "means", "covariances"):
        dst[k] = src[k][()][perm]
run(["-q", "gmm", "summarize", "--chain", p("blocked.h5"), "--reference", p("cavi_perm.h5"),
     "--out", p("sum_perm.h5")])
with h5py.File(p("sum_b1.h5"), "r") as a, h5py.File(p("sum_perm.h5"), "r") as b:
    same = all(np.array_equal(a[k][()][perm], b[k][()]) for k in
               ("weights/mean", "weights/sd", "means/mean", "means/sd", "covariances/mean",
                "covariances/sd", "reference/means"))
    check(same, "permuted reference: the same summary, permuted (bitwise)")
    check(np.array_equal(a["matching"][()][:, perm], b["matching"][()]),
          "permuted reference: the matching's columns permuted")

# Label switching in the chain: each draw's components shuffled (a fixed random permutation per
# draw) give the same summary, bit for bit, and the matching follows the shuffle.
rng = np.random.default_rng(5)
shuffles = np.array([rng.permutation(K) for _ in range(len(bw))])
rows = np.arange(len(bw))[:, None]
with h5py.File(p("blocked.h5"), "r") as src, h5py.File(p("switched.h5"), "w") as dst:
    for k in src.attrs:
        dst.attrs[k] = src.attrs[k]
    for k in ("trace/log_joint", "trace/counts"):
        dst[k] = src[k][()]
    for k in ("weights", "means", "covariances"):
        dst["draws/" + k] = src["draws/" + k][()][rows, shuffles]
run(["-q", "gmm", "summarize", "--chain", p("switched.h5"), "--reference", p("cavi.h5"),
     "--out", p("sum_switched.h5")])
with h5py.File(p("sum_b1.h5"), "r") as a, h5py.File(p("sum_switched.h5"), "r") as b:
    check(all(np.array_equal(a[k][()], b[k][()]) for k in
              ("weights/mean", "weights/sd", "means/mean", "means/sd", "covariances/mean",
               "covariances/sd")), "switched chain: the same summary (bitwise)")
    # Drawn component j now sits at position inverse[j]: the matching moves with it.
    inverse = np.argsort(shuffles, axis=1)
    check(np.array_equal(b["matching"][()], inverse[rows, a["matching"][()]]),
          "switched chain: the matching follows the shuffle")

# Collapsed: posterior means of each draw's statistics under the chain's prior.
run(["-q", "gmm", "summarize", "--chain", p("collapsed.h5"), "--reference", p("cavi.h5"),
     "--out", p("sum_c.h5")])
alpha0, beta0, m0 = 0.5, 2.0, np.zeros(2)
with h5py.File(p("collapsed.h5"), "r") as f:
    counts, sums = f["draws/counts"][()], f["draws/sums"][()]
    check(f["prior/alpha0"][()] == alpha0 and f["prior/beta0"][()] == beta0 and
          np.array_equal(f["prior/m0"][()], m0), "collapsed chain records its prior")
cw = (alpha0 + counts) / (K * alpha0 + counts.sum(1, keepdims=True))
cm = (beta0 * m0 + sums) / (beta0 + counts[:, :, None])
compare("collapsed", p("sum_c.h5"), expected(cm, cw, None, ref), ref, False)

checks.finish()
