#!/usr/bin/env -S /usr/bin/python3
"""Cross-check `caviar gmm fit` against scikit-learn's BayesianGaussianMixture.

usage: check_sklearn.py CAVIAR_BIN WORKDIR [--ranks P] [--threads T] [-v]

For every case it generates data and random initial responsibilities with a
fixed numpy seed, writes them to WORKDIR/<case>/x.h5:/X and :/resp, runs

    mpirun -n P CAVIAR_BIN gmm fit --data x.h5:/X --components K
        --covariance full|diag --init x.h5:/resp --max-iter n --tol 0
        --out model.h5 --labels labels.h5

and drives sklearn 1.2 by hand with the same semantics (one M-step from the
given responsibilities, then n x (E-step, M-step)):

    est._check_parameters(X); est._initialize(X, resp)
    for _ in range(n): _, log_resp = est._e_step(X); est._m_step(X, log_resp)

Compared (pass = np.allclose(caviar, sklearn, rtol=1e-8, atol=1e-12*max|sklearn|)):
  /weights, /means, /covariances and /posterior/{alpha,beta,m,W,nu}.
Checked with gmm_reference (independent NumPy/SciPy formulas, rel 1e-9):
  root attribute `elbo` and /trace/elbo[-1] against the full ELBO recomputed
  from the saved posterior + prior + data; every /trace/elbo[t] against the
  ELBO of sklearn's parameters after iteration t+1; /trace/elbo non-decreasing
  (a decrease larger than 1e-12*|ELBO|, i.e. beyond round-off, fails).
Also: /prior/* values, n_iter, the JSON line on stdout, /labels, and (if the
binary has it) `caviar gmm score` against gmm_reference.avg_log_predictive
(the Student-t mixture, rel 1e-9).

diag: sklearn's "diag" model is not caviar's. Their M-steps are identical
(W_kd^-1 = W0_d^-1 + N_k S_kd + beta0 N_k/beta_k (xbar_kd - m0_d)^2, nu_k =
nu0 + N_k, ...), but sklearn's E-step uses the full-Wishart
E[ln|Lambda_k|] = sum_{i=1}^D psi((nu_k+1-i)/2) + ..., whereas the exact
product-of-1-D-Wisharts model has D psi(nu_k/2) + .... The difference
f(nu_k) = sum_i psi((nu_k+1-i)/2) - D psi(nu_k/2) depends on k only through
nu_k, so it cancels in the normalised responsibilities whenever all nu_k are
equal. Hence two diag cases:
  * diag_balanced: pure sklearn, n = 1. The initial responsibilities have
    exactly equal column sums (every row is a cyclic shift of one random
    probability vector, each shift used N/K times), so nu_k is the same for
    all k after the initial M-step and sklearn's first E-step equals the exact
    one (the script measures and prints that difference). After iteration 1
    the N_k differ and the two models diverge, so n = 1 is the longest run at
    which pure sklearn is a valid reference for every quantity.
  * diag_init: pure sklearn, n = 0 (only the initial M-step, which is
    identical in both models), arbitrary random responsibilities.
  * diag_exactE: n = 10 with sklearn's M-step (_m_step) fed by the exact diag
    E-step from gmm_reference.responsibilities; this checks the M-step against
    sklearn over a whole run and the E-step against the independent reference.
Also for every case gmm_reference's own E/M-steps are run alongside and their
deviation from sklearn printed ("ref" column), showing the tolerance is
achievable by an independent implementation.
"""

import argparse
import json
import math
import os
import shlex
import subprocess
import sys
import time
import warnings

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gmm_reference as gr  # noqa: E402

import h5py  # noqa: E402
from sklearn.mixture import BayesianGaussianMixture  # noqa: E402

RTOL = 1e-8           # parameters vs sklearn
ATOL_REL = 1e-12      # atol = ATOL_REL * max|sklearn|
ELBO_RTOL = 1e-9      # ELBO vs gmm_reference
MONO_RTOL = 1e-12     # allowed round-off decrease of the trace, relative to |ELBO|


# ----------------------------------------------------------------- cases

