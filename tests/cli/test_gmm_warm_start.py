#!/usr/bin/env -S /usr/bin/python3
"""`caviar gmm fit --warm-start MODEL.h5` continues a fit from the whole state in its model file
(the variational posterior of CAVI, EM's parameters).

Checks, on generated data (N = 3000, D = 3, K = 3), for CAVI full / diag / stick-breaking and
EM full / diag, every run at 2 ranks with --tol 0:
  1. a fit of A = 4 iterations, warm-started for B = 3 more, ends where one fit of A + B = 7
     iterations ends: weights, means, covariances and every posterior array agree to REL_TOL
     (relative to each array's largest entry). Not bitwise: the fit keeps the centred means
     m_k - c exactly, the model file holds m_k, and m_k - c recomputed from it differs in the
     last bits (see docs/architecture.md);
  2. the warm start's trace is the continuous fit's trace from iteration A on: its first value
     is the bound of the loaded model (the E-step the first fit would have taken next), and the
     bound never decreases across the restart;
  3. n_iter is B, and the model file records its source (attributes warm_start and init);
  4. the warm start gives the same bits at 1 and 2 ranks.
Control (CAVI): a start from the same model's point estimates (--init-params) is further from
the continuous fit than REL_TOL, so check 1 tells the posterior from them.

usage: test_gmm_warm_start.py CAVIAR_BIN WORKDIR
"""
import sys

import h5py
import numpy as np

from clitest import fresh_workdir, h5_contents, mpirun, run_summary

A, B = 4, 3
REL_TOL = 1e-12
ARRAYS = ["weights", "means", "covariances"]
POSTERIOR = ["posterior/beta", "posterior/nu", "posterior/m", "posterior/W_inv"]
CASES = {
    "cavi-full": (["--covariance", "full"], POSTERIOR + ["posterior/alpha"]),
    "cavi-diag": (["--covariance", "diag"], POSTERIOR + ["posterior/alpha"]),
    "cavi-stick": (["--weights", "stick-breaking"],
                   POSTERIOR + ["posterior/stick_a", "posterior/stick_b"]),
    "em-full": (["--algorithm", "em", "--covariance", "full"], ["precisions_cholesky"]),
    "em-diag": (["--algorithm", "em", "--covariance", "diag"], ["precisions_cholesky"]),
}


def read(path, names):
    with h5py.File(path, "r") as f:
        out = {k: f[k][...] for k in names}
        out["trace"] = f["trace/elbo" if "trace/elbo" in f else "trace/log_likelihood"][...]
        out["attrs"] = dict(f.attrs)
    return out


def max_rel(a, b, names):
    return max(float(np.abs(a[k] - b[k]).max() / max(np.abs(b[k]).max(), 1e-300))
               for k in names)


def main():
    caviar, work = sys.argv[1], sys.argv[2]
    p = fresh_workdir(work)
    data = p("data.h5") + ":/X"
    run_summary([caviar, "-q", "generate", "gmm", "--n", "3000", "--dim", "3", "--components",
                 "3", "--seed", "5", "--out", data])
    failures = []

    def check(ok, msg):
        print(("ok   " if ok else "FAIL ") + msg)
        if not ok:
            failures.append(msg)

    for name, (opts, extra) in CASES.items():
        names = ARRAYS + extra

        def fit(ranks, out, *args):
            return run_summary(mpirun(ranks) + [caviar, "-q", "gmm", "fit", "--data", data, "-k",
                                                "3", "--tol", "0", "--seed", "1", "--out", out]
                               + opts + list(args))

        first, cont = p(f"{name}_a.h5"), p(f"{name}_ab.h5")
        warm, warm1, cold = p(f"{name}_warm.h5"), p(f"{name}_warm1.h5"), p(f"{name}_cold.h5")
        fit(2, first, "--max-iter", str(A))
        fit(2, cont, "--max-iter", str(A + B))
        summary = fit(2, warm, "--max-iter", str(B), "--warm-start", first)
        fit(1, warm1, "--max-iter", str(B), "--warm-start", first)
        a, ab, w = read(first, names), read(cont, names), read(warm, names)
        rel = max_rel(w, ab, names)
        check(rel < REL_TOL, f"{name}: {A} + {B} warm-started iterations vs one fit of {A + B}: "
                             f"max relative difference {rel:.1e} (< {REL_TOL:.0e})")
        t_rel = float(np.abs(w["trace"] - ab["trace"][A:]).max() / np.abs(ab["trace"]).max())
        check(len(w["trace"]) == B + 1 and t_rel < REL_TOL,
              f"{name}: the warm trace is the continuous trace from iteration {A} "
              f"(max relative difference {t_rel:.1e})")
        joined = np.concatenate([a["trace"], w["trace"][1:]])
        rises = bool(np.all(np.diff(joined) >= -1e-12 * np.abs(joined[1:])))
        check(rises, f"{name}: the bound never decreases across the restart")
        attrs = w["attrs"]
        check(int(attrs["n_iter"]) == B and summary["iterations"] == B
              and attrs["warm_start"] == first and attrs["init"] == "warm-start:" + first,
              f"{name}: n_iter {attrs['n_iter']}, warm_start {attrs.get('warm_start')!r}, "
              f"init {attrs.get('init')!r}")
        same = h5_contents(warm) == h5_contents(warm1)
        check(same, f"{name}: the warm start at 1 and 2 ranks gives the same bits")
        if name.startswith("em"):
            continue  # EM's state is its point estimate: --init-params restarts it exactly
        # Control: the point estimates alone (--init-params) restart from other responsibilities.
        fit(2, cold, "--max-iter", str(B - 1), "--init-params", first)
        c_rel = max_rel(read(cold, names), ab, names)
        check(c_rel > 100 * REL_TOL,
              f"{name}: control: a start from the point estimates is {c_rel:.1e} away")
    if failures:
        print(f"{len(failures)} check(s) failed")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
