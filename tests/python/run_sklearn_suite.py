#!/usr/bin/env -S /usr/bin/python3
"""scikit-learn's own tests of its mixtures, run against caviar's estimators.

usage: run_sklearn_suite.py CAVIAR_BIN WORKDIR [--part NAME ...] [-v]

The test modules are those of the installed scikit-learn (Debian's python3-sklearn, in
/usr/lib/python3/dist-packages/sklearn/mixture/tests/; nothing is copied into this repository):
test_bayesian_mixture.py, test_gaussian_mixture.py and test_mixture.py. pytest runs them with
caviar_sklearn_plugin.py, which puts caviar.BayesianGaussianMixture and caviar.GaussianMixture
in place of scikit-learn's before the modules are imported. Parts:

  suite      every test, 1 rank, every covariance type the modules loop over (full, tied,
             diag, spherical). A test passes, or is in CANNOT_APPLY (name -> reason and the
             exception it must fail with). A listed test that passes, an unlisted test that
             fails, or a listed test that fails with another exception fails the run.
  ranks2     a few passing tests again with every caviar run at 2 MPI ranks.
  predict    the estimators' NumPy responsibilities against `caviar gmm predict
             --save-responsibilities` of the same model (1e-12), for every model variant.
  check_estimator  sklearn.utils.estimator_checks.check_estimator on the three estimators;
             every check passes or is in CHECK_ESTIMATOR_CANNOT_PASS.

Prints the pass / cannot-apply counts of each part; exit status 1 if any rule is broken.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
SK_TESTS = "/usr/lib/python3/dist-packages/sklearn/mixture/tests"
MODULES = ["test_bayesian_mixture.py", "test_gaussian_mixture.py", "test_mixture.py"]

# test -> (reason, the exception it must fail with)
CANNOT_APPLY = {
    # test_bayesian_mixture.py
    "test_bayesian_mixture.py::test_bayesian_mixture_precisions_prior_initialisation": (
        "checks scikit-learn's error text for degrees_of_freedom_prior = D - 1; caviar's is "
        "'caviar: error: --nu0 must be > 1 (got 1.000000)' (a CaviarError, a ValueError: the "
        "type matches, the regex does not). It then sets covariance_prior to the data "
        "covariance + 10 (full), + 5 (tied), the variances + 3 (diag) and a random number "
        "(spherical); caviar's --prior-scale takes only the data's or the identity",
        "AssertionError"),
    "test_bayesian_mixture.py::test_compare_covar_type": (
        "calls the private methods _check_parameters and _initialize_parameters",
        "AttributeError"),
    # test_gaussian_mixture.py
    "test_gaussian_mixture.py::test_regularisation": (
        "checks scikit-learn's error text for a collapsed component; caviar's is 'caviar: "
        "error: EM: the covariance of component k is singular ...; add a small --reg-covar' "
        "(a CaviarError, a ValueError: the type matches, the regex does not)", "AssertionError"),
    "test_gaussian_mixture.py::test_gaussian_mixture_precisions_init_diag": (
        "pairs precisions_init computed from scikit-learn's KMeans labels with the means and "
        "weights of the estimator's own init_params='kmeans' start, caviar's k-means++, which "
        "numbers the two clusters the other way round: EM then starts from mismatched "
        "parameters (log-likelihood -3844 against -2465), and takes one iteration more than "
        "the plain fit (2 against 1; both end at the same log-likelihood)", "AssertionError"),
    "test_gaussian_mixture.py::test_gaussian_mixture_setting_best_params": (
        "asserts that one EM iteration with reg_covar=0 raises no error. Its means_init put "
        "components 0 and 1 within 3e-15 of a data point with precision 1e6, so each keeps "
        "that one point and its spherical variance is round-off (scikit-learn: 3.6e-16 and "
        "9.1e-16, accepted as > 0); caviar calls a covariance singular when a variance (full "
        "and tied: a Cholesky pivot) is below 100 eps times the raw second moment, its "
        "round-off level, and raises CaviarError 'EM: the covariance of component 0 is "
        "singular ...'", "ValueError"),
}

# Part ranks2: passing tests that fit several models, again at 2 ranks (the last two loop over
# the four covariance types).
RANKS2 = [
    "test_bayesian_mixture.py::test_bayesian_mixture_weights",
    "test_bayesian_mixture.py::test_bayesian_mixture_mean_prior_initialisation",
    "test_mixture.py::test_gaussian_mixture_n_iter",
    "test_bayesian_mixture.py::test_check_covariance_precision",
    "test_gaussian_mixture.py::test_gaussian_mixture_n_parameters",
]

NON_INTEGER = ("check_estimator's data are random non-negative floats; `caviar lda fit` "
               "accepts integer counts only (CaviarError '... is not an integer; token counts "
               "must be non-negative integers')")
NOT_INT_MSG = "is not an integer; token counts must be non-negative integers"
# estimator -> {check name: (reason, a text its failure message must contain)}
CHECK_ESTIMATOR_CANNOT_PASS = {
    "BayesianGaussianMixture": {},
    "GaussianMixture": {},
    "LatentDirichletAllocation": {name: (NON_INTEGER, NOT_INT_MSG) for name in [
        "check_estimators_dtypes", "check_fit_score_takes_y", "check_estimators_fit_returns_self",
        "check_dtype_object", "check_pipeline_consistency", "check_estimators_nan_inf",
        "check_estimators_overwrite_params", "check_estimators_pickle",
        "check_transformer_data_not_an_array", "check_transformer_general",
        "check_transformer_preserve_dtypes", "check_transformer_n_iter",
        "check_methods_sample_order_invariance", "check_methods_subset_invariance",
        "check_dict_unchanged", "check_dont_overwrite_parameters", "check_fit_idempotent",
        "check_fit_check_is_fitted", "check_n_features_in", "check_fit2d_predict1d"]},
    # The same estimator on integer data: IntegerCountsLDA below.
    "IntegerCountsLDA": {},
}
CHECK_ESTIMATOR_CANNOT_PASS["LatentDirichletAllocation"].update({
    # These three catch the error and compare its text with what they expect.
    "check_estimator_sparse_data": (
        NON_INTEGER + "; the check wants a fit, or an error that names sparse input",
        "doesn't seem to fail gracefully on sparse data"),
    "check_fit2d_1sample": (NON_INTEGER + "; the check wants scikit-learn's text for one sample",
                            "The error message should contain one of the following patterns"),
    "check_fit2d_1feature": (NON_INTEGER + "; the check wants scikit-learn's text for one "
                             "feature", "The error message should contain one of the following "
                             "patterns"),
})


def _ceil_counts(X):
    """check_estimator's random floats rounded up to integer counts, in X's own container;
    anything else (NaN stays NaN, objects that are not numbers, ...) unchanged."""
    import numpy as np
    import scipy.sparse as sp
    from sklearn.utils.estimator_checks import _NotAnArray
    if sp.issparse(X):
        if X.dtype.kind != "f":
            return X
        X = X.copy() if X.format in ("csr", "csc", "coo", "bsr", "dia") else X.tocsr()
        X.data = np.ceil(X.data)
        return X
    if isinstance(X, _NotAnArray):
        return _NotAnArray(_ceil_counts(np.asarray(X)))
    if isinstance(X, list):
        try:
            return np.ceil(np.asarray(X, dtype=np.float64)).tolist()
        except (TypeError, ValueError):
            return X
    if isinstance(X, np.ndarray) and X.dtype.kind in "fO":
        try:
            return np.ceil(X.astype(np.float64)).astype(X.dtype)
        except (TypeError, ValueError):
            return X
    return X


def integer_counts_lda(caviar):
    """A test-only subclass that rounds check_estimator's data up to integer counts before fit,
    to check the rest of the estimator's conventions."""
    global IntegerCountsLDA

    class IntegerCountsLDA(caviar.LatentDirichletAllocation):
        def fit(self, X, y=None):
            return super().fit(_ceil_counts(X), y)

    IntegerCountsLDA.__module__ = __name__
    IntegerCountsLDA.__qualname__ = "IntegerCountsLDA"
    return IntegerCountsLDA()


