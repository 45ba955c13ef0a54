#!/usr/bin/env -S /usr/bin/python3
"""caviar generate glm: the same bits at 1 and 3 ranks, and data whose maximum-likelihood fit
recovers the recorded /true/theta within 5 standard errors (linear by least squares, logistic
and Poisson by Newton's method with the Fisher information; softmax by class frequencies against
the mean predicted probabilities). Bad options give one error line.

usage: test_generate_glm.py CAVIAR_BIN WORKDIR
"""
import subprocess
import sys

import h5py
import numpy as np

from clitest import fresh_workdir, h5_differences, mpirun, run_summary

CAVIAR = sys.argv[1]
path = fresh_workdir(sys.argv[2])
N, D = 20000, 4


def generate(family, ranks, out, extra=()):
    run_summary(mpirun(ranks) + [CAVIAR, "generate", "glm", "--family", family, "--n", str(N),
                                 "--dim", str(D), "--seed", "5", "--out", out, *extra])


def newton(x, y, mean_and_weight):
    """Maximum likelihood of a canonical-link GLM; returns the estimate and its standard errors."""
    theta = np.zeros(x.shape[1])
    for _ in range(50):
        mu, w = mean_and_weight(x @ theta)
        info = x.T @ (x * w[:, None])
        step = np.linalg.solve(info, x.T @ (y - mu))
        theta += step
        if np.max(np.abs(step)) < 1e-12:
            break
    mu, w = mean_and_weight(x @ theta)
    return theta, np.sqrt(np.diag(np.linalg.inv(x.T @ (x * w[:, None]))))


failures = []
for family, extra in [("linear", ["--noise-sd", "0.5"]), ("logistic", []), ("poisson", []),
                      ("softmax", ["--classes", "3"])]:
    one, three = path(family + "_1.h5"), path(family + "_3.h5")
    generate(family, 1, one, extra)
    generate(family, 3, three, extra)
    diff = h5_differences(one, three)
    if diff:
        failures.append(f"{family}: 1 and 3 ranks differ in {diff}")
    with h5py.File(one, "r") as f:
        x, y, true = f["X"][()], f["y"][()], f["true/theta"][()]
        assert f.attrs["model"] == family, f.attrs["model"]
    xb = np.hstack([x, np.ones((N, 1))])  # [w_1..w_D, b], as /true/theta
    if family == "linear":
        est, *_ = np.linalg.lstsq(xb, y, rcond=None)
        se = 0.5 * np.sqrt(np.diag(np.linalg.inv(xb.T @ xb)))
    elif family == "logistic":
        assert set(np.unique(y)) == {0.0, 1.0}
        est, se = newton(xb, y, lambda e: (1 / (1 + np.exp(-e)),
                                           np.exp(-e) / (1 + np.exp(-e)) ** 2))
    elif family == "poisson":
        assert np.all(y >= 0) and np.all(y == np.floor(y))
        est, se = newton(xb, y, lambda e: (np.exp(e), np.exp(e)))
    else:
        eta = xb @ true.reshape(3, D + 1).T
        p = np.exp(eta - eta.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        counts = np.bincount(y.astype(int), minlength=3)
        expect = p.sum(0)
        z = (counts - expect) / np.sqrt((p * (1 - p)).sum(0))
        print(f"softmax: counts {counts.tolist()}, expected {np.round(expect, 1).tolist()}")
        if np.max(np.abs(z)) > 5:
            failures.append(f"softmax: class counts {counts} vs expected {expect}")
        continue
    z = (est - true) / se
    print(f"{family}: max |estimate - true| / se = {np.max(np.abs(z)):.2f}")
    if np.max(np.abs(z)) > 5:
        failures.append(f"{family}: estimate {est} vs true {true} (z {z})")

for args, expect in [(["--family", "probit"], "--family must be"),
                     (["--family", "softmax", "--classes", "1"], "--classes must be >= 2"),
                     (["--noise-sd", "0", "--family", "linear"], "--noise-sd must be > 0")]:
    r = subprocess.run(mpirun(2) + [CAVIAR, "generate", "glm", "--n", "10", "--dim", "2",
                                    "--out", path("bad.h5"), *args], capture_output=True, text=True)
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("caviar: error")]
    if r.returncode == 0 or not lines or expect not in lines[0]:
        failures.append(f"{args}: exit {r.returncode}, stderr {r.stderr!r}")

if failures:
    sys.exit("FAIL:\n" + "\n".join(failures))
print("PASS")
