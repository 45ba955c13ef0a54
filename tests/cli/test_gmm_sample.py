#!/usr/bin/env -S /usr/bin/python3
"""`caviar gmm sample` draws from the fitted mixture it is given, and the draws do not depend on
the rank count.

For a full-covariance EM model and a diagonal CAVI model fitted to generated data, 60,000 rows are
drawn at 1 and at 3 ranks. Checks:
  - the files are the same bits at 1 and 3 ranks, and another seed gives other rows;
  - the component frequencies match the model's weights (chi-square, 5-sigma);
  - each component's sample mean and covariance, computed by numpy from the rows of that label,
    match the model's means and covariances read with h5py, within 5 standard errors of the
    estimators (means: sqrt(S_jj / n_k); covariances: sqrt((S_ii S_jj + S_ij^2) / n_k));
  - the diagonal model's draws have uncorrelated coordinates within each component.

usage: test_gmm_sample.py CAVIAR_BIN WORKDIR
"""
import subprocess
import sys

import h5py
import numpy as np

from clitest import fresh_workdir, h5_contents, mpirun

N = 60000


def run(argv):
    r = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise SystemExit(f"FAIL: {' '.join(argv)}\n{r.stderr}")
    return r.stdout


def check_model(caviar, p, name, fit_args):
    model = p(name + ".h5")
    run(mpirun(2) + [caviar, "-q", "gmm", "fit", "--data", p("data.h5") + ":/X", "-k", "3",
                     "--seed", "1", "--max-iter", "50", "--out", model] + fit_args)
    files = {}
    for ranks, seed in ((1, 7), (3, 7), (3, 8)):
        out = p(f"{name}_{ranks}_{seed}.h5")
        run(mpirun(ranks) + [caviar, "-q", "gmm", "sample", "--model", model, "--n", str(N),
                             "--seed", str(seed), "--out", out])
        files[(ranks, seed)] = out
    failures = []
    if h5_contents(files[(1, 7)]) != h5_contents(files[(3, 7)]):
        failures.append("the rows differ between 1 and 3 ranks")
    with h5py.File(files[(1, 7)], "r") as f, h5py.File(files[(3, 8)], "r") as g:
        x, z = f["X"][:], f["labels"][:]
        if np.array_equal(x, g["X"][:]):
            failures.append("seeds 7 and 8 gave the same rows")
    with h5py.File(model, "r") as m:
        w, mu, cov = m["weights"][:], m["means"][:], m["covariances"][:]
    diag = cov.ndim == 2
    if x.shape != (N, mu.shape[1]) or z.shape != (N,):
        failures.append(f"shapes {x.shape}, {z.shape}")
    counts = np.bincount(z, minlength=len(w))
    expected = N * w / w.sum()
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    # chi-square with K - 1 = 2 degrees of freedom: mean 2, sd 2.
    if chi2 > 2 + 5 * 2:
        failures.append(f"component counts {counts} vs expected {expected.round()}: chi2 {chi2:.1f}")
    worst_mean = worst_cov = 0.0
    for k in range(len(w)):
        xk = x[z == k]
        s = np.diag(cov[k]) if diag else cov[k]
        se_mean = np.sqrt(np.diag(s) / len(xk))
        worst_mean = max(worst_mean, float(np.max(np.abs(xk.mean(0) - mu[k]) / se_mean)))
        se_cov = np.sqrt((np.outer(np.diag(s), np.diag(s)) + s ** 2) / len(xk))
        worst_cov = max(worst_cov, float(np.max(np.abs(np.cov(xk.T) - s) / se_cov)))
    if worst_mean > 5:
        failures.append(f"a sample mean is {worst_mean:.1f} standard errors from the model's")
    if worst_cov > 5:
        failures.append(f"a sample covariance entry is {worst_cov:.1f} standard errors from the model's")
    print(f"{'FAIL' if failures else 'ok  '} {name}: chi2 {chi2:.2f}, means within {worst_mean:.2f} "
          f"se, covariances within {worst_cov:.2f} se, 1 and 3 ranks "
          f"{'differ' if 'the rows differ between 1 and 3 ranks' in failures else 'identical'}")
    for f in failures:
        print("     " + f)
    return len(failures)


def main():
    caviar, work = sys.argv[1], sys.argv[2]
    p = fresh_workdir(work)
    run([caviar, "-q", "generate", "gmm", "--n", "4000", "--dim", "3", "--components", "3",
         "--seed", "5", "--out", p("data.h5") + ":/X"])
    failures = check_model(caviar, p, "em_full", ["--algorithm", "em"])
    failures += check_model(caviar, p, "cavi_diag", ["--covariance", "diag"])
    if failures:
        sys.exit(f"FAIL: {failures} check(s) failed")
    print("PASS")


if __name__ == "__main__":
    main()