def matches(nodeid, table):
    short = nodeid.split("/")[-1]
    if short in table:
        return short
    base = short.split("[")[0]
    return base if base in table else None


def run_pytest(args, tests, expect, workdir, tag, env_extra):
    results = os.path.join(workdir, "results_%s.json" % tag)
    env = dict(os.environ)
    env.update(env_extra)
    env["CAVIAR_BIN"] = args.caviar
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(REPO, "python"), HERE]
                                        + [p for p in [env.get("PYTHONPATH")] if p])
    env["PYTHONDONTWRITEBYTECODE"] = "1"       # nothing written into dist-packages
    env["SKLEARN_TESTS_GLOBAL_RANDOM_SEED"] = "42"
    env.setdefault("OMP_NUM_THREADS", "1")
    env["CAVIAR_SUITE_EXPECT"] = json.dumps(expect)
    env["CAVIAR_SUITE_RESULTS"] = results
    env["TMPDIR"] = workdir
    cmd = [sys.executable, "-m", "pytest", "-p", "caviar_sklearn_plugin", "-p", "no:cacheprovider",
           "--rootdir", SK_TESTS, "-q", "-rfE", "--tb=short" if args.verbose else "--tb=line",
           "-W", "ignore::DeprecationWarning"] + tests
    t0 = time.time()
    pr = subprocess.run(cmd, env=env, cwd=workdir, capture_output=True, text=True)
    dt = time.time() - t0
    if args.verbose or pr.returncode not in (0, 1):
        print(pr.stdout[-20000:])
        print(pr.stderr[-5000:])
    if not os.path.exists(results):
        print("pytest wrote no results (exit %d):\n%s\n%s" % (pr.returncode, pr.stdout[-5000:],
                                                               pr.stderr[-3000:]))
        return None, dt
    with open(results) as f:
        return json.load(f), dt


