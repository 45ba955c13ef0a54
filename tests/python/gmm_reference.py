#!/usr/bin/env -S /usr/bin/python3
"""Independent NumPy/SciPy reference for caviar's Bayesian Gaussian mixture.

The model is the variational Bayesian GMM of Bishop, PRML section 10.2:

    pi            ~ Dirichlet(alpha0, ..., alpha0)
    Lambda_k      ~ Wishart(W0, nu0)
    mu_k | L_k    ~ Normal(m0, (beta0 Lambda_k)^-1)
    z_n | pi      ~ Categorical(pi)
    x_n | z_n=k   ~ Normal(mu_k, Lambda_k^-1)

with the mean-field posterior q(Z) q(pi) prod_k q(mu_k, Lambda_k), where
q(pi) = Dir(alpha), q(mu_k, Lambda_k) = N(m_k, (beta_k Lambda_k)^-1) W(W_k, nu_k).

covariance_type "diag": every dimension d of component k has its own
independent one-dimensional Wishart (= Gamma(nu/2, rate 1/(2w))) precision
lambda_kd with scale W_kd and nu_k degrees of freedom, and mu_kd | lambda_kd ~
N(m_kd, (beta_k lambda_kd)^-1).  This is the exact product-of-1-D model and
NOT sklearn's "diag" variant (sklearn uses the full-matrix E[ln|Lambda|]
digamma sum, sum_i psi((nu+1-i)/2), in the E-step).

Everything here is written from the formulas in PRML (10.46), (10.58)-(10.63),
(10.64)-(10.66), (10.71)-(10.77) and the predictive density (10.81) / the
Student-t (B.68); all constants are kept, all arithmetic is float64.

Importable API (X is an (N, D) float64 array, `model` a dict from load_model or
make_model):

    load_model(path)                      -> model dict
    load_data("file.h5:/path")            -> X
    elbo(X, model)                        -> float (full bound, optimal q(Z))
    elbo_terms(X, model)                  -> dict of the five terms
    elbo_at_resp(X, resp, model)          -> L(q(Z)=resp, q(theta))
    responsibilities(X, model)            -> (N, K)
    log_rho(X, model)                     -> (N, K)  (10.46), unnormalised
    log_predictive(X, model)              -> (N,)   ln p(x_n | data)
    avg_log_predictive(X, model)          -> float
    m_step(X, resp, prior, cov_type)      -> posterior dict (10.58)-(10.63)
    model_from_sklearn(est)               -> model dict (contract conversion)
    write_model(path, model, **attrs)     -> writes a contract model.h5

Command line:

    gmm_reference.py elbo --data F.h5:/X --model model.h5
        prints {"elbo": ..., "avg_log_predictive": ..., terms...} as JSON
    gmm_reference.py selftest
        Monte-Carlo / scipy.stats cross-checks of every formula in here.
"""

import argparse
import json
import math
import sys

import numpy as np
from scipy.special import digamma, gammaln, logsumexp, multigammaln

LN2 = math.log(2.0)
LN2PI = math.log(2.0 * math.pi)
LNPI = math.log(math.pi)

__all__ = [
    "load_model", "load_data", "split_spec", "make_model", "elbo", "elbo_terms",
    "elbo_at_resp", "responsibilities", "log_rho", "log_predictive",
    "avg_log_predictive", "m_step", "model_from_sklearn", "write_model",
    "expected_log_pi", "expected_log_det", "ln_wishart_B", "wishart_entropy",
]


# --------------------------------------------------------------------------- I/O

def split_spec(spec, default_path=None):
    """Split 'file.h5:/path/in/file' -> (file, path). The split is at the last
    ':' that is followed by '/', so file names may contain ':'."""
    idx = spec.rfind(":/")
    if idx < 0:
        if default_path is None:
            raise ValueError("expected FILE.h5:/dataset, got %r" % spec)
        return spec, default_path
    return spec[:idx], spec[idx + 1:]


def load_data(spec, default_path=None):
    import h5py
    fname, dpath = split_spec(spec, default_path)
    with h5py.File(fname, "r") as f:
        X = np.asarray(f[dpath][...], dtype=np.float64)
    if X.ndim != 2:
        raise ValueError("%s: dataset %s is %d-D, expected 2-D (N, D)" % (fname, dpath, X.ndim))
    return X


def _attr_str(v):
    if isinstance(v, bytes):
        return v.decode()
    if isinstance(v, np.ndarray) and v.shape == ():
        return _attr_str(v[()])
    return str(v)


