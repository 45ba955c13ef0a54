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
  path       fit("file.h5:/X") gives bitwise the fitted attributes of fit(X), and
             init_resp="file.h5:/resp" those of init_resp=array.
  ranks      n_ranks=2 and n_threads=2 give bitwise the attributes of n_ranks=1, n_threads=1
             (caviar_summary_ must report the ranks and threads asked for).
  errors     caviar's errors raise caviar.CaviarError (a ValueError) whose message is caviar's
             one line `caviar: error: ...`.
  n_init     n_init=4 runs caviar's --n-init: caviar reports four starts' bounds, the first
             is the bound of the n_init=1 fit of the same random_state, and the fit kept is the
             best of the four.
  notimpl    options caviar lacks raise NotImplementedError before any run.

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

def assert_close(name, a, b):
    """check_sklearn.py's criterion: allclose(rtol=1e-8, atol=1e-12 * max|b|). Returns the max
    relative error."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    check(a.shape == b.shape, "%s: shape %s != scikit-learn's %s" % (name, a.shape, b.shape))
    check(np.all(np.isfinite(a)), "%s: non-finite values from caviar" % name)
    atol = ATOL_REL * float(np.max(np.abs(b)))
    rel = float(np.max(np.abs(a - b) / np.maximum(np.abs(b), 1e-300 + atol)))
    check(np.allclose(a, b, rtol=RTOL, atol=atol),
          "%s: caviar and scikit-learn differ, max rel %.3e > rtol %g" % (name, rel, RTOL))
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
                        (caviar.GaussianMixture, dict(covariance_type="full"))):
        name = "%s(%s)" % (cls.__name__, ", ".join("%s=%r" % kv for kv in params.items()))
        kw = dict(n_components=4, random_state=7, max_iter=40, **params)
        a = quiet_fit(cls(**kw), X)
        b = quiet_fit(cls(**kw), h5 + ":/X")
        c = quiet_fit(cls(**kw), h5 + ":/g/data")
        assert_bitwise(name + ": fit(array) vs fit('x.h5:/X')", a, b)
        assert_bitwise(name + ": fit(array) vs fit('x.h5:/g/data')", a, c)
        check(a.n_iter_ >= 2, "%s: only %d iterations" % (name, a.n_iter_))
        out.append("%s n_iter %d" % (cls.__name__, a.n_iter_))
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
                        (caviar.GaussianMixture, dict(covariance_type="diag"))):
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
        out.append("%s: %s" % (cls.__name__, " ".join("%dx%d" % k for k in fits)))
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
    return "5 CaviarError cases (1 at 2 ranks)"


# ------------------------------------------------------------------ part notimpl

def part_notimpl(workdir):
    import caviar
    BGM, GM = caviar.BayesianGaussianMixture, caviar.GaussianMixture
    X, _ = make_data(501, 60, 2, 2)
    # A binary that does not exist: the refusal must come before any run.
    nobin = os.path.join(workdir, "no-such-caviar")
    cases = [
        ("BGM covariance_type='tied'", BGM(covariance_type="tied")),
        ("BGM covariance_type='spherical'", BGM(covariance_type="spherical")),
        ("GM covariance_type='tied'", GM(covariance_type="tied")),
        ("GM covariance_type='spherical'", GM(covariance_type="spherical")),
        ("BGM reg_covar=1e-6", BGM(reg_covar=1e-6)),
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
    return "%d options" % len(cases)


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
    from the same parameters; max_iter=0 keeps them; a partial start (means_init only) keeps
    the given means; warm_start: three fits of max_iter=1 equal one fit of max_iter=3."""
    import caviar
    from sklearn.mixture import GaussianMixture as SkGM
    X, _ = make_data(504, 400, 2, 3)
    K = 3
    rng = np.random.default_rng(4)
    w0 = np.array([0.2, 0.3, 0.5])
    m0 = X[rng.choice(len(X), K, replace=False)]
    p0 = np.stack([np.eye(2) * s for s in (1.0, 0.5, 2.0)]) + 0.05
    given = dict(weights_init=w0, means_init=m0, precisions_init=p0, tol=0, reg_covar=1e-6)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ours = caviar.GaussianMixture(K, max_iter=5, **given).fit(X)
        sk = SkGM(K, max_iter=5, **given).fit(X)
        zero = caviar.GaussianMixture(K, max_iter=0, **given).fit(X)
        part = caviar.GaussianMixture(K, max_iter=0, means_init=m0, random_state=1).fit(X)
    err_sk = max(np.abs(ours.weights_ - sk.weights_).max(),
                 np.abs(ours.means_ - sk.means_).max(),
                 np.abs(ours.covariances_ - sk.covariances_).max())
    check(err_sk < 1e-9,
          "5 EM iterations from given parameters: %.1e from scikit-learn's" % err_sk)
    check(ours.n_iter_ == sk.n_iter_ == 5, "n_iter_ %d, scikit-learn's %d" % (ours.n_iter_,
                                                                           sk.n_iter_))
    check(np.array_equal(zero.means_, m0) and np.array_equal(zero.weights_, w0)
          and np.allclose(zero.precisions_, p0, rtol=1e-12, atol=0),
          "max_iter=0 keeps the given parameters")
    check(np.array_equal(part.means_, m0) and abs(part.weights_.sum() - 1) < 1e-12,
          "means_init alone: means kept, weights from the init responsibilities")
    # warm start: each fit continues from the last; three single iterations = one of three.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        once = caviar.GaussianMixture(K, max_iter=3, tol=0, init_params="random",
                                      random_state=2).fit(X)
        warm = caviar.GaussianMixture(K, max_iter=1, tol=0, init_params="random",
                                      random_state=2, warm_start=True)
        scores = [warm.fit(X).score(X) for _ in range(3)]
    err = max(np.abs(once.means_ - warm.means_).max(),
              np.abs(once.covariances_ - warm.covariances_).max())
    check(err < 1e-12, "warm start: 3 fits of 1 iteration vs 1 of 3: %.1e" % err)
    check(scores[0] <= scores[1] <= scores[2], "warm start: the score never falls %r" % scores)
    return "given start %.1e from scikit-learn, warm start %.1e" % (err_sk, err)


def part_warm_start(workdir):
    """BayesianGaussianMixture(warm_start=True) continues from its whole posterior (caviar's
    --warm-start): three fits of max_iter=1 end where one fit of max_iter=3 ends, to 1e-10
    relative (not bitwise: the model file holds m_k, the fit m_k - c exactly), for full and diag
    and both weight priors; lower_bound_ never falls; n_init is ignored once fitted, as in
    scikit-learn (the warm fits run no --n-init)."""
    import caviar
    X, _ = make_data(505, 400, 2, 3)
    worst = 0.0
    for cov in ("full", "diag"):
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