def judge(tag, res, table, dt, require_all_listed=True):
    """Prints the part's summary; returns the number of broken rules."""
    bad = 0
    passed = [n for n, r in res.items() if r["outcome"] == "passed"]
    cannot = [n for n, r in res.items() if r["outcome"] == "xfailed"]
    failed = [n for n, r in res.items() if r["outcome"] not in ("passed", "xfailed")]
    no_caviar = [n for n in passed if res[n]["caviar_runs"] == 0]
    runs = sum(r["caviar_runs"] for r in res.values())
    print("[%s] %d tests: %d passed, %d cannot apply, %d failed; %d caviar runs, %.1f s"
          % (tag, len(res), len(passed), len(cannot), len(failed), runs, dt))
    if no_caviar:
        print("  passed without running caviar (scikit-learn's private helpers, or errors raised "
              "before a fit): " + ", ".join(sorted(n.split("::")[-1] for n in no_caviar)))
    for n in sorted(failed):
        listed = matches(n, table)
        why = ("listed as cannot-apply (%s) but %s" % (table[listed][1], res[n]["message"])
               if listed else res[n]["message"])
        print("    FAIL %s: %s" % (n, why))
        bad += 1
    if require_all_listed:
        for key in table:
            if not any(matches(n, {key: 0}) for n in res):
                print("    FAIL the list names %s, which was not run (stale entry)" % key)
                bad += 1
    return bad


def part_suite(args, workdir):
    res, dt = run_pytest(args, [os.path.join(SK_TESTS, m) for m in MODULES], CANNOT_APPLY,
                         workdir, "suite", {})
    if res is None:
        return 1
    bad = judge("suite", res, CANNOT_APPLY, dt)
    print("  cannot apply:")
    for key, (reason, exc) in CANNOT_APPLY.items():
        n = sum(1 for t in res if matches(t, {key: 0}))
        print("    %s (%d test%s): %s" % (key, n, "" if n == 1 else "s", reason))
    return bad


