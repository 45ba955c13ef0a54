#!/usr/bin/env -S /usr/bin/python3
"""Runs the README's demo (scripts/run_demo.sh) and checks what it shows a user: the fits recover
the generating mixture, CAVI empties the surplus components of the K = 4 fit (Bruno 2022,
Figure 1.7), the ELBO traces never decrease, the held-out score is sane, and the PNGs exist.

usage: test_demo.py CAVIAR_BIN WORKDIR
"""
import json
import os
import subprocess
import sys

import h5py
import numpy as np

from clitest import fresh_workdir

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.dirname(os.path.dirname(here))


def main():
    caviar, work = sys.argv[1], sys.argv[2]
    fresh_workdir(work)
    r = subprocess.run(["bash", os.path.join(root, "scripts", "run_demo.sh"), caviar, work],
                       capture_output=True, text=True, timeout=300)
    print(r.stdout[-3000:])
    if r.returncode != 0:
        print(r.stderr[-3000:])
        print("FAIL: run_demo.sh exited", r.returncode)
        return 1
    problems = []
    check = lambda ok, what: ok or problems.append(what)

    # Progress lines on stderr: iteration, ELBO, relative change, seconds.
    check(any(l.startswith("iter ") and "elbo" in l and "rel" in l for l in r.stderr.splitlines()),
          "no per-iteration progress printed")
    summaries = [json.loads(l) for l in r.stdout.splitlines() if l.startswith('{"elbo"')]
    check(len(summaries) == 2 and all(s["ranks"] == 2 and s["converged"] for s in summaries),
          f"fit summaries: {summaries}")

    with h5py.File(os.path.join(work, "demo.h5"), "r") as f:
        true_means = f["three/true/means"][:]
        true_w = f["three/true/weights"][:]
    with h5py.File(os.path.join(work, "three_model.h5"), "r") as m:
        means, w, trace = m["means"][:], m["weights"][:], m["trace/elbo"][:]
        check(abs(m.attrs["elbo"] - trace[-1]) < 1e-9 * abs(trace[-1]), "elbo attribute != trace end")
    order = [int(np.argmin(np.linalg.norm(means - mu, axis=1))) for mu in true_means]
    check(sorted(order) == [0, 1, 2], f"components do not match the true clusters: {order}")
    err = np.abs(means[order] - true_means).max()
    check(err < 0.25, f"study 1 means off by {err:.3f}")
    check(np.abs(w[order] - true_w).max() < 0.05, f"study 1 weights {w} vs {true_w}")
    check(np.all(np.diff(trace) >= -1e-10 * np.abs(trace[:-1])), "study 1 ELBO decreased")

    with h5py.File(os.path.join(work, "two_model.h5"), "r") as m:
        w2, trace2 = np.sort(m["weights"][:]), m["trace/elbo"][:]
    # As in Bruno 2022, Figure 1.7: two components carry the data, two are left (nearly) empty.
    check(w2[0] < 0.01 and w2[1] < 0.01 and w2[2] > 0.3 and w2[3] > 0.3, f"study 2 weights {w2}")
    check(np.all(np.diff(trace2) >= -1e-10 * np.abs(trace2[:-1])), "study 2 ELBO decreased")

    scores = [json.loads(l) for l in r.stdout.splitlines() if l.startswith('{"score"')]
    # The true mixture's average log density on this data is about -3.9 nats; a fit near it
    # must score within a few tenths.
    check(len(scores) == 1 and -4.4 < scores[0]["score"] < -3.6 and scores[0]["n"] == 1500,
          f"held-out score {scores}")
    for png in ("three_clusters.png", "two_clusters_k4.png"):
        path = os.path.join(work, png)
        ok = os.path.exists(path) and open(path, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
        check(ok and os.path.getsize(path) > 20000, f"{png} missing or not a PNG")
    with h5py.File(os.path.join(work, "three_labels.h5"), "r") as f:
        check(f["labels"].shape == (1500,), "labels shape")

    for p in problems:
        print("FAIL:", p)
    print(f"{0 if problems else 1} passed, {1 if problems else 0} failed")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
