#!/usr/bin/env -S /usr/bin/python3
"""Where `caviar gmm fit` starts: `--init-params FILE.h5` starts from the responsibilities of the
mixture in FILE (/weights, /means, /covariances): a warm start from a model file, or parameters a
user gives; `--n-init N` runs N starts and keeps the best.

Checks, on generated data (N = 3000, D = 3, K = 3):
  1. scikit-learn cross-check: EM from given parameters, stopped after its first M-step
     (caviar --max-iter 0), has the means, weights and covariances of scikit-learn's
     GaussianMixture(weights_init, means_init, precisions_init, max_iter=1) on the same data;
  2. a warm start continues EM: a fit of 10 iterations, then a fit warm-started from its model
     file, has the bound an uninterrupted fit reaches one iteration later, and EM's bound never
     decreases across the restart;
  3. the same warm start at 1 and 3 ranks gives the same bits, with --stream as well;
  4. a diagonal model file can start a full-covariance fit;
  5. --n-init 4: the model file lists the 4 starts' bounds, start 0 is the plain fit of --seed
     (same bits), the starts differ, the model kept is the best one, and 1 and 3 ranks agree.

usage: test_gmm_init_params.py CAVIAR_BIN WORKDIR
"""
import sys
import warnings

import h5py
import numpy as np
from sklearn.exceptions import ConvergenceWarning
from sklearn.mixture import GaussianMixture

from clitest import fresh_workdir, h5_contents, mpirun, run_summary