def make_model(alpha, beta, m, W, nu, alpha0, beta0, m0, W0, nu0, cov_type, sticks=None):
    """Build a model dict from arrays (all converted to float64).
    Stick-breaking (Dirichlet-process) weights: alpha=None and sticks = (K,2)
    array of the Beta(a_k, b_k) parameters of q(v_k); alpha0 is then the
    concentration of the Beta(1, alpha0) prior on every stick."""
    f = lambda a: np.asarray(a, dtype=np.float64)
    if sticks is not None:
        sticks = f(sticks)
        alpha = sticks[:, 0]  # placeholder for the shape check below; not used as Dirichlet
    post = dict(alpha=f(alpha), beta=f(beta), m=f(m), W=f(W), nu=f(nu), sticks=sticks)
    prior = dict(alpha0=float(alpha0), beta0=float(beta0), m0=f(m0), W0=f(W0), nu0=float(nu0))
    K, D = post["m"].shape
    if cov_type not in ("full", "diag"):
        raise ValueError("covariance_type must be 'full' or 'diag', got %r" % cov_type)
    wshape = (K, D, D) if cov_type == "full" else (K, D)
    w0shape = (D, D) if cov_type == "full" else (D,)
    for name, a, shp in (("alpha", post["alpha"], (K,)), ("beta", post["beta"], (K,)),
                         ("nu", post["nu"], (K,)), ("W", post["W"], wshape),
                         ("m0", prior["m0"], (D,)), ("W0", prior["W0"], w0shape)):
        if a.shape != shp:
            raise ValueError("%s has shape %s, expected %s" % (name, a.shape, shp))
    return dict(posterior=post, prior=prior, cov_type=cov_type, K=K, D=D)


def load_model(path):
    """Read a caviar model.h5 (the file contract) into a model dict. The root
    attributes are returned under 'attrs', /trace/elbo under 'trace' (or None),
    and /weights, /means, /covariances under 'weights', 'means', 'covariances'."""
    import h5py
    with h5py.File(path, "r") as f:
        g, p = f["posterior"], f["prior"]
        W = np.asarray(g["W"][...], dtype=np.float64)
        attrs = {k: f.attrs[k] for k in f.attrs.keys()}
        if "covariance_type" in attrs:
            cov_type = _attr_str(attrs["covariance_type"])
        else:
            cov_type = "full" if W.ndim == 3 else "diag"
        sticks = None
        if "stick_a" in g:
            sticks = np.stack([g["stick_a"][...], g["stick_b"][...]], axis=1)
        model = make_model(None if sticks is not None else g["alpha"][...], g["beta"][...],
                           g["m"][...], W, g["nu"][...],
                           p["alpha0"][()], p["beta0"][()], p["m0"][...], p["W0"][...],
                           p["nu0"][()], cov_type, sticks=sticks)
        model["attrs"] = attrs
        model["trace"] = np.asarray(f["trace/elbo"][...], dtype=np.float64) if "trace/elbo" in f else None
        for name in ("weights", "means", "covariances"):
            model[name] = np.asarray(f[name][...], dtype=np.float64) if name in f else None
    return model


def write_model(path, model, trace=None, **attrs):
    """Write a model dict in caviar's file contract (used to fake model files
    in tests, e.g. from sklearn's fitted parameters)."""
    import h5py
    post, prior, ct = model["posterior"], model["prior"], model["cov_type"]
    with h5py.File(path, "w") as f:
        f["weights"] = post["alpha"] / post["alpha"].sum()
        f["means"] = post["m"]
        f["covariances"] = expected_covariances(model)
        for k in ("alpha", "beta", "m", "W", "nu"):
            f["posterior/" + k] = post[k]
        for k in ("alpha0", "beta0", "m0", "W0", "nu0"):
            f["prior/" + k] = prior[k]
        f["trace/elbo"] = np.asarray([] if trace is None else trace, dtype=np.float64)
        f.attrs["covariance_type"] = ct
        for k, v in attrs.items():
            f.attrs[k] = v


def expected_covariances(model):
    """W_k^-1 / nu_k (full: (K,D,D); diag: (K,D)) = sklearn covariances_."""
    post = model["posterior"]
    if model["cov_type"] == "full":
        return np.linalg.inv(post["W"]) / post["nu"][:, None, None]
    return 1.0 / (post["W"] * post["nu"][:, None])


# ------------------------------------------------------------ expectations

def expected_log_pi(alpha):
    """E[ln pi_k] = psi(alpha_k) - psi(sum alpha)   (10.66)."""
    alpha = np.asarray(alpha, dtype=np.float64)
    return digamma(alpha) - digamma(alpha.sum())


def expected_log_pi_sticks(sticks):
    """Stick-breaking: E[ln pi_k] = E[ln v_k] + sum_{j<k} E[ln(1 - v_j)],
    E[ln v] = psi(a) - psi(a+b), E[ln(1-v)] = psi(b) - psi(a+b) (Blei & Jordan 2006)."""
    a, b = sticks[:, 0], sticks[:, 1]
    elv = digamma(a) - digamma(a + b)
    el1v = digamma(b) - digamma(a + b)
    return elv + np.concatenate([[0.0], np.cumsum(el1v)[:-1]])


