"""pytest plugin for run_sklearn_suite.py: scikit-learn's mixture tests against caviar.

Loaded with `-p caviar_sklearn_plugin` (tests/python and python/ on PYTHONPATH). Before the test
modules are collected it replaces sklearn.mixture.BayesianGaussianMixture and GaussianMixture by
caviar's, so `from sklearn.mixture import ...` in scikit-learn's test modules gets them.
Driven by environment variables set by the runner:

  CAVIAR_SUITE_EXPECT   JSON {test: [reason, exception name]}: these tests are marked
                        xfail(strict=True, raises=exception): they must fail, and with that
                        exception (any other failure, or a pass, fails the run). A test is
                        "file.py::name" (every parametrisation) or "file.py::name[id]".
  CAVIAR_SUITE_RESULTS  where to write {nodeid: {"outcome", "caviar_runs", "message"}}.
  CAVIAR_SUITE_RANKS    every caviar run of the estimators uses this many MPI ranks.
"""

import json
import os

import pytest

_state = {"runs": 0, "results": {}, "expect": {}}


def _key_matches(nodeid, expect):
    """The expectation for nodeid ("file.py::name[id]"), exact first, then by name."""
    short = nodeid.split("/")[-1]
    if short in expect:
        return expect[short]
    return expect.get(short.split("[")[0])


def pytest_configure(config):
    import sklearn.mixture
    import caviar
    import caviar._runner as runner

    sklearn.mixture.BayesianGaussianMixture = caviar.BayesianGaussianMixture
    sklearn.mixture.GaussianMixture = caviar.GaussianMixture

    real_run = runner.run
    ranks = int(os.environ.get("CAVIAR_SUITE_RANKS", "0"))

    def counting_run(args, **kw):
        _state["runs"] += 1
        if ranks:
            kw["n_ranks"] = ranks
        return real_run(args, **kw)

    runner.run = counting_run
    _state["expect"] = json.loads(os.environ.get("CAVIAR_SUITE_EXPECT", "{}"))


def pytest_collection_modifyitems(session, config, items):
    import builtins
    for item in items:
        exp = _key_matches(item.nodeid, _state["expect"])
        if exp:
            reason, exc = exp
            item.add_marker(pytest.mark.xfail(reason=reason, strict=True,
                                              raises=getattr(builtins, exc)))


def pytest_runtest_setup(item):
    _state["runs"] = 0


def pytest_runtest_logreport(report):
    r = _state["results"].setdefault(report.nodeid, {"outcome": "passed", "caviar_runs": 0,
                                                     "message": ""})
    if report.when == "call":
        r["caviar_runs"] = _state["runs"]
    if hasattr(report, "wasxfail") and report.skipped:
        r["outcome"] = "xfailed"
        r["message"] = _short(report)
    elif report.failed:
        r["outcome"] = "failed"
        r["message"] = _short(report) or "XPASS(strict): a listed test passed"
    elif report.skipped and r["outcome"] == "passed":
        r["outcome"] = "skipped"


def _short(report):
    lr = getattr(report, "longrepr", None)
    if lr is None:
        return ""
    crash = getattr(lr, "reprcrash", None)
    if crash is not None:
        return crash.message.splitlines()[0][:300]
    return str(lr).strip().splitlines()[-1][:300]


def pytest_sessionfinish(session, exitstatus):
    path = os.environ.get("CAVIAR_SUITE_RESULTS")
    if path:
        with open(path, "w") as f:
            json.dump(_state["results"], f, indent=1)