CASES = [
    # name, N, D, K, cov, n_iter, options
    dict(name="full_N600_D2_K3", N=600, D=2, K=3, cov="full", n=10, seed=11),
    dict(name="full_N900_D7_K5", N=900, D=7, K=5, cov="full", n=10, seed=12),
    dict(name="full_N800_D12_K4", N=800, D=12, K=4, cov="full", n=10, seed=19),
    dict(name="full_empty_N500_D3_K4", N=500, D=3, K=4, cov="full", n=10, seed=13, empty=3),
    dict(name="full_priors_N400_D3_K3", N=400, D=3, K=3, cov="full", n=10, seed=14,
         priors=dict(alpha0=0.7, beta0=0.25, nu0=5.5)),
    dict(name="diag_balanced_N600_D4_K3", N=600, D=4, K=3, cov="diag", n=1, seed=15,
         balanced=True),
    dict(name="diag_init_N500_D3_K3", N=500, D=3, K=3, cov="diag", n=0, seed=18),
    dict(name="diag_exactE_N700_D5_K4", N=700, D=5, K=4, cov="diag", n=10, seed=16,
         estep="exact"),
    dict(name="diag_exactE_empty_N500_D3_K4", N=500, D=3, K=4, cov="diag", n=10, seed=17,
         estep="exact", empty=1),
    # Dirichlet-process (truncated stick-breaking) weights: sklearn's
    # weight_concentration_prior_type="dirichlet_process".
    dict(name="dp_full_N600_D2_K5", N=600, D=2, K=5, cov="full", n=10, seed=21,
         weights="stick-breaking"),
    dict(name="dp_full_priors_N700_D4_K6", N=700, D=4, K=6, cov="full", n=10, seed=22,
         weights="stick-breaking", priors=dict(alpha0=2.5, beta0=0.5, nu0=6.0)),
    dict(name="dp_full_empty_N500_D3_K4", N=500, D=3, K=4, cov="full", n=10, seed=23,
         weights="stick-breaking", empty=2),
    dict(name="dp_diag_exactE_N600_D3_K4", N=600, D=3, K=4, cov="diag", n=10, seed=24,
         weights="stick-breaking", estep="exact"),
]

# EM (maximum likelihood) against sklearn.mixture.GaussianMixture from the same
# responsibilities: params after n iterations and the log-likelihood trace.
EM_CASES = [
    dict(name="em_full_N600_D3_K4", N=600, D=3, K=4, cov="full", n=15, seed=31, reg=1e-6),
    dict(name="em_full_noreg_N500_D2_K3", N=500, D=2, K=3, cov="full", n=10, seed=32, reg=0.0),
    dict(name="em_full_N800_D9_K4", N=800, D=9, K=4, cov="full", n=15, seed=36, reg=1e-6),
    dict(name="em_tied_N700_D6_K3", N=700, D=6, K=3, cov="tied", n=15, seed=37, reg=1e-6),
    dict(name="em_diag_N700_D5_K3", N=700, D=5, K=3, cov="diag", n=15, seed=33, reg=1e-4),
    dict(name="em_tied_N600_D3_K4", N=600, D=3, K=4, cov="tied", n=15, seed=34, reg=1e-6),
    dict(name="em_spherical_N700_D4_K3", N=700, D=4, K=3, cov="spherical", n=15, seed=35,
         reg=1e-5),
]


def make_case_data(c):
    """Clustered data and random initial responsibilities (fixed seed)."""
    rng = np.random.default_rng(c["seed"])
    N, D, K = c["N"], c["D"], c["K"]
    ktrue = max(2, K - 1)
    centers = rng.normal(0.0, 2.5, size=(ktrue, D))
    scales = rng.uniform(0.4, 1.3, size=(ktrue, D))
    z = rng.integers(0, ktrue, size=N)
    X = centers[z] + rng.normal(size=(N, D)) * scales[z]
    if c.get("balanced"):
        assert N % K == 0
        p = rng.dirichlet(np.ones(K))
        shifts = rng.permutation(np.arange(N) % K)
        resp = np.stack([np.roll(p, s) for s in shifts])
    else:
        resp = rng.dirichlet(np.ones(K), size=N)
    if "empty" in c:
        resp[:, c["empty"]] = 0.0
        resp /= resp.sum(axis=1, keepdims=True)
        assert np.all(resp[:, c["empty"]] == 0.0)
    return np.ascontiguousarray(X, dtype=np.float64), np.ascontiguousarray(resp, dtype=np.float64)