def model_expected_log_pi(post):
    if post.get("sticks") is not None:
        return expected_log_pi_sticks(post["sticks"])
    return expected_log_pi(post["alpha"])


def expected_weights(post):
    """E[pi_k]: alpha_k / sum alpha, or for sticks E[v_k] prod_{j<k} E[1-v_j]
    renormalised over the K components (sklearn's weights_ convention)."""
    if post.get("sticks") is None:
        return post["alpha"] / post["alpha"].sum()
    a, b = post["sticks"][:, 0], post["sticks"][:, 1]
    ev = a / (a + b)
    w = ev * np.concatenate([[1.0], np.cumprod(1.0 - ev)[:-1]])
    return w / w.sum()


def _logdet_spd(W):
    sign, ld = np.linalg.slogdet(W)
    if np.any(sign <= 0):
        raise ValueError("matrix is not positive definite")
    return ld


def expected_log_det(W, nu, cov_type):
    """E[ln |Lambda_k|]   (10.65).
    full: returns (K,) = sum_{i=1}^D psi((nu_k+1-i)/2) + D ln 2 + ln|W_k|
    diag: returns (K,D) with E[ln lambda_kd] = psi(nu_k/2) + ln 2 + ln W_kd
          (so the full-covariance analogue is the row sum)."""
    nu = np.asarray(nu, dtype=np.float64)
    if cov_type == "full":
        D = W.shape[-1]
        i = np.arange(1, D + 1)
        return digamma((nu[:, None] + 1.0 - i[None, :]) / 2.0).sum(axis=1) + D * LN2 + _logdet_spd(W)
    return digamma(nu / 2.0)[:, None] + LN2 + np.log(W)


def ln_wishart_B(W, nu):
    """ln B(W, nu) of (B.79) for a single D x D scale matrix W (D=1 works with
    W of shape (1,1)); every constant included."""
    W = np.atleast_2d(np.asarray(W, dtype=np.float64))
    D = W.shape[0]
    if not nu > D - 1:
        raise ValueError("Wishart needs nu > D-1 (nu=%g, D=%d)" % (nu, D))
    return -0.5 * nu * _logdet_spd(W) - 0.5 * nu * D * LN2 - multigammaln(0.5 * nu, D)


def ln_wishart_B_1d(w, nu):
    """ln B(w, nu) for the 1-D Wishart (elementwise; w, nu broadcast)."""
    w = np.asarray(w, dtype=np.float64)
    nu = np.asarray(nu, dtype=np.float64)
    return -0.5 * nu * np.log(w) - 0.5 * nu * LN2 - gammaln(0.5 * nu)


def wishart_entropy(W, nu):
    """H[Lambda] for Lambda ~ W(W, nu), D x D   (B.82)."""
    W = np.atleast_2d(np.asarray(W, dtype=np.float64))
    D = W.shape[0]
    i = np.arange(1, D + 1)
    elogdet = digamma((nu + 1.0 - i) / 2.0).sum() + D * LN2 + _logdet_spd(W)
    return -ln_wishart_B(W, nu) - 0.5 * (nu - D - 1.0) * elogdet + 0.5 * nu * D


def wishart_entropy_1d(w, nu):
    """Elementwise entropy of the 1-D Wishart W(w, nu) (= Gamma(nu/2, scale 2w))."""
    elog = digamma(0.5 * nu) + LN2 + np.log(w)
    return -ln_wishart_B_1d(w, nu) - 0.5 * (nu - 2.0) * elog + 0.5 * nu


def _quad_full(X, m, W):
    """(N,K) matrix of (x_n - m_k)^T W_k (x_n - m_k), via Cholesky of W_k."""
    N, K = X.shape[0], m.shape[0]
    out = np.empty((N, K))
    for k in range(K):
        L = np.linalg.cholesky(W[k])          # W = L L^T
        y = (X - m[k]) @ L                    # rows: (x-m)^T L
        out[:, k] = np.einsum("ij,ij->i", y, y)
    return out


def _quad_diag(X, m, W):
    out = np.empty((X.shape[0], m.shape[0]))
    for k in range(m.shape[0]):
        d = X - m[k]
        out[:, k] = (d * d) @ W[k]
    return out


# ------------------------------------------------------------------ E-step