def main():
    caviar, work = sys.argv[1], sys.argv[2]
    p = fresh_workdir(work)
    data = p("data.h5") + ":/X"
    run_summary([caviar, "-q", "generate", "gmm", "--n", "3000", "--dim", "3", "--components", "3",
         "--seed", "11", "--out", data])
    with h5py.File(p("data.h5"), "r") as f:
        x = f["X"][:]
    failures = []

    def fit(ranks, out, *args):
        return run_summary(mpirun(ranks) + [caviar, "-q", "gmm", "fit", "--data", data, "-k", "3",
                                    "--algorithm", "em", "--tol", "0", "--out", out] + list(args))

    def read(path):
        with h5py.File(path, "r") as f:
            return {k: f[k][:] for k in ("weights", "means", "covariances", "trace/log_likelihood")}

    # 1. Against scikit-learn, from parameters unlike any fit's.
    rng = np.random.default_rng(2)
    w0 = np.array([0.2, 0.3, 0.5])
    m0 = x[rng.choice(len(x), 3, replace=False)]
    c0 = np.stack([np.eye(3) * s for s in (1.0, 2.0, 4.0)]) + 0.1
    with h5py.File(p("given.h5"), "w") as f:
        f["weights"], f["means"], f["covariances"] = w0, m0, c0
    fit(2, p("one.h5"), "--init-params", p("given.h5"), "--max-iter", "0")
    ours = read(p("one.h5"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        sk = GaussianMixture(3, weights_init=w0, means_init=m0,
                             precisions_init=np.linalg.inv(c0), max_iter=1, tol=0).fit(x)
    err = max(np.abs(ours["weights"] - sk.weights_).max(), np.abs(ours["means"] - sk.means_).max(),
              np.abs(ours["covariances"] - sk.covariances_).max())
    if not err < 1e-9:
        failures.append(f"first M-step differs from scikit-learn's by {err:.2e}")
    print(f"{'ok  ' if err < 1e-9 else 'FAIL'} one EM step from given parameters vs scikit-learn: "
          f"max difference {err:.2e}")

    # 2. A warm start continues EM.
    fit(2, p("a10.h5"), "--seed", "3", "--max-iter", "10")
    fit(2, p("b11.h5"), "--seed", "3", "--max-iter", "11")
    fit(2, p("warm.h5"), "--init-params", p("a10.h5"), "--max-iter", "0")
    a, b, c = read(p("a10.h5")), read(p("b11.h5")), read(p("warm.h5"))
    ll_a, ll_b, ll_c = a["trace/log_likelihood"][-1], b["trace/log_likelihood"][-1], \
        c["trace/log_likelihood"][0]
    rel = abs(ll_c - ll_b) / abs(ll_b)
    ok = rel < 1e-12 and ll_c >= ll_a - 1e-12 * abs(ll_a) and \
        np.allclose(c["means"], b["means"], rtol=0, atol=1e-9)
    if not ok:
        failures.append(f"warm start: log-likelihood {ll_c!r} after the restart, {ll_b!r} "
                        f"uninterrupted, {ll_a!r} before")
    print(f"{'ok  ' if ok else 'FAIL'} warm start = one more EM iteration: relative difference "
          f"{rel:.1e}, bound {ll_a:.6f} -> {ll_c:.6f}")

    # 3. Rank invariance, in memory and streamed.
    outs = []
    for ranks, extra in ((1, []), (3, []), (3, ["--stream", "--chunk-rows", "256"])):
        out = p(f"warm_{ranks}_{len(extra)}.h5")
        fit(ranks, out, "--init-params", p("a10.h5"), "--max-iter", "5", *extra)
        outs.append(h5_contents(out))
    same = all(o == outs[0] for o in outs[1:])
    if not same:
        failures.append("warm starts differ between 1 rank, 3 ranks and 3 ranks --stream")
    print(f"{'ok  ' if same else 'FAIL'} warm start bitwise at 1, 3 and 3 ranks --stream")

    # 4. A diagonal CAVI model file starts a full-covariance fit.
    run_summary(mpirun(2) + [caviar, "-q", "gmm", "fit", "--data", data, "-k", "3", "--covariance", "diag",
                     "--max-iter", "20", "--out", p("diag.h5")])
    s = run_summary(mpirun(2) + [caviar, "-q", "gmm", "fit", "--data", data, "-k", "3", "--init-params",
                         p("diag.h5"), "--max-iter", "50", "--out", p("full_from_diag.h5")])
    with h5py.File(p("full_from_diag.h5"), "r") as f:
        init = f.attrs["init"]
        init = init.decode() if isinstance(init, bytes) else init
    ok = init == "params:" + p("diag.h5") and np.isfinite(s["elbo"])
    if not ok:
        failures.append(f"diag -> full: init attribute {init!r}, elbo {s['elbo']}")
    print(f"{'ok  ' if ok else 'FAIL'} a diagonal model starts a full fit (init = {init!r})")

    # 5. --n-init.
    plain = fit(2, p("plain.h5"), "--seed", "3", "--init", "random", "--max-iter", "30")
    outs = []
    for ranks in (1, 3):
        fit(ranks, p(f"ninit{ranks}.h5"), "--seed", "3", "--init", "random", "--max-iter", "30",
            "--n-init", "4")
        outs.append(h5_contents(p(f"ninit{ranks}.h5")))
    with h5py.File(p("ninit3.h5"), "r") as f:
        bounds, best = f["n_init_bounds"][:], int(f.attrs["best_start"])
        kept = float(f.attrs["log_likelihood"])
    problems = []
    if len(bounds) != 4 or int(np.argmax(bounds)) != best or kept != bounds.max():
        problems.append(f"bounds {bounds}, best_start {best}, kept {kept}")
    if bounds[0] != plain["log_likelihood"]:
        problems.append(f"start 0 has bound {bounds[0]!r}, the plain fit {plain['log_likelihood']!r}")
    if len(set(bounds.tolist())) < 2:
        problems.append("every start has the same bound")
    if outs[0] != outs[1]:
        problems.append("1 and 3 ranks differ")
    failures += problems
    print(f"{'FAIL' if problems else 'ok  '} --n-init 4: bounds {np.round(bounds, 3).tolist()}, kept "
          f"start {best}" + ("" if not problems else ": " + "; ".join(problems)))

    if failures:
        sys.exit("FAIL: " + "; ".join(failures))
    print("PASS")


if __name__ == "__main__":
    main()
