#!/usr/bin/env -S /usr/bin/python3
"""caviar plsa fit | score, end to end.

- one EM step against an independent NumPy implementation of Hofmann's (1999) updates, from the
  initial topics the fit itself wrote (--max-iter 0), and the log-likelihood of both states;
- the log-likelihood trace never decreases (EM), over a fit to a synthetic corpus;
- bitwise identical outputs (model file, per-document p(k|d), summary) at 1-4 ranks x 1-2 threads;
- checkpoint/resume: a fit stopped by a real SIGTERM (exit 75) and resumed at another rank count
  equals the uninterrupted fit bit for bit, and so does a resume from a count-triggered checkpoint;
- plsa score: the same perplexity as a NumPy document-completion computation, at 1 and 2 ranks;
- --heldout gives the same perplexity trace as plsa score of the saved model.

usage: test_plsa.py CAVIAR_BIN WORKDIR
"""
import os
import signal
import subprocess
import sys

import h5py
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from clitest import Checks, fresh_workdir, h5_differences, summary  # noqa: E402

caviar, work = sys.argv[1], sys.argv[2]
path = fresh_workdir(work)
checks = Checks(caviar)
check, run = checks.check, checks.run


def read_csr(f):
    with h5py.File(f, "r") as h:
        indptr, idx, data = h["indptr"][:], h["indices"][:], h["data"][:]
        v = len(h["vocab"])
    x = np.zeros((len(indptr) - 1, v))
    for d in range(len(indptr) - 1):
        for j in range(indptr[d], indptr[d + 1]):
            x[d, idx[j]] += data[j]
    return x


def loglik(x, theta, phi):
    p = theta @ phi
    m = x > 0
    return float(np.sum(x[m] * np.log(p[m])))


def em_step(x, theta, phi, smooth=0.0):
    """Hofmann (1999): E-step r_dwk = theta_dk phi_kw / sum_j theta_dj phi_jw, then
    phi_kw ∝ sum_d n_dw r_dwk (+ smooth) and theta_dk = sum_w n_dw r_dwk / n_d."""
    p = theta @ phi  # D x V
    ratio = np.divide(x, p, out=np.zeros_like(x), where=x > 0)
    nk_w = phi * (theta.T @ ratio)  # K x V: sum_d n_dw r_dwk
    nd_k = theta * (ratio @ phi.T)  # D x K: sum_w n_dw r_dwk
    nk_w = nk_w + smooth
    return nd_k / nd_k.sum(1, keepdims=True), nk_w / nk_w.sum(1, keepdims=True)


# --- one EM step against NumPy -----------------------------------------------------------------
run(["-q", "generate", "lda", "--docs", "60", "--words", "40", "--topics", "3", "--seed", "5",
     "--out", path("small.h5")])
x = read_csr(path("small.h5"))
fit = ["plsa", "fit", "--data", path("small.h5"), "--topics", "3", "--seed", "2", "--tol", "0"]
run(fit + ["--max-iter", "0", "--out", path("m0.h5"), "--doc-topics", path("t0.h5")])
run(fit + ["--max-iter", "1", "--out", path("m1.h5"), "--doc-topics", path("t1.h5")])
with h5py.File(path("m0.h5"), "r") as f:
    phi0 = f["topic_word"][:]
    ll0 = f["trace/objective"][:]
with h5py.File(path("t0.h5"), "r") as f:
    theta0 = f["doc_topics"][:]
with h5py.File(path("m1.h5"), "r") as f:
    phi1 = f["topic_word"][:]
    ll1 = f["trace/objective"][:]
with h5py.File(path("t1.h5"), "r") as f:
    theta1 = f["doc_topics"][:]
check(np.allclose(theta0, 1 / 3) and np.allclose(phi0.sum(1), 1), "initial state: uniform p(k|d), normalised topics")
check(abs(ll0[0] - loglik(x, theta0, phi0)) < 1e-9 * abs(ll0[0]),
      f"initial log-likelihood {ll0[0]:.12g} == NumPy {loglik(x, theta0, phi0):.12g}")