def log_rho(X, model):
    """(N,K) ln rho_nk of (10.46), every constant included:
    E[ln pi_k] + 1/2 E[ln|Lambda_k|] - D/2 ln 2pi - 1/2 (D/beta_k + nu_k (x-m_k)^T W_k (x-m_k))."""
    X = np.asarray(X, dtype=np.float64)
    post, ct = model["posterior"], model["cov_type"]
    D = X.shape[1]
    if D != model["D"]:
        raise ValueError("data has D=%d but the model has D=%d" % (D, model["D"]))
    elogpi = model_expected_log_pi(post)
    eld = expected_log_det(post["W"], post["nu"], ct)
    if ct == "diag":
        eld = eld.sum(axis=1)
        quad = _quad_diag(X, post["m"], post["W"])
    else:
        quad = _quad_full(X, post["m"], post["W"])
    return (elogpi + 0.5 * eld - 0.5 * D * LN2PI - 0.5 * D / post["beta"])[None, :] \
        - 0.5 * post["nu"][None, :] * quad


def responsibilities(X, model, log=False):
    lr = log_rho(X, model)
    lr = lr - logsumexp(lr, axis=1, keepdims=True)
    return lr if log else np.exp(lr)


# ------------------------------------------------------------------ M-step

def m_step(X, resp, prior, cov_type, weights="dirichlet"):
    """Posterior from responsibilities, PRML (10.51)-(10.53), (10.58)-(10.63).
    An empty component (N_k = 0) gets exactly the prior."""
    X = np.asarray(X, dtype=np.float64)
    resp = np.asarray(resp, dtype=np.float64)
    N, D = X.shape
    K = resp.shape[1]
    a0, b0, m0, W0, n0 = prior["alpha0"], prior["beta0"], prior["m0"], prior["W0"], prior["nu0"]
    Nk = resp.sum(axis=0)
    Sx = resp.T @ X                                   # sum_n r_nk x_n
    alpha = a0 + Nk
    beta = b0 + Nk
    nu = n0 + Nk
    m = (b0 * m0[None, :] + Sx) / beta[:, None]
    if cov_type == "full":
        W0inv = np.linalg.inv(W0)
        W = np.empty((K, D, D))
    else:
        W0inv = 1.0 / W0
        W = np.empty((K, D))
    for k in range(K):
        Winv = W0inv.copy()
        if Nk[k] > 0:
            xbar = Sx[k] / Nk[k]
            d = X - xbar
            dm = xbar - m0
            if cov_type == "full":
                Winv += (resp[:, k, None] * d).T @ d + (b0 * Nk[k] / beta[k]) * np.outer(dm, dm)
            else:
                Winv += resp[:, k] @ (d * d) + (b0 * Nk[k] / beta[k]) * dm * dm
        if cov_type == "full":
            Winv = 0.5 * (Winv + Winv.T)
            W[k] = np.linalg.inv(Winv)
            W[k] = 0.5 * (W[k] + W[k].T)
        else:
            W[k] = 1.0 / Winv
    sticks = None
    if weights == "stick-breaking":
        tail = np.concatenate([np.cumsum(Nk[::-1])[::-1][1:], [0.0]])   # sum_{j>k} N_j
        sticks = np.stack([1.0 + Nk, a0 + tail], axis=1)
    return dict(alpha=alpha, beta=beta, m=m, W=W, nu=nu, sticks=sticks)


# -------------------------------------------------------------------- ELBO

def _theta_terms(model):
    """E[ln p(pi)] (10.73), E[ln p(mu,Lambda)] (10.74), E[ln q(pi)] (10.76),
    E[ln q(mu,Lambda)] (10.77) -- all constants included."""
    post, prior, ct = model["posterior"], model["prior"], model["cov_type"]
    K, D = model["K"], model["D"]
    alpha, beta, m, W, nu = post["alpha"], post["beta"], post["m"], post["W"], post["nu"]
    a0, b0, m0, W0, n0 = prior["alpha0"], prior["beta0"], prior["m0"], prior["W0"], prior["nu0"]

    if post.get("sticks") is None:
        elogpi = expected_log_pi(alpha)
        lnC0 = gammaln(K * a0) - K * gammaln(a0)
        lnC = gammaln(alpha.sum()) - gammaln(alpha).sum()
        e_ln_p_pi = lnC0 + (a0 - 1.0) * elogpi.sum()
        e_ln_q_pi = ((alpha - 1.0) * elogpi).sum() + lnC
    else:
        # sticks v_k ~ Beta(1, a0) a priori, q(v_k) = Beta(a_k, b_k)
        a, b = post["sticks"][:, 0], post["sticks"][:, 1]
        elv = digamma(a) - digamma(a + b)
        el1v = digamma(b) - digamma(a + b)
        lnB = gammaln(a) + gammaln(b) - gammaln(a + b)
        e_ln_p_pi = np.sum(-(gammaln(1.0) + gammaln(a0) - gammaln(1.0 + a0)) + (a0 - 1.0) * el1v)
        e_ln_q_pi = np.sum(-lnB + (a - 1.0) * elv + (b - 1.0) * el1v)

    dm = m - m0[None, :]
    if ct == "full":
        eld = expected_log_det(W, nu, ct)                           # (K,)
        W0inv = np.linalg.inv(W0)
        quad0 = np.einsum("ki,kij,kj->k", dm, W, dm)               # (m_k-m0)^T W_k (m_k-m0)
        tr = np.einsum("ij,kji->k", W0inv, W)                      # Tr(W0^-1 W_k)
        lnB0 = ln_wishart_B(W0, n0)
        e_ln_p_mulam = 0.5 * np.sum(D * math.log(b0 / (2 * math.pi)) + eld - D * b0 / beta
                                    - b0 * nu * quad0) \
            + K * lnB0 + 0.5 * (n0 - D - 1.0) * eld.sum() - 0.5 * np.sum(nu * tr)
        H = np.array([wishart_entropy(W[k], nu[k]) for k in range(K)])
        e_ln_q_mulam = np.sum(0.5 * eld + 0.5 * D * np.log(beta / (2 * math.pi)) - 0.5 * D - H)
    else:
        # independent 1-D Normal-Wishart per (k, d); D=1 instances of the above
        eld = expected_log_det(W, nu, ct)                           # (K,D)
        nuk = nu[:, None]
        lnB0 = ln_wishart_B_1d(W0, n0)                              # (D,)
        e_ln_p_mulam = np.sum(0.5 * (math.log(b0 / (2 * math.pi)) + eld - b0 / beta[:, None]
                                     - b0 * nuk * W * dm * dm)
                              + lnB0[None, :] + 0.5 * (n0 - 2.0) * eld - 0.5 * nuk * W / W0[None, :])
        H = wishart_entropy_1d(W, nuk)
        e_ln_q_mulam = np.sum(0.5 * eld + 0.5 * np.log(beta / (2 * math.pi))[:, None] - 0.5 - H)
    return dict(e_ln_p_pi=float(e_ln_p_pi), e_ln_p_mulam=float(e_ln_p_mulam),
                e_ln_q_pi=float(e_ln_q_pi), e_ln_q_mulam=float(e_ln_q_mulam))


