#!/usr/bin/env -S /usr/bin/python3
"""caviar gmm | lda | hmm compare, without SLURM: the table and its JSON line against the model
files read with h5py (independently of caviar), for each model kind.

- gmm: fits at K = 1, 2, 4 (two seeds at K = 4) with a held-out set, given out of order: rows
  sorted by K then seed; elbo, heldout_score, seed, algorithm and the effective components
  (weights >= 0.01/K) per file, and on weights chosen around that threshold; --plot writes a PNG (signature and IHDR size). At 2 ranks the
  same stdout (one table, from rank 0). A fit without --heldout shows '-' (JSON null).
- lda: K = n_topics, objective from the elbo attribute, held-out perplexity = the last entry of
  /trace/perplexity; no mixing weights, so no effective count.
- hmm: K = n_states, the engine's objective attribute, no held-out score.
(The bad-input cases of compare are in test_bad_input.py, which also documents them.)

usage: test_compare.py CAVIAR_BIN WORKDIR
"""
import json
import os
import struct
import sys

import h5py
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from clitest import Checks, fresh_workdir  # noqa: E402

caviar, work = sys.argv[1], sys.argv[2]
path = fresh_workdir(work)
checks = Checks(caviar)
check, run = checks.check, checks.run


def parse(stdout):
    """(header, rows, summary) of compare's stdout: a whitespace table, then one JSON line."""
    lines = stdout.strip().splitlines()
    table = [line.split() for line in lines[:-1]]
    return table[0], table[1:], json.loads(lines[-1])


def close(text, value):
    """The table prints 10 significant digits."""
    return abs(float(text) - value) <= 1e-9 * max(abs(value), 1e-300)


def verify(kind, stdout, want, objective_name, heldout_name):
    head, rows, summary = parse(stdout)
    check(head[4] == objective_name and head[5] == heldout_name,
          f"{kind}: header names {head[4]}, {head[5]} (want {objective_name}, {heldout_name})")
    check(len(rows) == len(want) == len(summary["fits"]), f"{kind}: {len(rows)} rows")
    for r, j, w in zip(rows, summary["fits"], want):
        name = os.path.basename(w["file"])
        check(r[0] == w["file"] == j["file"], f"{kind} {name}: file column {r[0]}")
        check(int(r[1]) == w["k"] == j["k"], f"{kind} {name}: K {r[1]} (want {w['k']})")
        check(int(r[3]) == w["seed"] == j["seed"], f"{kind} {name}: seed {r[3]} (want {w['seed']})")
        check(close(r[4], w["objective"]) and j["objective"] == w["objective"],
              f"{kind} {name}: {objective_name} {r[4]} / {j['objective']} (want {w['objective']!r})")
        if w["heldout"] is None:
            check(r[5] == "-" and j["heldout"] is None, f"{kind} {name}: no held-out score ({r[5]})")
        else:
            check(close(r[5], w["heldout"]) and j["heldout"] == w["heldout"],
                  f"{kind} {name}: {heldout_name} {r[5]} / {j['heldout']} (want {w['heldout']!r})")
        if w["effective"] is None:
            check(r[6] == "-" and j["effective"] is None, f"{kind} {name}: no effective count")
        else:
            check(int(r[6]) == w["effective"] == j["effective"],
                  f"{kind} {name}: effective {r[6]} (want {w['effective']})")
        check(int(r[7]) == w["n_iter"], f"{kind} {name}: iterations {r[7]} (want {w['n_iter']})")
    return summary


def last_finite(v):
    v = [x for x in v if np.isfinite(x)]
    return float(v[-1]) if v else None


# --- gmm -----------------------------------------------------------------------------------------
run(["-q", "generate", "gmm", "--n", "800", "--dim", "2", "--components", "3", "--seed", "4",
     "--out", path("all.h5") + ":/X"])
with h5py.File(path("all.h5"), "r") as f:
    x = f["X"][()]
with h5py.File(path("train.h5"), "w") as f:
    f["X"] = x[:640]
with h5py.File(path("test.h5"), "w") as f:
    f["X"] = x[640:]
fits = [("g4b.h5", 4, 2), ("g1.h5", 1, 1), ("g4a.h5", 4, 1), ("g2.h5", 2, 1)]
for name, k, seed in fits:
    run(["-q", "gmm", "fit", "--data", path("train.h5"), "-k", str(k), "--seed", str(seed),
         "--heldout", path("test.h5"), "--out", path(name)])


