#!/usr/bin/env -S /usr/bin/python3
"""`gmm fit --init random-from-data`: component j starts from one data point, the K points drawn
without replacement by --seed; every other point has a zero row of initial responsibilities
(scikit-learn's init_params="random_from_data"). Zero rows are also accepted in --init FILE:/resp.

Checks, on generated data (N = 2000, D = 3, K = 4):
  1. EM stopped after the first M-step (--max-iter 0) has K distinct data points as its means,
     weights 1/K and covariances reg_covar I, as that M-step must give;
  2. scikit-learn cross-check: from the same K points (scikit-learn's RandomState.choice made to
     return caviar's rows), 15 EM iterations give the same weights, means, covariances and bound;
  3. the same one-hot rows written to a file and given as --init FILE:/resp give the same bits;
  4. 1 rank, 3 ranks and 3 ranks with --stream give the same bits, for EM and for CAVI;
  5. another --seed draws other points;
  6. a file whose rows are all zero is refused with one line.

usage: test_gmm_init_from_data.py CAVIAR_BIN WORKDIR
"""
import subprocess
import sys
import warnings

import h5py
import numpy as np
from sklearn.exceptions import ConvergenceWarning
from sklearn.mixture import GaussianMixture

from clitest import fresh_workdir, h5_differences, mpirun, run_summary

K = 4
REG = 1e-6


class GivenChoice(np.random.RandomState):
    """A RandomState whose choice() returns fixed rows: scikit-learn's random_from_data start
    draws its K points with random_state.choice(n, K, replace=False)."""

    def __init__(self, rows):
        super().__init__(0)
        self.rows = np.asarray(rows)

    def choice(self, n, size=None, replace=True, p=None):
        assert size == len(self.rows) and not replace
        return self.rows.copy()


def main():
    caviar, work = sys.argv[1], sys.argv[2]
    p = fresh_workdir(work)
    data = p("data.h5") + ":/X"
    run_summary([caviar, "-q", "generate", "gmm", "--n", "2000", "--dim", "3", "--components",
                 str(K), "--seed", "5", "--out", data])
    with h5py.File(p("data.h5"), "r") as f:
        x = f["X"][:]
    failures = []

    def check(ok, what):
        print(f"{'ok  ' if ok else 'FAIL'} {what}")
        if not ok:
            failures.append(what)

    def fit(ranks, out, *args, algorithm="em"):
        reg = ["--reg-covar", str(REG)] if algorithm == "em" else []
        return run_summary(mpirun(ranks) + [
            caviar, "-q", "gmm", "fit", "--data", data, "-k", str(K), "--algorithm", algorithm,
            "--tol", "0", "--out", out] + reg + list(args))

    def read(path):
        with h5py.File(path, "r") as f:
            return {k: f[k][:] for k in ("weights", "means", "covariances")}

    # 1. The first M-step from one point per component.
    fit(2, p("m0.h5"), "--init", "random-from-data", "--seed", "7", "--max-iter", "0")
    m0 = read(p("m0.h5"))
    dist = np.abs(m0["means"][:, None, :] - x[None, :, :]).max(axis=2)
    rows = dist.argmin(axis=1)
    gap = dist[np.arange(K), rows].max() / np.abs(x).max()
    check(gap < 1e-12 and len(set(rows)) == K,
          f"--max-iter 0: the means are {len(set(rows))} distinct data rows {sorted(rows)} "
          f"(relative gap {gap:.1e})")
    # caviar's one-pass covariance (Sxx / N_k - mean mean^T, about a shift) cancels to zero only
    # up to rounding of the squared coordinates: compare on that scale.
    eye = np.broadcast_to(np.eye(3) * REG, m0["covariances"].shape)
    err = max(np.abs(m0["weights"] - 1 / K).max(),
              np.abs(m0["covariances"] - eye).max() / (np.abs(x).max() ** 2))
    check(err < 1e-13, f"--max-iter 0: weights 1/K and covariances reg_covar I (error {err:.1e})")

    # 2. Against scikit-learn from the same K points.
    iters = 15
    fit(2, p("em.h5"), "--init", "random-from-data", "--seed", "7", "--max-iter", str(iters))
    ours = read(p("em.h5"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        sk = GaussianMixture(K, init_params="random_from_data", random_state=GivenChoice(rows),
                             max_iter=iters, tol=0, reg_covar=REG).fit(x)
    err = max(np.abs(ours["weights"] - sk.weights_).max(),
              np.abs(ours["means"] - sk.means_).max(),
              np.abs(ours["covariances"] - sk.covariances_).max())
    with h5py.File(p("em.h5"), "r") as f:
        ll = f["trace/log_likelihood"][-2:] / len(x)
    # scikit-learn's lower_bound_ is the mean log-likelihood of the last E-step, before the last
    # M-step; caviar's trace ends with one more, at the final parameters (scikit-learn's score).
    lb_err = max(abs(ll[0] - sk.lower_bound_) / abs(sk.lower_bound_),
                 abs(ll[1] - sk.score(x)) / abs(sk.score(x)))
    check(err < 1e-8 and lb_err < 1e-10,
          f"{iters} EM iterations vs scikit-learn from the same points: parameters differ by "
          f"{err:.1e}, bound by {lb_err:.1e} (relative)")

    # 3. The same start as a file of one-hot and zero rows.
    resp = np.zeros((len(x), K))
    resp[rows, np.arange(K)] = 1.0
    with h5py.File(p("resp.h5"), "w") as f:
        f["resp"] = resp
    fit(2, p("file.h5"), "--init", p("resp.h5") + ":/resp", "--seed", "7", "--max-iter",
        str(iters))
    from_file = read(p("file.h5"))
    check(all(np.array_equal(from_file[k], ours[k]) for k in ours),
          "--init FILE:/resp with the same one-hot and zero rows gives the same bits")

    # 4. Rank- and stream-invariance, EM and CAVI.
    for algorithm in ("em", "cavi"):
        outs = []
        for ranks, extra in ((1, []), (3, []), (3, ["--stream"])):
            out = p(f"{algorithm}_{ranks}{'_stream' if extra else ''}.h5")
            fit(ranks, out, "--init", "random-from-data", "--seed", "7", "--max-iter", "5",
                *extra, algorithm=algorithm)
            outs.append(out)
        bad = h5_differences(*outs)
        check(not bad, f"{algorithm}: 1 rank, 3 ranks and 3 ranks --stream give the same bits"
              + (f" (differ: {bad[:4]})" if bad else ""))

    # 5. Another seed, other points.
    fit(1, p("seed8.h5"), "--init", "random-from-data", "--seed", "8", "--max-iter", "0")
    other = read(p("seed8.h5"))["means"]
    check(not np.array_equal(np.sort(other, axis=0), np.sort(m0["means"], axis=0)),
          "--seed 8 starts from other points than --seed 7")

    # 6. All rows zero: one line, non-zero exit.
    with h5py.File(p("zero.h5"), "w") as f:
        f["resp"] = np.zeros((len(x), K))
    r = subprocess.run(mpirun(2) + [caviar, "-q", "gmm", "fit", "--data", data, "-k", str(K),
                                    "--init", p("zero.h5") + ":/resp", "--out", p("z.h5")],
                       capture_output=True, text=True, timeout=120)
    lines = [line for line in r.stderr.splitlines() if "every row" in line]
    check(r.returncode != 0 and len(set(lines)) == 1,
          f"all-zero responsibilities: exit {r.returncode}, {lines[:1]}")

    if failures:
        raise SystemExit(f"{len(failures)} check(s) failed")
    print("all checks passed")


if __name__ == "__main__":
    main()