def elbo_terms(X, model):
    """The five terms; 'data' = sum_n logsumexp_k ln rho_nk (optimal q(Z))."""
    t = _theta_terms(model)
    t["data"] = float(np.sum(logsumexp(log_rho(X, model), axis=1)))
    t["elbo"] = t["data"] + t["e_ln_p_pi"] + t["e_ln_p_mulam"] - t["e_ln_q_pi"] - t["e_ln_q_mulam"]
    return t


def elbo(X, model):
    """Full ELBO (all constants) of q(theta)=model's posterior at the optimal q(Z)."""
    return elbo_terms(X, model)["elbo"]


def elbo_at_resp(X, resp, model):
    """L(q(Z)=resp, q(theta)) for arbitrary responsibilities resp (0 ln 0 = 0).
    Equals elbo(X, model) when resp = responsibilities(X, model)."""
    resp = np.asarray(resp, dtype=np.float64)
    lr = log_rho(X, model)
    with np.errstate(divide="ignore", invalid="ignore"):
        rlogr = np.where(resp > 0, resp * np.log(np.where(resp > 0, resp, 1.0)), 0.0)
    t = _theta_terms(model)
    return float(np.sum(resp * lr) - np.sum(rlogr) + t["e_ln_p_pi"] + t["e_ln_p_mulam"]
                 - t["e_ln_q_pi"] - t["e_ln_q_mulam"])


# -------------------------------------------------------------- predictive

def log_predictive(X, model):
    """(N,) ln p(x_n | data): the Student-t mixture of PRML (10.81),
    weights alpha_k / sum(alpha).
    full: St(x | m_k, L_k, nu_k+1-D), L_k = (nu_k+1-D) beta_k / (1+beta_k) W_k
    diag: prod_d St(x_d | m_kd, nu_k beta_k/(1+beta_k) W_kd, nu_k)."""
    X = np.asarray(X, dtype=np.float64)
    post, ct = model["posterior"], model["cov_type"]
    N, D = X.shape
    K = model["K"]
    alpha, beta, m, W, nu = post["alpha"], post["beta"], post["m"], post["W"], post["nu"]
    logw = np.log(expected_weights(post))
    out = np.empty((N, K))
    for k in range(K):
        d = X - m[k]
        if ct == "full":
            dof = nu[k] + 1.0 - D
            L = (dof * beta[k] / (1.0 + beta[k])) * W[k]
            C = np.linalg.cholesky(L)
            y = d @ C
            delta2 = np.einsum("ij,ij->i", y, y)
            out[:, k] = (gammaln(0.5 * (dof + D)) - gammaln(0.5 * dof)
                         + np.sum(np.log(np.diag(C))) - 0.5 * D * math.log(dof * math.pi)
                         - 0.5 * (dof + D) * np.log1p(delta2 / dof))
        else:
            dof = nu[k]
            lam = (dof * beta[k] / (1.0 + beta[k])) * W[k]                  # (D,)
            lt = (gammaln(0.5 * (dof + 1.0)) - gammaln(0.5 * dof) + 0.5 * np.log(lam)[None, :]
                  - 0.5 * math.log(dof * math.pi)
                  - 0.5 * (dof + 1.0) * np.log1p(lam[None, :] * d * d / dof))
            out[:, k] = lt.sum(axis=1)
    return logsumexp(out + logw[None, :], axis=1)