def gmm_want(name):
    with h5py.File(path(name), "r") as f:
        w = f["weights"][()]
        return dict(file=path(name), k=len(w), seed=int(f.attrs["seed"]),
                    objective=float(f.attrs["elbo"]),
                    heldout=float(f.attrs["heldout_score"]) if "heldout_score" in f.attrs else None,
                    effective=int(np.sum(w >= 0.01 / len(w))), n_iter=int(f.attrs["n_iter"]))


want = sorted((gmm_want(n) for n, _, _ in fits), key=lambda w: (w["k"], w["seed"]))
png = path("gmm.png")
r = run(["gmm", "compare"] + [path(n) for n, _, _ in fits] + ["--plot", png])
s = verify("gmm", r.stdout, want, "elbo", "heldout_score")
check(s.get("plot") == png, "gmm: JSON names the plot")
with open(png, "rb") as f:
    head = f.read(24)
check(head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR", "gmm: --plot wrote a PNG")
check(struct.unpack(">II", head[16:24]) == (1000, 400), "gmm: the PNG is 1000x400 (two panels)")
check(not [f for f in os.listdir(work) if "tmp-caviar" in f], "gmm: no temporary files left")
r2 = run(["gmm", "compare"] + [path(n) for n, _, _ in fits], ranks=2)
check(r2.stdout == r.stdout.replace(',"plot":' + json.dumps(png), ""),
      "gmm: 2 ranks print the same table and JSON once")

# The effective count's definition, on weights chosen around it (K = 4: threshold 0.0025): 0.003
# counts and 0.0016 does not. Other plausible definitions give other counts: a share of 0.5/K
# gives 2, an expected count N w >= 1 (N = 640) gives 4.
import shutil  # noqa: E402
shutil.copyfile(path("g4a.h5"), path("g4_crafted.h5"))
with h5py.File(path("g4_crafted.h5"), "r+") as f:
    f["weights"][...] = [0.7, 0.2954, 0.003, 0.0016]
r = run(["gmm", "compare", path("g4_crafted.h5")])
_, rows, s = parse(r.stdout)
check(rows[0][6] == "3" and s["fits"][0]["effective"] == 3,
      f"gmm: weights (0.7, 0.2954, 0.003, 0.0016) have 3 effective components (got {rows[0][6]})")

run(["-q", "gmm", "fit", "--data", path("train.h5"), "-k", "3", "--out", path("g3_noheld.h5")])
r = run(["gmm", "compare", path("g3_noheld.h5"), path("g2.h5")])
verify("gmm without --heldout", r.stdout,
       [gmm_want("g2.h5"), gmm_want("g3_noheld.h5")], "elbo", "heldout_score")

# --- lda -----------------------------------------------------------------------------------------
run(["-q", "generate", "lda", "--docs", "200", "--words", "40", "--topics", "3", "--seed", "1",
     "--heldout", path("corpus_test.h5"), "--heldout-docs", "50", "--out", path("corpus.h5")])
for k in (2, 3):
    run(["-q", "lda", "fit", "--data", path("corpus.h5"), "-k", str(k), "--max-iter", "20",
         "--heldout", path("corpus_test.h5"), "--out", path(f"lda{k}.h5")])
want = []
for k in (2, 3):
    with h5py.File(path(f"lda{k}.h5"), "r") as f:
        want.append(dict(file=path(f"lda{k}.h5"), k=int(f.attrs["n_topics"]),
                         seed=int(f.attrs["seed"]), objective=float(f.attrs["elbo"]),
                         heldout=last_finite(f["trace/perplexity"][()]), effective=None,
                         n_iter=int(f.attrs["n_iter"])))
r = run(["lda", "compare", path("lda3.h5"), path("lda2.h5")])
verify("lda", r.stdout, want, "elbo", "perplexity")

# --- hmm -----------------------------------------------------------------------------------------
run(["-q", "generate", "hmm", "--sequences", "20", "--length", "25-35", "--states", "2",
     "--symbols", "4", "--seed", "1", "--out", path("seqs.h5")])
for k in (2, 3):
    run(["-q", "hmm", "fit", "--data", path("seqs.h5"), "-k", str(k), "--max-iter", "20",
         "--out", path(f"hmm{k}.h5")])
want = []
for k in (2, 3):
    with h5py.File(path(f"hmm{k}.h5"), "r") as f:
        want.append(dict(file=path(f"hmm{k}.h5"), k=int(f.attrs["n_states"]),
                         seed=int(f.attrs["seed"]), objective=float(f.attrs["objective"]),
                         heldout=None, effective=None, n_iter=int(f.attrs["n_iter"])))
r = run(["hmm", "compare", path("hmm2.h5"), path("hmm3.h5")])
verify("hmm", r.stdout, want, "objective", "heldout")

checks.finish()