def part_ranks2(args, workdir):
    res, dt = run_pytest(args, [os.path.join(SK_TESTS, t) for t in RANKS2], {}, workdir,
                         "ranks2", {"CAVIAR_SUITE_RANKS": "2"})
    if res is None:
        return 1
    bad = judge("ranks2", res, {}, dt)
    if not any(r["caviar_runs"] for r in res.values()):
        print("    FAIL no caviar run at 2 ranks")
        bad += 1
    return bad


def _import_caviar(args):
    os.environ["CAVIAR_BIN"] = args.caviar
    sys.path.insert(0, os.path.join(REPO, "python"))
    import caviar
    return caviar


def part_predict(args, workdir):
    """The NumPy E-step of the estimators against caviar's own (`gmm predict`)."""
    import h5py
    import numpy as np
    from sklearn.exceptions import ConvergenceWarning
    caviar = _import_caviar(args)
    rng = np.random.RandomState(0)
    X = np.vstack([rng.randn(300, 3) + 5, rng.randn(200, 3) * 0.5 - 2, rng.randn(100, 3)])
    xfile = os.path.join(workdir, "predict_x.h5")
    with h5py.File(xfile, "w") as f:
        f["X"] = X
    B = caviar.BayesianGaussianMixture
    dd = "dirichlet_distribution"
    cases = [(B, dict(covariance_type="full")), (B, dict(covariance_type="diag")),
             (B, dict(covariance_type="full", weight_concentration_prior_type=dd)),
             (B, dict(covariance_type="diag", weight_concentration_prior_type=dd,
                      mean_prior=np.zeros(3), covariance_prior=np.ones(3))),
             (B, dict(covariance_type="tied")),
             (B, dict(covariance_type="tied", weight_concentration_prior_type=dd,
                      mean_prior=np.zeros(3), covariance_prior=np.eye(3))),
             (B, dict(covariance_type="spherical")),
             (B, dict(covariance_type="spherical", weight_concentration_prior_type=dd,
                      mean_prior=np.zeros(3), covariance_prior=1.0)),
             (caviar.GaussianMixture, dict(covariance_type="full")),
             (caviar.GaussianMixture, dict(covariance_type="diag")),
             (caviar.GaussianMixture, dict(covariance_type="tied")),
             (caviar.GaussianMixture, dict(covariance_type="spherical"))]
    bad = 0
    t0 = time.time()
    for cls, kw in cases:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)  # tol=0: never "converged"
            est = cls(n_components=4, random_state=3, max_iter=7, tol=0, **kw).fit(X)
        # The same fit through the command line, then caviar's own responsibilities.
        model, lab = os.path.join(workdir, "pm.h5"), os.path.join(workdir, "pl.h5")
        cmd = [args.caviar, "gmm", "fit", "--data", xfile, "-k", "4", "--covariance",
               est.covariance_type, "--max-iter", "7", "--tol", "0", "--seed", "3", "--out", model]
        if cls is caviar.GaussianMixture:
            cmd += ["--algorithm", "em"]
        else:
            cmd += ["--weights", "stick-breaking"
                    if est.weight_concentration_prior_type == "dirichlet_process" else "dirichlet",
                    "--prior-mean", "data" if est.mean_prior is None else "zero",
                    "--prior-scale", "data" if est.covariance_prior is None else "identity"]
        for c in (cmd, [args.caviar, "gmm", "predict", "--model", model, "--data", xfile,
                        "--out", lab, "--save-responsibilities"]):
            subprocess.run(c, check=True, capture_output=True)
        with h5py.File(lab, "r") as f:
            r, labels = f["responsibilities"][...], f["labels"][...]
        with h5py.File(model, "r") as f:
            same_fit = np.array_equal(f["means"][...], est.means_)
        err = float(np.abs(est.predict_proba(X) - r).max())
        ok = same_fit and err < 1e-12 and np.array_equal(labels, est.predict(X)) and \
            np.array_equal(est.predict(xfile + ":/X"), est.predict(X))
        bad += not ok
        shown = ", ".join("%s=%s" % (k, v if isinstance(v, (str, float)) else "array")
                          for k, v in kw.items())
        print("  %s(%s): same fit as the CLI: %s, max|resp - caviar's| = %.1e, labels equal: "
              "%s  %s" % (cls.__name__, shown, same_fit, err,
                          np.array_equal(labels, est.predict(X)), "ok" if ok else "FAIL"))
    print("[predict] %d of %d model variants agree with `caviar gmm predict`, %.1f s"
          % (len(cases) - bad, len(cases), time.time() - t0))
    return bad