def avg_log_predictive(X, model):
    return float(np.mean(log_predictive(X, model)))


# ------------------------------------------------------------------ sklearn

def model_from_sklearn(est, cov_type=None):
    """Convert a sklearn BayesianGaussianMixture (dirichlet_distribution, after
    _initialize/_m_step or fit) into the contract's posterior + prior.
    sklearn: covariances_ = W_k^-1 / nu_k, covariance_prior_ = W0^-1."""
    ct = cov_type or est.covariance_type
    nu = np.asarray(est.degrees_of_freedom_, dtype=np.float64)
    cov = np.asarray(est.covariances_, dtype=np.float64)
    if ct == "full":
        W = np.linalg.inv(cov * nu[:, None, None])
        W0 = np.linalg.inv(np.asarray(est.covariance_prior_, dtype=np.float64))
    elif ct == "diag":
        W = 1.0 / (cov * nu[:, None])
        W0 = 1.0 / np.asarray(est.covariance_prior_, dtype=np.float64)
    else:
        raise ValueError("only full and diag are supported")
    sticks = None
    alpha = est.weight_concentration_
    if getattr(est, "weight_concentration_prior_type", "") == "dirichlet_process":
        sticks = np.stack([np.asarray(c, dtype=np.float64) for c in est.weight_concentration_], axis=1)
        alpha = None
    return make_model(alpha, est.mean_precision_, est.means_, W, nu,
                      est.weight_concentration_prior_, est.mean_precision_prior_,
                      est.mean_prior_, W0, est.degrees_of_freedom_prior_, ct, sticks=sticks)


# ---------------------------------------------------------------- selftest

def _random_model(rng, K, D, cov_type, N=300):
    """A realistic posterior: one exact M-step from random responsibilities on
    random clustered data, with non-trivial priors."""
    centers = rng.normal(0, 3, size=(K, D))
    z = rng.integers(0, K, size=N)
    X = centers[z] + rng.normal(size=(N, D)) * rng.uniform(0.5, 1.5, size=D)
    resp = rng.dirichlet(np.ones(K), size=N)
    if cov_type == "full":
        A = rng.normal(size=(D, D))
        W0 = np.linalg.inv(A @ A.T / D + np.eye(D))
    else:
        W0 = rng.uniform(0.5, 2.0, size=D)
    prior = dict(alpha0=0.7, beta0=0.5, m0=rng.normal(size=D), W0=W0, nu0=D + 1.5)
    post = m_step(X, resp, prior, cov_type)
    return X, make_model(post["alpha"], post["beta"], post["m"], post["W"], post["nu"],
                         cov_type=cov_type, **prior)