theta_ref, phi_ref = em_step(x, theta0, phi0)
check(np.allclose(phi1, phi_ref, rtol=1e-9, atol=1e-15), f"one M-step's topics == NumPy (max diff {np.abs(phi1 - phi_ref).max():.2e})")
check(np.allclose(theta1, theta_ref, rtol=1e-9, atol=1e-15), f"one M-step's p(k|d) == NumPy (max diff {np.abs(theta1 - theta_ref).max():.2e})")
check(len(ll1) == 2 and abs(ll1[1] - loglik(x, theta_ref, phi_ref)) < 1e-9 * abs(ll1[1]),
      f"log-likelihood after one step {ll1[1]:.12g} == NumPy {loglik(x, theta_ref, phi_ref):.12g}")

# The same step with smoothing: the MAP M-step, and the objective gains s sum log phi.
run(fit + ["--max-iter", "1", "--smooth", "0.5", "--out", path("ms.h5"), "--doc-topics", path("ts.h5")])
with h5py.File(path("ms.h5"), "r") as f:
    phi_s, ll_s = f["topic_word"][:], f["trace/objective"][:]
theta_sr, phi_sr = em_step(x, theta0, phi0, 0.5)
check(np.allclose(phi_s, phi_sr, rtol=1e-9, atol=1e-15), f"--smooth 0.5: one MAP M-step == NumPy (max diff {np.abs(phi_s - phi_sr).max():.2e})")
obj = loglik(x, theta_sr, phi_sr) + 0.5 * np.log(phi_sr).sum()
check(abs(ll_s[1] - obj) < 1e-9 * abs(obj), f"--smooth 0.5: objective {ll_s[1]:.12g} == NumPy log-likelihood + log prior {obj:.12g}")

# --- the log-likelihood never decreases ----------------------------------------------------------
run(["-q", "generate", "lda", "--docs", "700", "--words", "300", "--topics", "6", "--seed", "9",
     "--out", path("c.h5"), "--heldout", path("h.h5"), "--heldout-docs", "120"])
core = ["plsa", "fit", "--data", path("c.h5"), "--topics", "6", "--seed", "1", "--smooth", "0.01"]
base = core + ["--max-iter", "40", "--tol", "0", "--heldout", path("h.h5")]
s = summary(run(["-q"] + base + ["--out", path("ref.h5"), "--doc-topics", path("ref_t.h5")]))
with h5py.File(path("ref.h5"), "r") as f:
    tr = f["trace/objective"][:]
    held = f["trace/heldout"][:]
check(len(tr) == 41 and bool(np.all(np.diff(tr) >= 0)),
      f"EM log-likelihood never decreases over 40 iterations ({tr[0]:.6g} -> {tr[-1]:.6g}, smallest step {np.diff(tr).min():.3g})")
check(s["iterations"] == 40 and not s["converged"], "--tol 0 runs --max-iter iterations")
s_tol = summary(run(["-q"] + core + ["--max-iter", "40", "--tol", "1e-3"]))
check(s_tol["converged"] and s_tol["iterations"] < 40, f"--tol 1e-3 converges early ({s_tol['iterations']} iterations)")

# --- bitwise over ranks and threads -----------------------------------------------------------
for ranks, threads in ((1, 2), (2, 1), (3, 2), (4, 1)):
    tag = f"{ranks}x{threads}"
    s2 = summary(run(["-q"] + base + ["--out", path(f"m_{tag}.h5"), "--doc-topics", path(f"t_{tag}.h5")],
                     ranks, threads))
    diff = h5_differences(path("ref.h5"), path(f"m_{tag}.h5")) + h5_differences(path("ref_t.h5"), path(f"t_{tag}.h5"))
    check(not diff and s2["objective"] == s["objective"] and s2["heldout"] == s["heldout"],
          f"{tag} ranks x threads: bitwise the 1x1 fit {diff[:4]}")

