#!/usr/bin/env -S /usr/bin/python3
"""The Python estimators (python/caviar) against scikit-learn, and their own guarantees.

usage: test_estimators.py CAVIAR_BIN WORKDIR [-v]

  sklearn    caviar.BayesianGaussianMixture and caviar.GaussianMixture against
             sklearn.mixture's, on the same data from the same initial responsibilities
             (caviar: init_resp=, i.e. `--init FILE.h5:/resp`; scikit-learn: a subclass whose
             _initialize_parameters calls self._initialize(X, resp)), tol=0 and a fixed
             max_iter on both sides, so both run one M-step from resp and then max_iter
             (E-step, M-step) iterations. Compared as check_sklearn.py does:
             np.allclose(caviar, sklearn, rtol=1e-8, atol=1e-12 * max|sklearn|).
             Variational: reg_covar=0 on both sides, weight_concentration_prior_type
             "dirichlet_distribution" (plus one "dirichlet_process" case), default and
             explicit priors. diag: scikit-learn's diag E-step uses the full Wishart's
             E[ln|Lambda|] (sum of D digammas), caviar's exact product of 1-D Wisharts D
             digammas of nu_k/2; the two agree only while all nu_k are equal (check_sklearn.py
             explains), so the diag cases are max_iter=1 from responsibilities with equal column
             sums, and max_iter=0 (the initial M-step only) from arbitrary ones.
             EM: full, tied, diag and spherical (the same algorithm as scikit-learn's).
  conjugate  variational tied and spherical, which are caviar's exact conjugate models and not
             scikit-learn's (its updates for these types are ad hoc), against the NumPy
             coordinate ascent of those models written below from their formulas
             (conjugate_m_step, conjugate_log_rho), from the same responsibilities: every
             fitted attribute, predict_proba and score_samples at rtol 1e-8 after max_iter
             iterations, scikit-learn's attribute shapes, and an ELBO trace that never falls.
  path       fit("file.h5:/X") gives bitwise the fitted attributes of fit(X), and
             init_resp="file.h5:/resp" those of init_resp=array.
  ranks      n_ranks=2 and n_threads=2 give bitwise the attributes of n_ranks=1, n_threads=1
             (caviar_summary_ must report the ranks and threads asked for).
  errors     caviar's errors raise caviar.CaviarError (a ValueError) whose message is caviar's
             one line `caviar: error: ...`.
  n_init     n_init=4 runs caviar's --n-init: caviar reports four starts' bounds, the first
             is the bound of the n_init=1 fit of the same random_state, and the fit kept is the
             best of the four.
  given_start, warm_start  GaussianMixture from weights_init/means_init/precisions_init
             against scikit-learn (every covariance type), and warm starts of both estimators.
  notimpl    options caviar lacks raise NotImplementedError before any run; the four
             covariance types of both estimators are not among them (each fits).

Exit status 1 if any check fails; every failure is printed.
"""

import argparse
import os
import re
import struct
import sys
import tempfile
import time
import traceback
import warnings

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))

RTOL = 1e-8        # as check_sklearn.py
ATOL_REL = 1e-12   # atol = ATOL_REL * max|sklearn|

VERBOSE = False


class CheckFailed(AssertionError):
    pass


def check(cond, msg):
    """An assertion that python -O does not remove."""
    if not cond:
        raise CheckFailed(msg)


def log(msg):
    if VERBOSE:
        print("    " + msg)


# ------------------------------------------------------------------ data

def make_data(seed, N, D, K, balanced=False):
    """Clustered rows and random initial responsibilities (fixed seed). balanced: every row is
    a cyclic shift of one probability vector, each shift used N/K times, so the column sums
    (hence every nu_k after the initial M-step) are exactly equal."""
    rng = np.random.default_rng(seed)
    ktrue = max(2, K - 1)
    centers = rng.normal(0.0, 2.5, size=(ktrue, D))
    scales = rng.uniform(0.4, 1.3, size=(ktrue, D))
    z = rng.integers(0, ktrue, size=N)
    X = centers[z] + rng.normal(size=(N, D)) * scales[z]
    if balanced:
        check(N % K == 0, "balanced needs K | N")
        p = rng.dirichlet(np.ones(K))
        shifts = rng.permutation(np.arange(N) % K)
        resp = np.stack([np.roll(p, s) for s in shifts])
    else:
        resp = rng.dirichlet(np.ones(K), size=N)
    return np.ascontiguousarray(X), np.ascontiguousarray(resp)


def write_h5(path, **datasets):
    import h5py
    with h5py.File(path, "w") as f:
        for name, a in datasets.items():
            f.create_dataset(name, data=np.ascontiguousarray(a, dtype=np.float64))


# ------------------------------------------------------------------ comparisons

