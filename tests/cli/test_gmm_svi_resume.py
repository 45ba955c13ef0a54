#!/usr/bin/env -S /usr/bin/python3
"""`caviar gmm fit --algorithm svi` on the engine's stochastic driver: checkpoints inside a pass
resumed at other rank and thread counts, and the stopping rule on decreasing epoch averages.

On generated data (N = 3000, D = 3, K = 4; --batch-size 256: 12 minibatches an epoch, the last
of 184 rows), 2 epochs, --tol 0:
  1. --checkpoint-every 0.000001s saves at every minibatch boundary, so the last checkpoint of a
     2-rank run stands before the last minibatch of epoch 2 (attributes iteration 1,
     driver.step_in_epoch 11, model.steps 23); resumed from it, the fit ends bitwise as the
     uninterrupted 2-rank fit (model file and labels: every dataset and attribute but timings),
     at 1 rank x 2 threads and at 3 ranks. Cases: Robbins-Monro with full covariance and
     --full-elbo-every 5 (traces kept in the checkpoint); the adaptive rate (its tau, g_bar and
     h_bar kept) with diagonal covariance, stick-breaking weights and --stream; and
     --fast-reduce, resumed at the same 2 ranks only (its plain double sums depend on the rank
     count).
  2. The stopping rule (Bruno 2022, section 2.2.2): with rho = 1 at every step (--kappa 0) the
     epoch averages are noisy; the fit stops with stop_reason elbo-decreased exactly when the
     last three changes of trace/epoch_elbo are decreases, and otherwise runs every epoch with no
     three decreases in a row.
  3. With rho = 1 (--kappa 0) and one minibatch of all N rows, an SVI step is the CAVI update
     (lambda = prior + statistics), so 5 epochs end bitwise where 5 CAVI iterations end, for
     every covariance type (tied and spherical pool their statistics in the same update).

usage: test_gmm_svi_resume.py CAVIAR_BIN WORKDIR
"""
import sys

import h5py
import numpy as np

from clitest import Checks, fresh_workdir, h5_differences


def main():
    caviar, work = sys.argv[1], sys.argv[2]
    p = fresh_workdir(work)
    c = Checks(caviar)
    c.run(["generate", "gmm", "--n", "3000", "--dim", "3", "--components", "4", "--seed", "11",
           "--out", p("x.h5") + ":/X"])
    base = ["gmm", "fit", "--data", p("x.h5") + ":/X", "-k", "4", "--seed", "2", "--tol", "0",
            "--algorithm", "svi", "--batch-size", "256", "--max-iter", "2"]
    cases = {
        "rm-full": (["--full-elbo-every", "5"], [(1, 2), (3, 1)]),
        "adaptive-diag-stick-stream": (["--schedule", "adaptive", "--adaptive-memory", "4",
                                        "--covariance", "diag", "--weights", "stick-breaking",
                                        "--stream", "--init", "random"], [(1, 2), (3, 1)]),
        "fast-reduce": (["--fast-reduce"], [(2, 1)]),
    }
    for name, (extra, resumes) in cases.items():
        stream = "--stream" in extra

        def outs(tag):
            files = ["--out", p(f"{name}_{tag}.h5")]
            return files if stream else files + ["--labels", p(f"{name}_{tag}_labels.h5")]

        def differences(tag):
            d = h5_differences(p(f"{name}_ref.h5"), p(f"{name}_{tag}.h5"))
            if not stream:
                d += h5_differences(p(f"{name}_ref_labels.h5"), p(f"{name}_{tag}_labels.h5"))
            return d

        c.run(base + extra + outs("ref"), ranks=2)
        ck = p(f"{name}_checkpoint.h5")
        c.run(base + extra + outs("ck") + ["--checkpoint", ck, "--checkpoint-every", "0.000001s"],
              ranks=2)
        with h5py.File(ck, "r") as f:
            at = (int(f.attrs["iteration"]), int(f.attrs["driver.step_in_epoch"]),
                  int(f.attrs["model.steps"]))
        c.check(at == (1, 11, 23), f"{name}: the last timed checkpoint stands before the last "
                                   f"minibatch of epoch 2, after 23 steps ({at})")
        c.check(not differences("ck"), f"{name}: checkpointing leaves the outputs as they were")
        for ranks, threads in resumes:
            tag = f"res{ranks}x{threads}"
            c.run(base + extra + outs(tag) + ["--resume", ck], ranks=ranks, threads=threads)
            d = differences(tag)
            c.check(not d, f"{name}: resumed mid-epoch at {ranks} ranks x {threads} threads from "
                           f"a 2-rank checkpoint: bitwise the uninterrupted fit {d[:4]}")

    # The stopping rule on the epoch averages.
    c.run(["generate", "gmm", "--n", "600", "--dim", "2", "--components", "3", "--seed", "5",
           "--out", p("small.h5") + ":/X"])
    stops = set()
    for seed in ("1", "2", "3"):
        out = p(f"noisy_{seed}.h5")
        c.run(["gmm", "fit", "--data", p("small.h5") + ":/X", "-k", "3", "--seed", seed,
               "--tol", "0", "--algorithm", "svi", "--batch-size", "16", "--kappa", "0",
               "--max-iter", "25", "--out", out], ranks=2)
        with h5py.File(out, "r") as f:
            avg = f["trace/epoch_elbo"][()]
            reason = f.attrs["stop_reason"]
            reason = reason.decode() if isinstance(reason, bytes) else reason
            n_iter, converged = int(f.attrs["n_iter"]), int(f.attrs["converged"])
        down = np.diff(avg) < 0
        runs = [bool(down[i - 3:i].all()) for i in range(3, len(down) + 1)]
        if reason == "elbo-decreased":
            ok = runs[-1] and not any(runs[:-1]) and n_iter == len(avg) <= 25 and converged == 1
        else:
            ok = reason == "max-iter" and not any(runs) and n_iter == len(avg) == 25
        stops.add(reason)
        c.check(ok, f"seed {seed}: stop_reason {reason} after {n_iter} epochs agrees with the "
                    f"epoch averages' decreases {down.astype(int).tolist()}")
    c.check("elbo-decreased" in stops, f"some noisy fit stopped on three decreases ({stops})")

    # SVI with rho = 1 and B = N is CAVI.
    for cov in ("full", "diag", "tied", "spherical"):
        one = ["gmm", "fit", "--data", p("x.h5") + ":/X", "-k", "4", "--seed", "2", "--tol", "0",
               "--init", "random", "--max-iter", "5", "--covariance", cov]
        c.run(one + ["--out", p(f"cavi_{cov}.h5")], ranks=2)
        c.run(one + ["--algorithm", "svi", "--kappa", "0", "--batch-size", "3000", "--out",
                     p(f"svi_{cov}.h5")], ranks=2)
        with h5py.File(p(f"cavi_{cov}.h5"), "r") as a, h5py.File(p(f"svi_{cov}.h5"), "r") as b:
            same = [k for k in ("weights", "means", "covariances", "posterior/W_inv",
                                "posterior/nu", "posterior/beta")
                    if np.array_equal(a[k][()], b[k][()])]
            elbo = (float(a.attrs["elbo"]), float(b.attrs["elbo"]))
        c.check(len(same) == 6 and elbo[0] == elbo[1],
                f"{cov}: SVI with rho = 1 and B = N ends bitwise at CAVI's posterior (equal: "
                f"{same}; ELBO {elbo[0]!r} / {elbo[1]!r})")
    c.finish()


if __name__ == "__main__":
    main()