# --- plsa score: document completion, against NumPy ----------------------------------------------
def completion_numpy(model, heldout):
    with h5py.File(model, "r") as f:
        phi = f["topic_word"][:]
    with h5py.File(heldout, "r") as h:
        indptr, idx, data = h["indptr"][:], h["indices"][:], h["data"][:].astype(np.int64)
    lp = nh = 0.0
    for d in range(len(indptr) - 1):
        pos, obs, hel = 0, [], []
        for j in range(indptr[d], indptr[d + 1]):
            c = int(data[j])
            o = (c + (1 if pos % 2 == 0 else 0)) // 2  # alternate tokens: the even positions observed
            pos += c
            obs.append((idx[j], o))
            hel.append((idx[j], c - o))
        theta = np.full(phi.shape[0], 1 / phi.shape[0])
        for _ in range(100):
            nxt = np.zeros_like(theta)
            for w, o in obs:
                if o > 0:
                    nxt += o * theta * phi[:, w] / (theta @ phi[:, w])
            nxt = nxt / nxt.sum()
            change = np.abs(nxt - theta).mean()
            theta = nxt
            if change < 1e-3:
                break
        for w, h in hel:
            if h > 0:
                lp += h * np.log(theta @ phi[:, w])
                nh += h
    return np.exp(-lp / nh)


ref_perp = completion_numpy(path("ref.h5"), path("h.h5"))
for ranks in (1, 2):
    sc = summary(run(["plsa", "score", "--model", path("ref.h5"), "--data", path("h.h5")], ranks))
    check(abs(sc["perplexity"] - ref_perp) < 1e-9 * ref_perp,
          f"plsa score at {ranks} rank(s): {sc['perplexity']:.10g} == NumPy {ref_perp:.10g}")
    check(sc["perplexity"] == held[-1], "plsa score == the fit's last --heldout perplexity")

# --- checkpoint / resume -------------------------------------------------------------------------
# Resume from a count-triggered checkpoint at another rank count.
run(["-q"] + core + ["--max-iter", "17", "--tol", "0", "--heldout", path("h.h5"),
                          "--checkpoint", path("ck.h5"), "--checkpoint-every", "5"], 2, 1)
with h5py.File(path("ck.h5"), "r") as f:
    check(int(f.attrs["iteration"]) == 15 and f["rows/doc_topics"].shape == (700, 6),
          "checkpoint every 5: iteration 15, every document's p(k|d) in one dataset")
run(["-q"] + base + ["--resume", path("ck.h5"), "--out", path("res.h5"), "--doc-topics", path("res_t.h5")], 3, 1)
diff = h5_differences(path("ref.h5"), path("res.h5")) + h5_differences(path("ref_t.h5"), path("res_t.h5"))
check(not diff, f"resumed at 3 ranks from a 2-rank checkpoint: bitwise the uninterrupted fit {diff[:4]}")

# A real SIGTERM during the fit: exit 75 after writing the checkpoint; the resume completes it.
env = dict(os.environ, OMP_NUM_THREADS="1")
long = core + ["--max-iter", "400", "--tol", "0"]
proc = subprocess.Popen([caviar] + long + ["--checkpoint", path("sig.h5"), "--out", path("sig_m.h5")],
                        stderr=subprocess.PIPE, text=True, env=env)
seen = 0
while seen < 5:  # some iterations in
    line = proc.stderr.readline()
    seen += line.startswith("iter")
proc.send_signal(signal.SIGTERM)
err = proc.stderr.read()
rc = proc.wait(timeout=120)
check(rc == 75 and "stopped by SIGTERM" in err and os.path.exists(path("sig.h5")) and not os.path.exists(path("sig_m.h5")),
      f"SIGTERM: exit {rc}, checkpoint written, no model file ({err.strip()[-120:]})")
run(["-q"] + long + ["--resume", path("sig.h5"), "--out", path("sig_m.h5")], 2, 2)
run(["-q"] + long + ["--out", path("full_m.h5")])
diff = h5_differences(path("full_m.h5"), path("sig_m.h5"))
check(not diff, f"stopped by SIGTERM, resumed at 2x2: bitwise the uninterrupted 400-iteration fit {diff[:4]}")

# A checkpoint refuses another seed, K or smoothing, in one line.
for name, value, expect in (("--seed", "7", "--seed 1, this run has --seed 7"),
                            ("--topics", "5", "--topics 6, this run has --topics 5"),
                            ("--smooth", "0", "--smooth 0.01, this run has --smooth 0")):
    argv = list(core)
    argv[argv.index(name) + 1] = value
    r = run(argv + ["--resume", path("ck.h5"), "--heldout", path("h.h5")], ok=False)
    check(r.returncode == 1 and expect in r.stderr, f"resume with {name} {value} refused: {r.stderr.strip()[-140:]}")

checks.finish()