def case_priors(c):
    D, K = c["D"], c["K"]
    p = dict(alpha0=1.0 / K, beta0=1.0, nu0=float(D))
    p.update(c.get("priors", {}))
    return p


# -------------------------------------------------------------- sklearn side

def sklearn_run(c, X, resp):
    """Return the list of contract models after the initial M-step and after
    each of the n iterations, plus diagnostics."""
    D, K, ct = c["D"], c["K"], c["cov"]
    pr = case_priors(c)
    est = BayesianGaussianMixture(
        n_components=K, covariance_type=ct,
        weight_concentration_prior_type=("dirichlet_process"
                                          if c.get("weights") == "stick-breaking"
                                          else "dirichlet_distribution"),
        weight_concentration_prior=pr["alpha0"], mean_precision_prior=pr["beta0"],
        mean_prior=np.zeros(D), degrees_of_freedom_prior=pr["nu0"],
        covariance_prior=np.eye(D) if ct == "full" else np.ones(D), reg_covar=0.0)
    est._check_parameters(X)
    est._initialize(X, resp)
    traj = [gr.model_from_sklearn(est)]
    diag_estep_gap = []
    for _ in range(c["n"]):
        _, log_resp = est._e_step(X)
        if ct == "diag":
            exact = gr.responsibilities(X, traj[-1], log=True)
            diag_estep_gap.append(float(np.max(np.abs(np.exp(exact) - np.exp(log_resp)))))
            if c.get("estep") == "exact":
                log_resp = exact
        est._m_step(X, log_resp)
        traj.append(gr.model_from_sklearn(est))
    return traj, est, diag_estep_gap


def reference_run(c, X, resp, prior):
    """gmm_reference's own E/M iterations (no sklearn involved)."""
    ct = c["cov"]
    w = c.get("weights", "dirichlet")
    post = gr.m_step(X, resp, prior, ct, weights=w)
    mk = lambda p: gr.make_model(None if p["sticks"] is not None else p["alpha"], p["beta"],
                                 p["m"], p["W"], p["nu"], cov_type=ct, sticks=p["sticks"], **prior)
    traj = [mk(post)]
    for _ in range(c["n"]):
        post = gr.m_step(X, gr.responsibilities(X, traj[-1]), prior, ct, weights=w)
        traj.append(mk(post))
    return traj


# ---------------------------------------------------------------- comparison

class Checks:
    def __init__(self):
        self.rows = []

    def add(self, name, ok, msg):
        self.rows.append((name, bool(ok), msg))

    def arrays(self, name, a, b, ref=None):
        """allclose(a, b, rtol=RTOL, atol=ATOL_REL*max|b|); prints max rel err."""
        a = np.asarray(a, dtype=np.float64)
        b = np.asarray(b, dtype=np.float64)
        if a.shape != b.shape:
            self.add(name, False, "shape %s != expected %s" % (a.shape, b.shape))
            return math.inf
        if not np.all(np.isfinite(a)):
            self.add(name, False, "non-finite values in caviar output: %s" % a.ravel()[:8])
            return math.inf
        scale = float(np.max(np.abs(b))) if b.size else 0.0
        atol = ATOL_REL * scale
        err = np.abs(a - b)
        rel = float(np.max(err / np.maximum(np.abs(b), 1e-300 + atol))) if b.size else 0.0
        ok = bool(np.allclose(a, b, rtol=RTOL, atol=atol))
        msg = "maxrel=%.2e maxabs=%.2e" % (rel, float(err.max()) if b.size else 0.0)
        if ref is not None:
            r = np.asarray(ref, dtype=np.float64)
            msg += " (ref %.2e)" % float(np.max(np.abs(r - b) / np.maximum(np.abs(b), 1e-300 + atol)))
        self.add(name, ok, msg)
        return rel

    def scalar(self, name, a, b, rtol):
        rel = abs(a - b) / max(abs(b), 1e-300)
        ok = math.isfinite(a) and rel <= rtol
        self.add(name, ok, "caviar=%.15e ref=%.15e rel=%.2e" % (a, b, rel))
        return rel

    @property
    def ok(self):
        return all(r[1] for r in self.rows)


def _attr(attrs, key):
    v = attrs.get(key)
    if isinstance(v, bytes):
        return v.decode()
    if isinstance(v, np.ndarray) and v.size == 1:
        return v.reshape(()).item()
    if isinstance(v, np.generic):
        return v.item()
    return v