def _selftest(nsamp=40000, seed=12345):
    """Cross-check every term against scipy.stats (exact entropies, densities)
    and Monte-Carlo expectations over q(theta). Prints z-scores; returns ok."""
    from scipy import stats
    rng = np.random.default_rng(seed)
    ok = True

    def check(name, exact, mc_samples=None, ref=None, rtol=1e-10):
        nonlocal ok
        if mc_samples is not None:
            mc = float(np.mean(mc_samples))
            se = float(np.std(mc_samples) / math.sqrt(len(mc_samples)))
            z = (exact - mc) / se if se > 0 else (0.0 if exact == mc else np.inf)
            good = abs(z) < 5.0
            print("  %-34s exact=% .8e  MC=% .8e  se=%.2e  z=% .2f  %s"
                  % (name, exact, mc, se, z, "ok" if good else "MISMATCH"))
        else:
            rel = abs(exact - ref) / max(abs(ref), 1e-300)
            good = rel <= rtol
            print("  %-34s ours=% .12e  scipy=% .12e  rel=%.1e  %s"
                  % (name, exact, ref, rel, "ok" if good else "MISMATCH"))
        ok = ok and good

    for ct, K, D in (("full", 3, 2), ("full", 4, 5), ("diag", 3, 4)):
        print("selftest %s K=%d D=%d" % (ct, K, D))
        X, model = _random_model(rng, K, D, ct)
        post, prior = model["posterior"], model["prior"]
        alpha, beta, m, W, nu = post["alpha"], post["beta"], post["m"], post["W"], post["nu"]
        a0, b0, m0, W0, n0 = prior["alpha0"], prior["beta0"], prior["m0"], prior["W0"], prior["nu0"]
        S = nsamp
        # --- sample q(theta)
        pis = rng.dirichlet(alpha, size=S)                                  # (S,K)
        lams = np.empty((S, K, D, D)) if ct == "full" else np.empty((S, K, D))
        mus = np.empty((S, K, D))
        for k in range(K):
            if ct == "full":
                lams[:, k] = stats.wishart(df=nu[k], scale=W[k]).rvs(size=S, random_state=rng)
                # mu = m + C^-T z with beta Lambda = C C^T  => cov(mu) = (beta Lambda)^-1
                C = np.linalg.cholesky(beta[k] * lams[:, k])
                z = rng.normal(size=(S, D, 1))
                mus[:, k] = m[k] + np.linalg.solve(np.swapaxes(C, 1, 2), z)[..., 0]
            else:
                lams[:, k] = rng.gamma(shape=nu[k] / 2.0, scale=2.0 * W[k], size=(S, D))
                mus[:, k] = m[k] + rng.normal(size=(S, D)) / np.sqrt(beta[k] * lams[:, k])
        # --- q(pi), p(pi) terms
        t = _theta_terms(model)
        check("H[q(pi)] vs scipy dirichlet", -t["e_ln_q_pi"], ref=float(stats.dirichlet(alpha).entropy()))
        lp_pi = stats.dirichlet(np.full(K, a0)).logpdf(pis.T)
        check("E[ln p(pi)] (10.73)", t["e_ln_p_pi"], mc_samples=lp_pi)
        # --- E ln|Lambda|, entropies, cross terms
        eld = expected_log_det(W, nu, ct)
        if ct == "full":
            for k in range(K):
                check("E ln|Lambda_%d| (10.65)" % k, float(eld[k]),
                      mc_samples=np.linalg.slogdet(lams[:, k])[1])
                check("Wishart entropy k=%d (B.82)" % k, wishart_entropy(W[k], nu[k]),
                      ref=float(stats.wishart(df=nu[k], scale=W[k]).entropy()))
            # ln W(I | W0, nu0) = ln B(W0, nu0) - Tr(W0^-1)/2
            check("ln B(W0,nu0) vs scipy", ln_wishart_B(W0, n0),
                  ref=float(stats.wishart(df=n0, scale=W0).logpdf(np.eye(D))
                            + 0.5 * np.trace(np.linalg.inv(W0))))
            lp = np.zeros(S)
            lq = np.zeros(S)
            for k in range(K):
                lp += stats.wishart(df=n0, scale=W0).logpdf(np.moveaxis(lams[:, k], 0, -1))
                lq += stats.wishart(df=nu[k], scale=W[k]).logpdf(np.moveaxis(lams[:, k], 0, -1))
            # Normal parts, vectorised log N(mu | m, (b Lambda)^-1)
            def lnorm(mu, mean, b, lam):
                d = mu - mean
                ld = np.linalg.slogdet(b * lam)[1]
                return 0.5 * ld - 0.5 * D * LN2PI - 0.5 * b * np.einsum("si,sij,sj->s", d, lam, d)
            for k in range(K):
                lp += lnorm(mus[:, k], m0, b0, lams[:, k])
                lq += lnorm(mus[:, k], m[k], beta[k], lams[:, k])
        else:
            for k in range(K):
                check("E ln lambda_%d0 (1-D)" % k, float(eld[k, 0]), mc_samples=np.log(lams[:, k, 0]))
            Hs = wishart_entropy_1d(W, nu[:, None])
            check("1-D Wishart entropy vs scipy gamma", float(Hs.sum()),
                  ref=float(sum(stats.gamma(a=nu[k] / 2, scale=2 * W[k, d]).entropy()
                                for k in range(K) for d in range(D))))
            lp = np.zeros(S)
            lq = np.zeros(S)
            for k in range(K):
                lp += stats.gamma(a=n0 / 2, scale=2 * W0).logpdf(lams[:, k]).sum(axis=1)
                lq += stats.gamma(a=nu[k] / 2, scale=2 * W[k]).logpdf(lams[:, k]).sum(axis=1)
                lp += stats.norm(m0, 1 / np.sqrt(b0 * lams[:, k])).logpdf(mus[:, k]).sum(axis=1)
                lq += stats.norm(m[k], 1 / np.sqrt(beta[k] * lams[:, k])).logpdf(mus[:, k]).sum(axis=1)
        check("E[ln p(mu,Lambda)] (10.74)", t["e_ln_p_mulam"], mc_samples=lp)
        check("E[ln q(mu,Lambda)] (10.77)", t["e_ln_q_mulam"], mc_samples=lq)
        # --- data term: E_q[ln pi_k + ln N(x | mu_k, Lambda_k^-1)] == ln rho_nk
        lr = log_rho(X[:3], model)
        for k in range(min(K, 2)):
            if ct == "full":
                d = X[0][None, :] - mus[:, k]
                v = (np.log(pis[:, k]) + 0.5 * np.linalg.slogdet(lams[:, k])[1] - 0.5 * D * LN2PI
                     - 0.5 * np.einsum("si,sij,sj->s", d, lams[:, k], d))
            else:
                v = np.log(pis[:, k]) + stats.norm(mus[:, k], 1 / np.sqrt(lams[:, k])).logpdf(X[0]).sum(axis=1)
            check("ln rho_0%d (10.46)" % k, float(lr[0, k]), mc_samples=v)
        # --- full ELBO vs MC of E_q[ln p(X,Z,theta) - ln q(Z,theta)], q(Z) optimal
        r = responsibilities(X, model)
        e_ref = elbo(X, model)
        e_r = elbo_at_resp(X, r, model)
        print("  elbo=% .12e  elbo_at_resp(optimal)=% .12e  diff=%.1e"
              % (e_ref, e_r, abs(e_ref - e_r)))
        ok = ok and abs(e_ref - e_r) <= 1e-9 * abs(e_ref)
        S2 = min(S, 4000)
        v = np.zeros(S2)
        for k in range(K):
            if ct == "full":
                ll = np.empty((S2, X.shape[0]))
                for s in range(S2):   # scipy's own Gaussian density, per sample
                    ll[s] = stats.multivariate_normal(mus[s, k], np.linalg.inv(lams[s, k])).logpdf(X)
            else:
                ll = np.stack([stats.norm(mus[s, k], 1 / np.sqrt(lams[s, k])).logpdf(X).sum(axis=1)
                               for s in range(S2)])
            v += (r[:, k][None, :] * (np.log(pis[:S2, k])[:, None] + ll)).sum(axis=1)
        with np.errstate(divide="ignore", invalid="ignore"):
            v -= np.sum(np.where(r > 0, r * np.log(r), 0.0))
        v += lp[:S2] - lq[:S2] + lp_pi[:S2] - stats.dirichlet(alpha).logpdf(pis[:S2].T)
        check("ELBO (MC, all terms)", e_ref, mc_samples=v)
        # --- predictive: exact t (scipy) and MC over q(theta)
        lpd = log_predictive(X[:4], model)
        if ct == "full":
            comp = []
            for k in range(K):
                dof = nu[k] + 1 - D
                L = dof * beta[k] / (1 + beta[k]) * W[k]
                comp.append(stats.multivariate_t(loc=m[k], shape=np.linalg.inv(L), df=dof).logpdf(X[:4]))
        else:
            comp = [stats.t(df=nu[k], loc=m[k], scale=1 / np.sqrt(nu[k] * beta[k] / (1 + beta[k]) * W[k]))
                    .logpdf(X[:4]).sum(axis=1) for k in range(K)]
        ref = logsumexp(np.stack(comp, 1) + np.log(alpha / alpha.sum()), axis=1)
        check("ln p(x_0|data) vs scipy t", float(lpd[0]), ref=float(ref[0]))
        check("ln p(x_3|data) vs scipy t", float(lpd[3]), ref=float(ref[3]))
        dens = np.zeros(S)
        for k in range(K):
            if ct == "full":
                d = X[0][None, :] - mus[:, k]
                lg = (0.5 * np.linalg.slogdet(lams[:, k])[1] - 0.5 * D * LN2PI
                      - 0.5 * np.einsum("si,sij,sj->s", d, lams[:, k], d))
            else:
                lg = stats.norm(mus[:, k], 1 / np.sqrt(lams[:, k])).logpdf(X[0]).sum(axis=1)
            dens += pis[:, k] * np.exp(lg)
        mc = np.mean(dens)
        se = np.std(dens) / math.sqrt(S)
        z = (math.exp(lpd[0]) - mc) / se
        print("  %-34s exact=% .8e  MC=% .8e  se=%.2e  z=% .2f  %s" % (
            "p(x_0|data) (MC over q)", math.exp(lpd[0]), mc, se, z, "ok" if abs(z) < 5 else "MISMATCH"))
        ok = ok and abs(z) < 5
    return ok


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("elbo", help="recompute ELBO and avg log predictive from a model file")
    e.add_argument("--data", required=True, help="FILE.h5:/dataset")
    e.add_argument("--model", required=True)
    st = sub.add_parser("selftest", help="Monte-Carlo / scipy.stats checks of the formulas")
    st.add_argument("--samples", type=int, default=40000)
    a = ap.parse_args(argv)
    if a.cmd == "elbo":
        X = load_data(a.data)
        model = load_model(a.model)
        t = elbo_terms(X, model)
        t["avg_log_predictive"] = avg_log_predictive(X, model)
        if "elbo" in model["attrs"]:
            t["file_elbo"] = float(model["attrs"]["elbo"])
        print(json.dumps(t))
        return 0
    ok = _selftest(a.samples)
    print("SELFTEST", "PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