def assert_close(name, a, b, ref="scikit-learn"):
    """check_sklearn.py's criterion: allclose(rtol=1e-8, atol=1e-12 * max|b|), b being ref's.
    Returns the max relative error."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    check(a.shape == b.shape, "%s: shape %s != %s's %s" % (name, a.shape, ref, b.shape))
    check(np.all(np.isfinite(a)), "%s: non-finite values from caviar" % name)
    atol = ATOL_REL * float(np.max(np.abs(b)))
    rel = float(np.max(np.abs(a - b) / np.maximum(np.abs(b), 1e-300 + atol)))
    check(np.allclose(a, b, rtol=RTOL, atol=atol),
          "%s: caviar and %s differ, max rel %.3e > rtol %g" % (name, ref, rel, RTOL))
    return rel


def fitted_attributes(est):
    """The public fitted attributes (name_ ), without caviar_summary_ (it holds timings)."""
    return {k: v for k, v in vars(est).items()
            if k.endswith("_") and not k.startswith("_") and k != "caviar_summary_"}


def _bits(v):
    """A bytes image of a fitted attribute, exact to the bit."""
    if isinstance(v, np.ndarray):
        return (b"nd", str(v.dtype).encode(), repr(v.shape).encode(),
                np.ascontiguousarray(v).tobytes())
    if isinstance(v, tuple):
        return (b"tuple",) + tuple(_bits(x) for x in v)
    if isinstance(v, (bool, np.bool_)):
        return (b"bool", bool(v))
    if isinstance(v, (int, np.integer)):
        return (b"int", int(v))
    if isinstance(v, (float, np.floating)):
        return (b"float", struct.pack("<d", float(v)))
    return (b"other", repr(v).encode())


def assert_bitwise(what, a, b):
    fa, fb = fitted_attributes(a), fitted_attributes(b)
    check(sorted(fa) == sorted(fb), "%s: attribute sets differ: %s vs %s"
          % (what, sorted(fa), sorted(fb)))
    check(len(fa) >= 8, "%s: only %d fitted attributes: %s" % (what, len(fa), sorted(fa)))
    for k in sorted(fa):
        if _bits(fa[k]) != _bits(fb[k]):
            x, y = np.asarray(fa[k], dtype=object), np.asarray(fb[k], dtype=object)
            raise CheckFailed("%s: %s differs bitwise (%r vs %r)" % (what, k, x.ravel()[:3],
                                                                      y.ravel()[:3]))
    log("%s: %d attributes bitwise equal (%s)" % (what, len(fa), ", ".join(sorted(fa))))


# ------------------------------------------------------------------ scikit-learn from resp

def sklearn_from_resp(cls, resp, **params):
    """An instance of a subclass of scikit-learn's `cls` that starts from the given
    responsibilities (the initial M-step of fit is _initialize(X, resp))."""

    class FromResp(cls):
        def _initialize_parameters(self, X, random_state):
            self._initialize(X, self.resp_init_)

    FromResp.__name__ = cls.__name__ + "FromResp"
    est = FromResp(**params)
    est.resp_init_ = resp
    return est


def quiet_fit(est, X):
    with warnings.catch_warnings():
        # tol=0 never converges: both libraries warn.
        warnings.simplefilter("ignore")
        return est.fit(X)


# ------------------------------------------------------------------ part sklearn

BGM_CASES = [
    # name, N, D, K, cov, max_iter, extra parameters (the same on both sides)
    dict(name="bgm_full_default_priors", N=600, D=3, K=4, cov="full", n=10, seed=101),
    dict(name="bgm_full_given_priors", N=500, D=3, K=3, cov="full", n=10, seed=102,
         params=dict(weight_concentration_prior=0.7, mean_precision_prior=0.25,
                     degrees_of_freedom_prior=5.5, mean_prior=[0.5, -1.0, 2.0],
                     covariance_prior=np.eye(3))),
    dict(name="bgm_full_dirichlet_process", N=600, D=2, K=5, cov="full", n=10, seed=103,
         weights="dirichlet_process"),
    dict(name="bgm_diag_balanced_1iter", N=600, D=4, K=3, cov="diag", n=1, seed=104,
         balanced=True),
    dict(name="bgm_diag_given_priors_1iter", N=450, D=3, K=3, cov="diag", n=1, seed=105,
         balanced=True,
         params=dict(weight_concentration_prior=2.0, mean_precision_prior=0.5,
                     degrees_of_freedom_prior=4.0, covariance_prior=np.ones(3))),
    dict(name="bgm_diag_init_only", N=500, D=3, K=4, cov="diag", n=0, seed=106),
]

GM_CASES = [
    dict(name="gm_full", N=600, D=3, K=4, cov="full", n=15, seed=111, reg=1e-6),
    dict(name="gm_full_noreg", N=500, D=2, K=3, cov="full", n=10, seed=112, reg=0.0),
    dict(name="gm_diag", N=700, D=5, K=3, cov="diag", n=15, seed=113, reg=1e-4),
    dict(name="gm_tied", N=600, D=3, K=4, cov="tied", n=15, seed=114, reg=1e-6),
    dict(name="gm_tied_noreg", N=500, D=2, K=3, cov="tied", n=10, seed=115, reg=0.0),
    dict(name="gm_spherical", N=700, D=4, K=3, cov="spherical", n=15, seed=116, reg=1e-4),
    dict(name="gm_spherical_noreg", N=500, D=2, K=4, cov="spherical", n=10, seed=117,
         reg=0.0),
]


def check_bgm_case(c):
    import caviar
    from sklearn.mixture import BayesianGaussianMixture as SkBGM
    X, resp = make_data(c["seed"], c["N"], c["D"], c["K"], balanced=c.get("balanced", False))
    common = dict(n_components=c["K"], covariance_type=c["cov"], tol=0.0, max_iter=c["n"],
                  reg_covar=0.0, weight_concentration_prior_type=c.get(
                      "weights", "dirichlet_distribution"), **c.get("params", {}))
    sk = quiet_fit(sklearn_from_resp(SkBGM, resp, **common), X)
    cv = quiet_fit(caviar.BayesianGaussianMixture(init_resp=resp, **common), X)
    check(sk.n_iter_ == c["n"] and cv.n_iter_ == c["n"],
          "n_iter_: scikit-learn %d, caviar %d, expected %d" % (sk.n_iter_, cv.n_iter_, c["n"]))
    rels = {}
    for k in ("weights_", "means_", "covariances_", "precisions_cholesky_", "precisions_",
              "mean_precision_", "degrees_of_freedom_", "mean_prior_", "covariance_prior_"):
        rels[k] = assert_close(k, getattr(cv, k), getattr(sk, k))
    if c.get("weights") == "dirichlet_process":
        for i, part in enumerate(("sticks a", "sticks b")):
            rels[part] = assert_close("weight_concentration_ " + part,
                                      cv.weight_concentration_[i], sk.weight_concentration_[i])
    else:
        rels["weight_concentration_"] = assert_close(
            "weight_concentration_", cv.weight_concentration_, sk.weight_concentration_)
    for k in ("weight_concentration_prior_", "mean_precision_prior_",
              "degrees_of_freedom_prior_"):
        rels[k] = assert_close(k, getattr(cv, k), getattr(sk, k))
    # The run moved away from the start: the final means are not those of the initial M-step.
    if c["n"] > 0:
        start = sklearn_from_resp(SkBGM, resp, **dict(common, max_iter=0))
        quiet_fit(start, X)
        moved = float(np.max(np.abs(start.means_ - sk.means_)))
        check(moved > 1e-6, "the %d iterations did not change the means (%.1e)"
              % (c["n"], moved))
    return "n_iter %d, max rel %.1e (%s)" % (cv.n_iter_, max(rels.values()),
                                              max(rels, key=rels.get))


def check_gm_case(c):
    import caviar
    from sklearn.mixture import GaussianMixture as SkGM
    X, resp = make_data(c["seed"], c["N"], c["D"], c["K"])
    common = dict(n_components=c["K"], covariance_type=c["cov"], tol=0.0, max_iter=c["n"],
                  reg_covar=c["reg"])
    sk = quiet_fit(sklearn_from_resp(SkGM, resp, **common), X)
    cv = quiet_fit(caviar.GaussianMixture(init_resp=resp, **common), X)
    check(sk.n_iter_ == c["n"] and cv.n_iter_ == c["n"],
          "n_iter_: scikit-learn %d, caviar %d, expected %d" % (sk.n_iter_, cv.n_iter_, c["n"]))
    rels = {}
    for k in ("weights_", "means_", "covariances_", "precisions_cholesky_", "precisions_"):
        rels[k] = assert_close(k, getattr(cv, k), getattr(sk, k))
    # The same model scores the rows the same way (both compute it in NumPy, from their own
    # parameters).
    rels["score_samples"] = assert_close("score_samples(X)", cv.score_samples(X),
                                         sk.score_samples(X))
    return "n_iter %d, max rel %.1e (%s)" % (cv.n_iter_, max(rels.values()),
                                              max(rels, key=rels.get))


# ------------------------------------------------------------------ part conjugate

def conjugate_m_step(X, resp, prior, cov, weights):
    """The variational posterior of caviar's tied or spherical model from responsibilities
    (coordinate ascent on q(pi) q(mu, Lambda)):
      tied: q(Lambda) = W(W, nu), q(mu_k | Lambda) = N(m_k, (beta_k Lambda)^-1),
        nu = nu0 + N, W^-1 = W0^-1 + sum_k [sum_n r_nk (x_n - xbar_k)(x_n - xbar_k)^T
                                           + beta0 N_k / beta_k (xbar_k - m0)(xbar_k - m0)^T];
      spherical: lambda_k ~ Gamma(nu_k / 2, rate w_k^-1 / 2), nu_k = nu0 + D N_k,
        w_k^-1 = W0^-1 + sum_d [sum_n r_nk (x_nd - xbar_kd)^2 + beta0 N_k / beta_k
                               (xbar_kd - m0_d)^2];
      both: beta_k = beta0 + N_k, m_k = (beta0 m0 + N_k xbar_k) / beta_k; Dirichlet
      alpha_k = alpha0 + N_k, or sticks (1 + N_k, alpha0 + sum_{j>k} N_j)."""
    N, D = X.shape
    Nk = resp.sum(axis=0)
    xbar = (resp.T @ X) / Nk[:, None]
    beta = prior["beta0"] + Nk
    m = (prior["beta0"] * prior["m0"] + Nk[:, None] * xbar) / beta[:, None]
    dm = xbar - prior["m0"]
    shrink = prior["beta0"] * Nk / beta
    if cov == "tied":
        W_inv = np.array(prior["W0_inv"], dtype=np.float64)
        for k in range(len(Nk)):
            d = X - xbar[k]
            W_inv += (resp[:, k, None] * d).T @ d + shrink[k] * np.outer(dm[k], dm[k])
        nu = np.full(len(Nk), prior["nu0"] + N)
    else:
        W_inv = np.array([prior["W0_inv"] + resp[:, k] @ np.sum((X - xbar[k]) ** 2, axis=1)
                          + shrink[k] * dm[k] @ dm[k] for k in range(len(Nk))])
        nu = prior["nu0"] + D * Nk
    if weights == "dirichlet_distribution":
        conc = prior["alpha0"] + Nk
    else:
        tail = np.concatenate([np.cumsum(Nk[::-1])[::-1][1:], [0.0]])
        conc = (1.0 + Nk, prior["alpha0"] + tail)
    return dict(beta=beta, m=m, W_inv=W_inv, nu=nu, conc=conc)


def conjugate_log_rho(X, post, cov, weights):
    """ln rho_nk = E[ln pi_k] + 1/2 E[ln|Lambda_k|] - D/2 ln(2 pi) - D / (2 beta_k)
    - nu_k / 2 (x - m_k)^T W_k (x - m_k), with W_k = W (tied) or w_k I (spherical), written with
    explicit inverses and determinants (the estimator uses Cholesky factors)."""
    from scipy.special import digamma
    N, D = X.shape
    beta, m, nu = post["beta"], post["m"], post["nu"]
    K = len(beta)
    if weights == "dirichlet_distribution":
        e_log_pi = digamma(post["conc"]) - digamma(np.sum(post["conc"]))
    else:
        a, b = post["conc"]
        e_log_v, e_log_1mv = digamma(a) - digamma(a + b), digamma(b) - digamma(a + b)
        e_log_pi = e_log_v + np.concatenate([[0.0], np.cumsum(e_log_1mv)[:-1]])
    out = np.empty((N, K))
    for k in range(K):
        diff = X - m[k]
        if cov == "tied":
            W = np.linalg.inv(post["W_inv"])
            e_logdet = (sum(digamma((nu[k] + 1 - i) / 2.0) for i in range(1, D + 1))
                        + D * np.log(2.0) + np.linalg.slogdet(W)[1])
            maha = np.einsum("ni,ij,nj->n", diff, W, diff)
        else:
            w = 1.0 / post["W_inv"][k]
            e_logdet = D * (digamma(nu[k] / 2.0) + np.log(2.0) + np.log(w))
            maha = w * np.sum(diff * diff, axis=1)
        out[:, k] = (e_log_pi[k] + 0.5 * e_logdet - 0.5 * D * np.log(2 * np.pi)
                     - 0.5 * D / beta[k] - 0.5 * nu[k] * maha)
    return out


def conjugate_fit(X, resp, prior, cov, weights, n_iter):
    """The initial M-step from resp, then n_iter (E-step, M-step) iterations."""
    from scipy.special import logsumexp
    post = conjugate_m_step(X, resp, prior, cov, weights)
    for _ in range(n_iter):
        lr = conjugate_log_rho(X, post, cov, weights)
        post = conjugate_m_step(X, np.exp(lr - logsumexp(lr, axis=1)[:, None]), prior, cov,
                                weights)
    return post


CONJUGATE_CASES = [
    dict(name="tied_default_priors", N=600, D=3, K=4, cov="tied", n=10, seed=121),
    dict(name="tied_identity_process", N=500, D=2, K=5, cov="tied", n=10, seed=122,
         weights="dirichlet_process",
         params=dict(covariance_prior=np.eye(2), mean_prior=[1.0, -2.0],
                     weight_concentration_prior=0.5, mean_precision_prior=0.3,
                     degrees_of_freedom_prior=3.5)),
    dict(name="spherical_default_priors", N=600, D=4, K=3, cov="spherical", n=10, seed=123),
    dict(name="spherical_identity_process", N=500, D=3, K=4, cov="spherical", n=10, seed=124,
         weights="dirichlet_process",
         params=dict(covariance_prior=1.0, mean_prior=[0.0, 0.0, 0.0],
                     mean_precision_prior=2.0, degrees_of_freedom_prior=0.5)),
    dict(name="spherical_init_only", N=300, D=2, K=3, cov="spherical", n=0, seed=125),
]


REF = "the conjugate reference"


def check_conjugate_case(c):
    import caviar
    from scipy.special import logsumexp
    X, resp = make_data(c["seed"], c["N"], c["D"], c["K"])
    D, K, cov = c["D"], c["K"], c["cov"]
    weights = c.get("weights", "dirichlet_distribution")
    params = c.get("params", {})
    est = quiet_fit(caviar.BayesianGaussianMixture(
        n_components=K, covariance_type=cov, tol=0.0, max_iter=c["n"], init_resp=resp,
        weight_concentration_prior_type=weights, **params), X)
    check(est.n_iter_ == c["n"], "n_iter_ %d, expected %d" % (est.n_iter_, c["n"]))
    # scikit-learn's defaults of the priors, or the given ones.
    cp = params.get("covariance_prior")
    if cp is None:
        cp = np.cov(X.T) if cov == "tied" else np.var(X, axis=0, ddof=1).mean()
    prior = dict(alpha0=params.get("weight_concentration_prior", 1.0 / K),
                 beta0=params.get("mean_precision_prior", 1.0),
                 nu0=params.get("degrees_of_freedom_prior", float(D)),
                 m0=np.asarray(params.get("mean_prior", X.mean(axis=0)), dtype=np.float64),
                 W0_inv=cp)
    post = conjugate_fit(X, resp, prior, cov, weights, c["n"])
    # scikit-learn's shapes: tied (D, D) and one degrees_of_freedom_; spherical (K,) and one
    # covariance_prior_.
    shapes = {"covariances_": (D, D) if cov == "tied" else (K,),
              "precisions_": (D, D) if cov == "tied" else (K,),
              "precisions_cholesky_": (D, D) if cov == "tied" else (K,),
              "degrees_of_freedom_": () if cov == "tied" else (K,),
              "covariance_prior_": (D, D) if cov == "tied" else (),
              "means_": (K, D), "weights_": (K,), "mean_precision_": (K,)}
    for k, shape in shapes.items():
        check(np.shape(getattr(est, k)) == shape, "%s has shape %s, scikit-learn's is %s"
              % (k, np.shape(getattr(est, k)), shape))
    check(isinstance(est.covariance_prior_, float) == (cov == "spherical"),
          "covariance_prior_ is a %s" % type(est.covariance_prior_).__name__)
    check(isinstance(est.degrees_of_freedom_, float) == (cov == "tied"),
          "degrees_of_freedom_ is a %s" % type(est.degrees_of_freedom_).__name__)
    nu = post["nu"][0] if cov == "tied" else post["nu"]
    covariances = post["W_inv"] / nu
    precisions = np.linalg.inv(covariances) if cov == "tied" else 1.0 / covariances
    if weights == "dirichlet_distribution":
        w = post["conc"] / post["conc"].sum()
    else:
        a, b = post["conc"]
        w = a / (a + b) * np.concatenate([[1.0], np.cumprod(b / (a + b))[:-1]])
        w = w / w.sum()
    rels = {}
    for k, ref in (("means_", post["m"]), ("mean_precision_", post["beta"]),
                   ("degrees_of_freedom_", nu), ("covariances_", covariances),
                   ("precisions_", precisions), ("weights_", w),
                   ("covariance_prior_", prior["W0_inv"]), ("mean_prior_", prior["m0"]),
                   ("degrees_of_freedom_prior_", prior["nu0"]),
                   ("mean_precision_prior_", prior["beta0"]),
                   ("weight_concentration_prior_", prior["alpha0"])):
        rels[k] = assert_close(k, getattr(est, k), ref, REF)
    if weights == "dirichlet_distribution":
        rels["weight_concentration_"] = assert_close(
            "weight_concentration_", est.weight_concentration_, post["conc"], REF)
    else:
        for i, part in enumerate(("a", "b")):
            rels["sticks " + part] = assert_close("weight_concentration_ sticks " + part,
                                                  est.weight_concentration_[i], post["conc"][i],
                                                  REF)
    pc = est.precisions_cholesky_
    check(np.allclose(pc @ pc.T if cov == "tied" else pc ** 2, est.precisions_, rtol=1e-12,
                      atol=0), "precisions_ is not precisions_cholesky_ squared")
    lr = conjugate_log_rho(X, post, cov, weights)
    rels["predict_proba"] = assert_close("predict_proba(X)", est.predict_proba(X),
                                         np.exp(lr - logsumexp(lr, axis=1)[:, None]), REF)
    rels["score_samples"] = assert_close("score_samples(X)", est.score_samples(X),
                                         logsumexp(lr, axis=1), REF)
    trace = est.elbo_trace_
    falls = np.diff(trace) < -1e-10 * np.abs(trace[1:])  # allows for rounding only
    check(not np.any(falls), "the ELBO falls at iterations %s: %s"
          % (np.flatnonzero(falls) + 1, trace))
    if c["n"] > 0:
        start = conjugate_m_step(X, resp, prior, cov, weights)
        moved = float(np.max(np.abs(start["m"] - post["m"])))
        check(moved > 1e-6, "the %d iterations did not change the means (%.1e)"
              % (c["n"], moved))
    return "n_iter %d, max rel %.1e (%s)" % (est.n_iter_, max(rels.values()),
                                              max(rels, key=rels.get))


# ------------------------------------------------------------------ part path

def part_path(workdir):
    import caviar
    X, resp = make_data(201, 800, 3, 4)
    h5 = os.path.join(workdir, "path_x.h5")
    write_h5(h5, X=X, resp=resp)
    # A dataset below a group, to exercise "file:/group/name".
    import h5py
    with h5py.File(h5, "a") as f:
        f.create_group("g").create_dataset("data", data=X)
    out = []
    for cls, params in ((caviar.BayesianGaussianMixture, dict(covariance_type="full")),
                        (caviar.BayesianGaussianMixture,
                         dict(covariance_type="diag",
                              weight_concentration_prior_type="dirichlet_process")),
                        (caviar.BayesianGaussianMixture, dict(covariance_type="tied")),
                        (caviar.GaussianMixture, dict(covariance_type="full")),
                        (caviar.GaussianMixture, dict(covariance_type="spherical"))):
        name = "%s(%s)" % (cls.__name__, ", ".join("%s=%r" % kv for kv in params.items()))
        kw = dict(n_components=4, random_state=7, max_iter=40, **params)
        a = quiet_fit(cls(**kw), X)
        b = quiet_fit(cls(**kw), h5 + ":/X")
        c = quiet_fit(cls(**kw), h5 + ":/g/data")
        assert_bitwise(name + ": fit(array) vs fit('x.h5:/X')", a, b)
        assert_bitwise(name + ": fit(array) vs fit('x.h5:/g/data')", a, c)
        check(a.n_iter_ >= 2, "%s: only %d iterations" % (name, a.n_iter_))
        out.append("%s(%s) n_iter %d" % (cls.__name__, params["covariance_type"], a.n_iter_))
    # Given responsibilities: as an array, or as the name of a dataset.
    kw = dict(n_components=4, max_iter=10, tol=0.0, covariance_type="full")
    a = quiet_fit(caviar.BayesianGaussianMixture(init_resp=resp, **kw), X)
    b = quiet_fit(caviar.BayesianGaussianMixture(init_resp=h5 + ":/resp", **kw), h5 + ":/X")
    assert_bitwise("fit(X, init_resp=array) vs fit('x.h5:/X', init_resp='x.h5:/resp')", a, b)
    return "; ".join(out) + "; init_resp array == path"


# ------------------------------------------------------------------ part ranks

def part_ranks(workdir):
    import caviar
    X, _ = make_data(301, 2000, 4, 5)
    out = []
    for cls, params in ((caviar.BayesianGaussianMixture, dict(covariance_type="full")),
                        (caviar.BayesianGaussianMixture,
                         dict(covariance_type="diag", algorithm="svi", batch_size=256)),
                        (caviar.BayesianGaussianMixture, dict(covariance_type="spherical")),
                        (caviar.BayesianGaussianMixture,
                         dict(covariance_type="tied", algorithm="svi", batch_size=256)),
                        (caviar.GaussianMixture, dict(covariance_type="diag")),
                        (caviar.GaussianMixture, dict(covariance_type="tied"))):
        name = "%s(%s)" % (cls.__name__, ", ".join("%s=%r" % kv for kv in params.items()))
        fits = {}
        for ranks, threads in ((1, 1), (2, 1), (1, 2), (2, 2)):
            if cls is caviar.GaussianMixture and (ranks, threads) in ((2, 1), (1, 2)):
                continue  # (2, 2) covers both for EM
            est = quiet_fit(cls(n_components=5, random_state=3, max_iter=30, n_ranks=ranks,
                                n_threads=threads, **params), X)
            s = est.caviar_summary_
            check(s.get("ranks") == ranks and s.get("threads") == threads,
                  "%s: asked for %d ranks x %d threads, caviar reports %r x %r"
                  % (name, ranks, threads, s.get("ranks"), s.get("threads")))
            fits[ranks, threads] = est
        for key, est in fits.items():
            if key != (1, 1):
                assert_bitwise("%s: n_ranks=%d n_threads=%d vs 1 x 1" % ((name,) + key),
                               fits[1, 1], est)
        out.append("%s(%s): %s" % (cls.__name__, params["covariance_type"],
                                   " ".join("%dx%d" % k for k in fits)))
    return "; ".join(out)


# ------------------------------------------------------------------ part errors

ERROR_LINE = re.compile(r"^caviar: error: \S[^\n]*$")


def expect_caviar_error(what, fn, *must_contain):
    import caviar
    try:
        fn()
    except caviar.CaviarError as e:
        msg = str(e)
        check(ERROR_LINE.match(msg), "%s: message is not one `caviar: error: ...` line: %r"
              % (what, msg))
        check(isinstance(e, ValueError), "%s: CaviarError is not a ValueError" % what)
        check(e.returncode not in (0, None), "%s: returncode %r" % (what, e.returncode))
        lines = [l for l in (e.stderr or "").splitlines() if l.startswith("caviar: error:")]
        check(msg in lines, "%s: %r is not a line of caviar's stderr %r"
              % (what, msg, e.stderr))
        for s in must_contain:
            check(s in msg, "%s: %r not in the message %r" % (what, s, msg))
        log("%s -> %s" % (what, msg))
        return msg
    except Exception as e:  # noqa: BLE001
        raise CheckFailed("%s: raised %s: %s, expected CaviarError" % (what, type(e).__name__, e))
    raise CheckFailed("%s: no error raised" % what)


def part_errors(workdir):
    import caviar
    small = os.path.join(workdir, "err_small.h5")
    write_h5(small, X=np.random.default_rng(0).normal(size=(5, 2)))
    missing = os.path.join(workdir, "does_not_exist.h5")
    BGM, GM = caviar.BayesianGaussianMixture, caviar.GaussianMixture
    expect_caviar_error("K > rows (file)", lambda: BGM(n_components=6).fit(small + ":/X"),
                        "exceeds the number of rows (5)")
    expect_caviar_error("K > rows (file, 2 ranks)",
                        lambda: GM(n_components=6, n_ranks=2).fit(small + ":/X"),
                        "exceeds the number of rows (5)")
    expect_caviar_error("missing file", lambda: BGM(n_components=2).fit(missing + ":/X"),
                        "does_not_exist.h5")
    expect_caviar_error("missing dataset", lambda: GM(n_components=2).fit(small + ":/nope"),
                        "/nope")
    X, _ = make_data(401, 100, 3, 2)
    expect_caviar_error("nu0 <= D - 1 (array)",
                        lambda: BGM(n_components=2, degrees_of_freedom_prior=1.0).fit(X),
                        "--nu0")
    expect_caviar_error("nu0 <= D - 1 (tied)",
                        lambda: BGM(n_components=2, covariance_type="tied",
                                    degrees_of_freedom_prior=2.0).fit(X),
                        "--nu0")
    # spherical's precisions are 1-D Wisharts: any nu0 > 0 is valid.
    sph = quiet_fit(BGM(n_components=2, covariance_type="spherical",
                        degrees_of_freedom_prior=0.5, max_iter=3), X)
    check(sph.degrees_of_freedom_prior_ == 0.5, "spherical nu0 0.5: %r"
          % sph.degrees_of_freedom_prior_)
    return "6 CaviarError cases (1 at 2 ranks)"


# ------------------------------------------------------------------ part notimpl

def part_notimpl(workdir):
    import caviar
    BGM, GM = caviar.BayesianGaussianMixture, caviar.GaussianMixture
    X, _ = make_data(501, 60, 2, 2)
    # A binary that does not exist: the refusal must come before any run.
    nobin = os.path.join(workdir, "no-such-caviar")
    cases = [
        ("BGM reg_covar=1e-6", BGM(reg_covar=1e-6)),
        ("BGM tied covariance_prior=2 I", BGM(covariance_type="tied",
                                              covariance_prior=2 * np.eye(2))),
        ("BGM spherical covariance_prior=0.5", BGM(covariance_type="spherical",
                                                   covariance_prior=0.5)),
        ("BGM spherical covariance_prior=np.ones(2)", BGM(covariance_type="spherical",
                                                          covariance_prior=np.ones(2))),
    ]
    for what, est in cases:
        est.set_params(caviar_bin=nobin)
        try:
            est.fit(X)
        except NotImplementedError as e:
            check("caviar does not implement" in str(e), "%s: message %r" % (what, str(e)))
            log("%s -> %s" % (what, e))
            continue
        except Exception as e:  # noqa: BLE001
            raise CheckFailed("%s: raised %s: %s, expected NotImplementedError"
                              % (what, type(e).__name__, e))
        raise CheckFailed("%s: no error raised" % what)
    # Every covariance type is implemented: none of them is refused.
    for cls in (BGM, GM):
        for cov in ("full", "tied", "diag", "spherical"):
            est = quiet_fit(cls(n_components=2, covariance_type=cov, max_iter=5), X)
            check(est.n_iter_ >= 1, "%s(covariance_type=%r) did not fit" % (cls.__name__, cov))
    return "%d options refused; the 4 covariance types of both estimators fit" % len(cases)


# ------------------------------------------------------------------ part n_init

def part_n_init(workdir):
    import caviar
    X, _ = make_data(502, 400, 2, 4)
    out = []
    for Est in (caviar.GaussianMixture, caviar.BayesianGaussianMixture):
        one = Est(n_components=4, init_params="random", random_state=3, tol=0, max_iter=20)
        four = Est(n_components=4, init_params="random", random_state=3, tol=0, max_iter=20,
                   n_init=4)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            one.fit(X)
            four.fit(X)
        key = "elbo" if "elbo" in one.caviar_summary_ else "log_likelihood"
        bounds = four.caviar_summary_.get("n_init_bounds", [])
        check(len(bounds) == 4, "%s: n_init=4 reports the bounds %r" % (Est.__name__, bounds))
        check(bounds[0] == one.caviar_summary_[key],
              "%s: start 0's bound %r, the n_init=1 fit's %r"
              % (Est.__name__, bounds[0], one.caviar_summary_[key]))
        check(four.caviar_summary_[key] == max(bounds),
              "%s: kept %r, best of %r" % (Est.__name__, four.caviar_summary_[key], bounds))
        out.append("%s %s" % (Est.__name__, ", ".join("%.3f" % b for b in bounds)))
    return "; ".join(out)


def part_from_data(workdir):
    """init_params='random_from_data': with max_iter=0 the means are K distinct rows of X and
    the weights 1/K (EM); the seed picks the rows."""
    import caviar
    X, _ = make_data(503, 300, 3, 4)
    means = []
    for seed in (1, 2):
        gm = caviar.GaussianMixture(n_components=4, init_params="random_from_data",
                                    random_state=seed, max_iter=0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            gm.fit(X)
        gap = np.abs(gm.means_[:, None, :] - X[None, :, :]).max(axis=2)
        rows = gap.argmin(axis=1)
        check(gap.min(axis=1).max() < 1e-12 * np.abs(X).max() and len(set(rows)) == 4,
              "seed %d: means are rows %s of X (gap %.1e)" % (seed, rows, gap.min(axis=1).max()))
        check(np.allclose(gm.weights_, 0.25, rtol=0, atol=1e-12), "weights %r" % gm.weights_)
        means.append(sorted(rows))
    check(means[0] != means[1], "seeds 1 and 2 both start from rows %s" % means[0])
    bgm = caviar.BayesianGaussianMixture(n_components=4, init_params="random_from_data",
                                         random_state=1, max_iter=50)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bgm.fit(X)
    check(np.isfinite(bgm.lower_bound_), "BGM from data: bound %r" % bgm.lower_bound_)
    return "rows %s and %s" % (means[0], means[1])


def part_given_start(workdir):
    """GaussianMixture from weights_init, means_init and precisions_init against scikit-learn
    from the same parameters, for each covariance type (precisions_init in scikit-learn's
    shape); max_iter=0 keeps them; a partial start (means_init only) keeps the given means;
    warm_start: three fits of max_iter=1 equal one fit of max_iter=3, for each type."""
    import caviar
    from sklearn.mixture import GaussianMixture as SkGM
    X, _ = make_data(504, 400, 2, 3)
    K = 3
    rng = np.random.default_rng(4)
    w0 = np.array([0.2, 0.3, 0.5])
    m0 = X[rng.choice(len(X), K, replace=False)]
    precisions = {"full": np.stack([np.eye(2) * s for s in (1.0, 0.5, 2.0)]) + 0.05,
                  "tied": np.array([[0.8, 0.1], [0.1, 1.3]]),
                  "diag": np.array([[1.0, 0.4], [0.5, 0.7], [2.0, 1.5]]),
                  "spherical": np.array([1.0, 0.5, 2.0])}
    worst_sk = 0.0
    for cov, p0 in precisions.items():
        given = dict(weights_init=w0, means_init=m0, precisions_init=p0, tol=0, reg_covar=1e-6,
                     covariance_type=cov)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ours = caviar.GaussianMixture(K, max_iter=5, **given).fit(X)
            sk = SkGM(K, max_iter=5, **given).fit(X)
            zero = caviar.GaussianMixture(K, max_iter=0, **given).fit(X)
        err_sk = max(np.abs(ours.weights_ - sk.weights_).max(),
                     np.abs(ours.means_ - sk.means_).max(),
                     np.abs(ours.covariances_ - sk.covariances_).max())
        worst_sk = max(worst_sk, err_sk)
        check(err_sk < 1e-9, "%s: 5 EM iterations from given parameters: %.1e from "
              "scikit-learn's" % (cov, err_sk))
        check(ours.n_iter_ == sk.n_iter_ == 5, "%s: n_iter_ %d, scikit-learn's %d"
              % (cov, ours.n_iter_, sk.n_iter_))
        check(ours.covariances_.shape == sk.covariances_.shape == p0.shape,
              "%s: covariances_ shape %s, scikit-learn's %s" % (cov, ours.covariances_.shape,
                                                                sk.covariances_.shape))
        check(np.array_equal(zero.means_, m0) and np.array_equal(zero.weights_, w0)
              and np.allclose(zero.precisions_, p0, rtol=1e-12, atol=0),
              "%s: max_iter=0 keeps the given parameters" % cov)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        part = caviar.GaussianMixture(K, max_iter=0, means_init=m0, random_state=1).fit(X)
    check(np.array_equal(part.means_, m0) and abs(part.weights_.sum() - 1) < 1e-12,
          "means_init alone: means kept, weights from the init responsibilities")
    # warm start: each fit continues from the last; three single iterations = one of three.
    worst = 0.0
    for cov in precisions:
        kw = dict(tol=0, init_params="random", random_state=2, covariance_type=cov)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            once = caviar.GaussianMixture(K, max_iter=3, **kw).fit(X)
            warm = caviar.GaussianMixture(K, max_iter=1, warm_start=True, **kw)
            scores = [warm.fit(X).score(X) for _ in range(3)]
        err = max(np.abs(once.means_ - warm.means_).max(),
                  np.abs(once.covariances_ - warm.covariances_).max())
        worst = max(worst, err)
        check(err < 1e-12, "%s warm start: 3 fits of 1 iteration vs 1 of 3: %.1e" % (cov, err))
        check(scores[0] <= scores[1] <= scores[2], "%s warm start: the score never falls %r"
              % (cov, scores))
    return "given start %.1e from scikit-learn, warm start %.1e (4 covariance types)" % (
        worst_sk, worst)


def part_warm_start(workdir):
    """BayesianGaussianMixture(warm_start=True) continues from its whole posterior (caviar's
    --warm-start): three fits of max_iter=1 end where one fit of max_iter=3 ends, to 1e-10
    relative (not bitwise: the model file holds m_k, the fit m_k - c exactly), for the four
    covariance types and both weight priors; lower_bound_ never falls; n_init is ignored once
    fitted, as in scikit-learn (the warm fits run no --n-init)."""
    import caviar
    X, _ = make_data(505, 400, 2, 3)
    worst = 0.0
    for cov in ("full", "tied", "diag", "spherical"):
        for prior in ("dirichlet_distribution", "dirichlet_process"):
            kw = dict(covariance_type=cov, weight_concentration_prior_type=prior, tol=0,
                      init_params="random", random_state=3)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                once = caviar.BayesianGaussianMixture(n_components=3, max_iter=3, **kw).fit(X)
                warm = caviar.BayesianGaussianMixture(n_components=3, max_iter=1, warm_start=True,
                                                      **kw)
                bounds = [warm.fit(X).lower_bound_]
                warm.set_params(n_init=2)  # ignored from now on
                bounds += [warm.fit(X).lower_bound_ for _ in range(2)]
            err = max(float(np.abs(a - b).max() / np.abs(b).max()) for a, b in
                      [(warm.means_, once.means_), (warm.covariances_, once.covariances_),
                       (warm.weights_, once.weights_),
                       (warm.mean_precision_, once.mean_precision_),
                       (warm.degrees_of_freedom_, once.degrees_of_freedom_)])
            worst = max(worst, err)
            check(err < 1e-10, "%s %s: 3 warm fits of 1 iteration vs 1 of 3: %.1e"
                  % (cov, prior, err))
            check(bounds[0] <= bounds[1] <= bounds[2], "lower_bound_ never falls %r" % bounds)
            check(warm.n_iter_ == 1 and "n_init_bounds" not in warm.caviar_summary_,
                  "warm fit: n_iter_ %d, n_init ignored" % warm.n_iter_)
    return "BGM warm start within %.1e of one fit" % worst


# ------------------------------------------------------------------ main

def main(argv=None):
    global VERBOSE
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("caviar", metavar="CAVIAR_BIN")
    ap.add_argument("workdir", metavar="WORKDIR")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    VERBOSE = args.verbose
    if not (os.path.isfile(args.caviar) and os.access(args.caviar, os.X_OK)):
        print("test_estimators.py: error: %s is not an executable file" % args.caviar,
              file=sys.stderr)
        return 2
    os.makedirs(args.workdir, exist_ok=True)
    workdir = os.path.abspath(args.workdir)
    os.environ["CAVIAR_BIN"] = os.path.abspath(args.caviar)
    os.environ["TMPDIR"] = workdir      # the estimators' temporary run directories
    tempfile.tempdir = workdir
    sys.path.insert(0, os.path.join(REPO, "python"))
    import caviar
    print("test_estimators: caviar=%s package=%s rtol=%g"
          % (caviar.find_binary(), os.path.dirname(caviar.__file__), RTOL))

    tests = ([("sklearn " + c["name"], lambda c=c: check_bgm_case(c)) for c in BGM_CASES]
             + [("sklearn " + c["name"], lambda c=c: check_gm_case(c)) for c in GM_CASES]
             + [("conjugate " + c["name"], lambda c=c: check_conjugate_case(c))
                for c in CONJUGATE_CASES]
             + [("path", lambda: part_path(workdir)),
                ("ranks", lambda: part_ranks(workdir)),
                ("errors", lambda: part_errors(workdir)),
                ("n_init", lambda: part_n_init(workdir)),
                ("from_data", lambda: part_from_data(workdir)),
                ("given_start", lambda: part_given_start(workdir)),
                ("warm_start", lambda: part_warm_start(workdir)),
                ("notimpl", lambda: part_notimpl(workdir))])
    failed = []
    t_all = time.time()
    for name, fn in tests:
        t0 = time.time()
        try:
            info = fn()
            status = "PASS"
        except CheckFailed as e:
            info, status = str(e), "FAIL"
        except Exception:  # noqa: BLE001
            info, status = traceback.format_exc().rstrip(), "FAIL"
        if status == "FAIL":
            failed.append(name)
        print("%-36s %-4s %5.1fs  %s" % (name, status, time.time() - t0, info))
        sys.stdout.flush()
    print("test_estimators: %d/%d passed in %.1fs%s"
          % (len(tests) - len(failed), len(tests), time.time() - t_all,
             ("; FAILED: " + ", ".join(failed)) if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