def run_caviar(args, c, casedir, xfile):
    model = os.path.join(casedir, "model.h5")
    labels = os.path.join(casedir, "labels.h5")
    for f in (model, labels):
        if os.path.exists(f):
            os.remove(f)
    cmd = mpirun_prefix(args) + [args.caviar, "gmm", "fit",
            "--data", xfile + ":/X", "--components", str(c["K"]),
            "--covariance", c["cov"], "--init", xfile + ":/resp",
            "--max-iter", str(c["n"]), "--tol", "0", "--seed", "1",
            "--out", model, "--labels", labels]
    if "weights" in c:
        cmd += ["--weights", c["weights"]]
    if "priors" in c:
        p = case_priors(c)
        cmd += ["--alpha0", repr(p["alpha0"]), "--beta0", repr(p["beta0"]), "--nu0", repr(p["nu0"])]
    env = dict(os.environ)
    if args.threads is not None:
        env["OMP_NUM_THREADS"] = str(args.threads)
    t0 = time.time()
    try:
        pr = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return None, cmd, "timeout after %ds" % args.timeout, None
    dt = time.time() - t0
    if args.verbose:
        print("  $ " + " ".join(shlex.quote(x) for x in cmd) + "   (%.2fs, rc=%d)" % (dt, pr.returncode))
    if pr.returncode != 0:
        return None, cmd, "exit code %d\n--- stdout\n%s--- stderr\n%s" % (
            pr.returncode, pr.stdout[-3000:], pr.stderr[-3000:]), None
    js = None
    for line in reversed(pr.stdout.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                js = json.loads(line)
                break
            except ValueError:
                pass
    return (model, labels), cmd, pr.stdout, js


def mpirun_prefix(args):
    cmd = [args.mpirun]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    if args.ranks > 2 or args.ranks > (os.cpu_count() or 1):
        cmd.append("--oversubscribe")
    return cmd + ["-n", str(args.ranks)]


def run_score(args, model, xfile):
    """`caviar gmm score` -> float from its JSON line ('score' key), or an error string."""
    cmd = mpirun_prefix(args) + [args.caviar, "gmm", "score", "--model", model, "--data", xfile + ":/X"]
    try:
        pr = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return "timeout: " + " ".join(cmd)
    if pr.returncode != 0:
        return "exit code %d: %s" % (pr.returncode, pr.stderr[-1000:])
    for line in reversed(pr.stdout.strip().splitlines()):
        try:
            js = json.loads(line)
        except ValueError:
            continue
        for key in ("score", "avg_log_predictive", "log_predictive"):
            if key in js:
                return float(js[key])
    return "no JSON with a 'score' key on stdout: %r" % pr.stdout[-300:]


def check_case(args, c):
    casedir = os.path.join(args.workdir, c["name"])
    os.makedirs(casedir, exist_ok=True)
    X, resp = make_case_data(c)
    xfile = os.path.join(casedir, "x.h5")
    with h5py.File(xfile, "w") as f:
        f["X"] = X
        f["resp"] = resp
    ch = Checks()
    ct, n, D = c["cov"], c["n"], c["D"]
    pr = case_priors(c)
    prior = dict(alpha0=pr["alpha0"], beta0=pr["beta0"], m0=np.zeros(D),
                 W0=np.eye(D) if ct == "full" else np.ones(D), nu0=pr["nu0"])

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traj, est, gap = sklearn_run(c, X, resp)
    reft = reference_run(c, X, resp, prior)
    if gap:
        # for diag_balanced this must be round-off small, otherwise the pure
        # sklearn comparison would be meaningless
        info = "diag: max|r_sklearn - r_exact| per E-step = " + " ".join("%.1e" % g for g in gap)
        if c.get("balanced"):
            ch.add("sklearn_estep_equals_exact", gap[0] < 1e-12, info)
        elif args.verbose:
            print("  " + info)

    out, cmd, stdout, js = run_caviar(args, c, casedir, xfile)
    if out is None:
        ch.add("caviar_run", False, "caviar failed: %s\n  cmd: %s" % (stdout, " ".join(cmd)))
        return ch, {}
    model_path, labels_path = out
    try:
        cm = gr.load_model(model_path)
    except Exception as e:  # noqa: BLE001
        ch.add("model_file", False, "cannot read %s per the contract: %r" % (model_path, e))
        return ch, {}

    sk, rf = traj[-1], reft[-1]
    skp, rfp, cp = sk["posterior"], rf["posterior"], cm["posterior"]
    summary = {}
    if c.get("weights") == "stick-breaking":
        # sklearn's own expected weights (weights_, set by _set_parameters)
        est._set_parameters(est._get_parameters())
        summary["weights"] = ch.arrays("weights", cm["weights"], est.weights_,
                                       gr.expected_weights(rfp))
        ch.arrays("posterior/sticks", cp["sticks"], skp["sticks"], rfp["sticks"])
    else:
        summary["weights"] = ch.arrays("weights", cm["weights"], skp["alpha"] / skp["alpha"].sum(),
                                       rfp["alpha"] / rfp["alpha"].sum())
    summary["means"] = ch.arrays("means", cm["means"], est.means_, rfp["m"])
    summary["covariances"] = ch.arrays("covariances", cm["covariances"], est.covariances_,
                                       gr.expected_covariances(rf))
    for k in ("alpha", "beta", "m", "nu", "W"):
        if k == "alpha" and c.get("weights") == "stick-breaking":
            continue
        ch.arrays("posterior/" + k, cp[k], skp[k], rfp[k])
    for k in ("alpha0", "beta0", "nu0"):
        ch.scalar("prior/" + k, float(cm["prior"][k]), float(prior[k]), 1e-15)
    ch.arrays("prior/m0", cm["prior"]["m0"], prior["m0"])
    ch.arrays("prior/W0", cm["prior"]["W0"], prior["W0"])
    ch.add("covariance_type", cm["cov_type"] == ct, "file says %r" % cm["cov_type"])

    # ---- ELBO
    e_ref = gr.elbo(X, cm)
    attrs = cm["attrs"]
    e_attr = _attr(attrs, "elbo")
    if e_attr is None:
        ch.add("attr elbo", False, "missing root attribute 'elbo'")
        summary["elbo"] = math.inf
    else:
        summary["elbo"] = ch.scalar("attr elbo vs reference", float(e_attr), e_ref, ELBO_RTOL)
    trace = cm["trace"]
    if trace is None:
        ch.add("trace", False, "missing /trace/elbo")
    else:
        # Two readings of "the ELBO after each iteration": T = n (ELBO of the
        # posterior after iterations 1..n) or T = n+1 (also the ELBO of the
        # posterior from the initial M-step, as iteration 0). Both accepted;
        # the one found is printed and then checked value by value.
        all_elbos = np.array([gr.elbo(X, m) for m in traj])      # theta_0 .. theta_n
        if trace.shape == (n,):
            expect, conv = all_elbos[1:], "T=n (iterations 1..n)"
        elif trace.shape == (n + 1,):
            expect, conv = all_elbos, "T=n+1 (iteration 0 = initial M-step, then 1..n)"
        else:
            expect, conv = None, None
        ch.add("trace length", conv is not None,
               "T=%d, n=%d: %s" % (trace.size, n, conv or "expected n or n+1"))
        if trace.size:
            ch.scalar("trace[-1] vs reference", float(trace[-1]), e_ref, ELBO_RTOL)
            if expect is not None and expect.size:
                rel = np.abs(trace - expect) / np.abs(expect)
                ch.add("trace vs ELBO(sklearn iterates)", bool(np.all(rel <= ELBO_RTOL)),
                       "max rel=%.2e over %d entries" % (rel.max(), rel.size))
            d = np.diff(trace)
            worst = float(d.min()) if d.size else 0.0
            tol = MONO_RTOL * float(np.max(np.abs(trace)))
            ch.add("trace non-decreasing", worst >= -tol,
                   "min step=%.3e (allowed -%.1e); first=%.10e last=%.10e"
                   % (worst, tol, trace[0], trace[-1]))
            e0 = all_elbos[0]
            ch.add("ELBO(init) <= trace[0]", e0 <= trace[0] + tol,
                   "ELBO after initial M-step=%.10e trace[0]=%.10e" % (e0, trace[0]))
    n_iter = _attr(attrs, "n_iter")
    ch.add("attr n_iter", n_iter is not None and int(n_iter) == n, "n_iter=%r expected %d" % (n_iter, n))
    for key in ("converged", "ranks", "threads", "seed", "version", "command", "algorithm"):
        if key not in attrs:
            ch.add("attr " + key, False, "missing root attribute %r" % key)
    if "ranks" in attrs:
        ch.add("attr ranks", int(_attr(attrs, "ranks")) == args.ranks, "ranks=%r" % _attr(attrs, "ranks"))

    # ---- stdout JSON
    if js is None:
        ch.add("stdout json", False, "no JSON line on stdout: %r" % stdout[-500:])
    else:
        okj = ("elbo" in js and e_attr is not None
               and abs(float(js["elbo"]) - float(e_attr)) <= 1e-12 * abs(float(e_attr))
               and js.get("iterations") == n and js.get("ranks") == args.ranks)
        ch.add("stdout json", okj, json.dumps(js))

    # ---- `caviar gmm score` (if the binary has it) vs the Student-t mixture
    if args.has_score:
        sc = run_score(args, model_path, xfile)
        alpd = gr.avg_log_predictive(X, cm)
        if isinstance(sc, str):
            ch.add("gmm score", False, sc)
        else:
            ch.scalar("gmm score vs avg log predictive", sc, alpd, ELBO_RTOL)

    # ---- labels: argmax of the responsibilities of the final q(theta) (or,
    # tolerated, of the previous iterate: the E-step that fed the last M-step)
    try:
        with h5py.File(labels_path, "r") as f:
            lab = f["labels"][...]
            has_r = "responsibilities" in f
            rr = f["responsibilities"][...] if has_r else None
        lr_final = gr.responsibilities(X, cm, log=True)
        srt = np.sort(lr_final, axis=1)
        near_tie = (srt[:, -1] - srt[:, -2]) < 1e-9
        mism_final = int(np.sum((lab != np.argmax(lr_final, axis=1)) & ~near_tie))
        lr_prev = gr.responsibilities(X, traj[-2] if n > 0 else traj[-1], log=True)
        mism_prev = int(np.sum(lab != np.argmax(lr_prev, axis=1)))
        okl = lab.shape == (X.shape[0],) and lab.dtype == np.int64 and (mism_final == 0 or mism_prev == 0)
        msg = "dtype=%s shape=%s mismatches vs argmax r(final q)=%d, vs r(previous q)=%d" % (
            lab.dtype, lab.shape, mism_final, mism_prev)
        if has_r:
            msg += "; /responsibilities maxdiff vs r(final q)=%.1e" % float(
                np.max(np.abs(rr - np.exp(lr_final))))
        ch.add("labels", okl, msg)
    except Exception as e:  # noqa: BLE001
        ch.add("labels", False, "cannot check %s: %r" % (labels_path, e))
    return ch, summary


def check_em_case(args, c):
    """caviar gmm fit --algorithm em vs GaussianMixture driven by hand:
    est._initialize(X, resp); n x (_e_step, _m_step). Compares weights_,
    means_, covariances_, precisions_cholesky_ (rtol 1e-8) and the whole
    log-likelihood trace (est.score(X) * N after the initial M-step and after
    every iteration; rel 1e-9), which must also never decrease."""
    from sklearn.mixture import GaussianMixture
    casedir = os.path.join(args.workdir, c["name"])
    os.makedirs(casedir, exist_ok=True)
    X, resp = make_case_data(c)
    N = X.shape[0]
    xfile = os.path.join(casedir, "x.h5")
    with h5py.File(xfile, "w") as f:
        f["X"] = X
        f["resp"] = resp
    ch = Checks()
    est = GaussianMixture(n_components=c["K"], covariance_type=c["cov"], reg_covar=c["reg"])
    est._initialize(X, resp)
    ll = [est.score(X) * N]
    for _ in range(c["n"]):
        _, log_resp = est._e_step(X)
        est._m_step(X, log_resp)
        ll.append(est.score(X) * N)
    ll = np.array(ll)
    est._set_parameters(est._get_parameters())  # sets precisions_ as fit() would
    model = os.path.join(casedir, "model.h5")
    if os.path.exists(model):
        os.remove(model)
    cmd = mpirun_prefix(args) + [args.caviar, "gmm", "fit", "--algorithm", "em",
            "--data", xfile + ":/X", "--components", str(c["K"]), "--covariance", c["cov"],
            "--init", xfile + ":/resp", "--max-iter", str(c["n"]), "--tol", "0",
            "--reg-covar", repr(c["reg"]), "--out", model]
    pr = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    if pr.returncode != 0:
        ch.add("caviar_run", False, "exit %d: %s" % (pr.returncode, pr.stderr[-2000:]))
        return ch, {}
    summary = {}
    with h5py.File(model, "r") as f:
        summary["weights"] = ch.arrays("weights", f["weights"][...], est.weights_)
        summary["means"] = ch.arrays("means", f["means"][...], est.means_)
        summary["covariances"] = ch.arrays("covariances", f["covariances"][...], est.covariances_)
        ch.arrays("precisions_cholesky", f["precisions_cholesky"][...], est.precisions_cholesky_)
        ch.arrays("precisions", f["precisions"][...], est.precisions_)
        trace = f["trace/log_likelihood"][...]
        lb = float(_attr(f.attrs, "lower_bound"))
        ch.add("algorithm attr", _attr(f.attrs, "algorithm") == "em", str(_attr(f.attrs, "algorithm")))
    ok = trace.shape == ll.shape
    rel = float(np.max(np.abs(trace - ll) / np.abs(ll))) if ok else math.inf
    ch.add("log-likelihood trace vs sklearn", ok and rel <= ELBO_RTOL,
           "T=%d expected %d, max rel=%.2e" % (trace.size, ll.size, rel))
    summary["elbo"] = ch.scalar("lower_bound (mean loglik) vs sklearn score", lb, ll[-1] / N, ELBO_RTOL)
    d = np.diff(trace)
    ch.add("log-likelihood non-decreasing", d.min() >= -MONO_RTOL * np.abs(trace).max(),
           "min step=%.3e" % d.min())
    return ch, summary


def main(argv=None):
    ap = argparse.ArgumentParser(description="Cross-check caviar gmm fit against sklearn.")
    ap.add_argument("caviar", metavar="CAVIAR_BIN")
    ap.add_argument("workdir", metavar="WORKDIR")
    ap.add_argument("--ranks", type=int, default=1)
    ap.add_argument("--threads", type=int, default=None, help="set OMP_NUM_THREADS for caviar")
    ap.add_argument("--mpirun", default="mpirun")
    ap.add_argument("--timeout", type=int, default=600)
    ap.add_argument("--only", default=None, help="run only cases whose name contains this")
    ap.add_argument("-v", "--verbose", action="store_true", help="print every check")
    args = ap.parse_args(argv)
    if not (os.path.isfile(args.caviar) and os.access(args.caviar, os.X_OK)):
        print("check_sklearn.py: error: %s is not an executable file" % args.caviar, file=sys.stderr)
        return 2
    args.caviar = os.path.abspath(args.caviar)
    os.makedirs(args.workdir, exist_ok=True)
    args.workdir = os.path.abspath(args.workdir)

    # `gmm score` is not part of the fit contract: checked only if present
    args.has_score = subprocess.run([args.caviar, "gmm", "score", "--help"], capture_output=True,
                                    timeout=60).returncode == 0
    nfail = 0
    ncase = 0
    print("check_sklearn: caviar=%s ranks=%d threads=%s rtol=%g elbo_rtol=%g gmm-score=%s"
          % (args.caviar, args.ranks, args.threads, RTOL, ELBO_RTOL,
             "checked" if args.has_score else "absent, skipped"))
    for c in CASES + EM_CASES:
        if args.only and args.only not in c["name"]:
            continue
        ncase += 1
        ch, s = check_em_case(args, c) if c["name"].startswith("em_") else check_case(args, c)
        status = "PASS" if ch.ok else "FAIL"
        nfail += 0 if ch.ok else 1
        fmt = lambda k: ("%.1e" % s[k]) if k in s else "n/a"
        print("%-30s n=%-2d weights %s means %s covs %s elbo %s  %s" % (
            c["name"], c["n"], fmt("weights"), fmt("means"), fmt("covariances"), fmt("elbo"), status))
        for name, ok, msg in ch.rows:
            if args.verbose or not ok:
                print("    %-34s %-4s %s" % (name, "ok" if ok else "FAIL", msg))
        sys.stdout.flush()
    print("check_sklearn: %d/%d cases passed" % (ncase - nfail, ncase))
    return 1 if nfail else 0


if __name__ == "__main__":
    sys.exit(main())