def part_check_estimator(args, workdir):
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.utils.estimator_checks import check_estimator
    caviar = _import_caviar(args)
    os.environ["TMPDIR"] = workdir
    tempfile.tempdir = workdir
    bad = 0
    for est in (caviar.BayesianGaussianMixture(), caviar.GaussianMixture(),
                caviar.LatentDirichletAllocation(), integer_counts_lda(caviar)):
        name = type(est).__name__
        table = CHECK_ESTIMATOR_CANNOT_PASS[name]
        t0 = time.time()
        outcome = {}
        for e, check in check_estimator(est, generate_only=True):
            cname = getattr(check, "func", check).__name__
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", ConvergenceWarning)
                    check(e)
                outcome.setdefault(cname, None)
            except Exception as ex:  # noqa: BLE001
                outcome[cname] = "%s: %s" % (type(ex).__name__, str(ex))
                if args.verbose:
                    traceback.print_exc()
        failed = {c: m for c, m in outcome.items() if m is not None}
        print("[check_estimator] %s: %d checks, %d pass, %d cannot pass (listed), %.1f s"
              % (name, len(outcome), len(outcome) - len(failed), len(failed), time.time() - t0))
        for c, m in sorted(failed.items()):
            if c not in table:
                print("    FAIL %s (not listed): %s" % (c, m.splitlines()[0][:300]))
                bad += 1
            elif table[c][1] not in m:
                print("    FAIL %s is listed, but fails otherwise: %s" % (c, m.splitlines()[0][:300]))
                bad += 1
        for c in sorted(table):
            if c not in outcome:
                print("    FAIL listed check %s was not run (stale entry)" % c)
                bad += 1
            elif outcome[c] is None:
                print("    FAIL listed check %s now passes: remove it from the list" % c)
                bad += 1
        by_reason = {}
        for c in sorted(failed):
            if c in table:
                by_reason.setdefault(table[c][0], []).append(c)
        for reason, checks in by_reason.items():
            print("    cannot pass: %s\n      (%s)" % (", ".join(checks), reason))
    return bad


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("caviar", metavar="CAVIAR_BIN")
    ap.add_argument("workdir", metavar="WORKDIR")
    ap.add_argument("--part", action="append",
                    choices=["suite", "ranks2", "predict", "check_estimator"])
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    args.caviar = os.path.abspath(args.caviar)
    if not os.access(args.caviar, os.X_OK):
        print("run_sklearn_suite.py: error: %s is not an executable file" % args.caviar)
        return 2
    import importlib.util
    if importlib.util.find_spec("pytest") is None:
        print("run_sklearn_suite.py: error: pytest is missing (Debian: python3-pytest)")
        return 2
    os.makedirs(args.workdir, exist_ok=True)
    workdir = os.path.abspath(args.workdir)
    parts = args.part or ["suite", "ranks2", "predict", "check_estimator"]
    t0 = time.time()
    bad = 0
    if "suite" in parts:
        bad += part_suite(args, workdir)
    if "ranks2" in parts:
        bad += part_ranks2(args, workdir)
    if "predict" in parts:
        bad += part_predict(args, workdir)
    if "check_estimator" in parts:
        bad += part_check_estimator(args, workdir)
    print("run_sklearn_suite: %s (%d broken rule%s), %.1f s"
          % ("PASS" if bad == 0 else "FAIL", bad, "" if bad == 1 else "s", time.time() - t0))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
