"""caviar lda fit vs scikit-learn LatentDirichletAllocation (online) and gensim LdaMulticore.

usage: /usr/bin/python3 bench/lda_vs_peers.py CAVIAR TRAIN.h5 TEST.h5 WORKDIR
           [--topics 20] [--passes 10] [--batch-size 256] [--ranks 1 2] [--skip-gensim]
           [--caviar-before OTHER_CAVIAR] [--repeat N] [--sklearn-repeat N]

--caviar-before runs a second caviar build (e.g. the previous commit) at 1 rank in the same run,
so that a change is measured side by side against the same scikit-learn run. --repeat N runs
every caviar fit N times (interleaved) and keeps each one's fastest (the machine is shared);
--sklearn-repeat N does the same for scikit-learn.

All systems get the same CSR corpus (the same vocabulary) and the same priors alpha = eta = 1/K.
Every model is scored by caviar's one held-out estimator (document completion): the peers'
topic-word Dirichlet parameters (sklearn components_, gensim state.get_lambda()) are written to
HDF5, turned into caviar models with `caviar lda import`, and scored with `caviar lda score`.

Times are fit times only (no scoring), measured one after the other on the same machine: ratios
are what to read; absolute times drift on a shared machine. Also writes WORKDIR/trace.csv
(system, pass, seconds, perplexity) for a perplexity-vs-time plot, and WORKDIR/results.json.
"""
import argparse
import json
import os
import subprocess
import sys
import time

import h5py
import numpy as np
import scipy.sparse as sp

ap = argparse.ArgumentParser()
ap.add_argument("caviar")
ap.add_argument("train")
ap.add_argument("test")
ap.add_argument("work")
ap.add_argument("--topics", type=int, default=20)
ap.add_argument("--passes", type=int, default=10)
ap.add_argument("--batch-size", type=int, default=256)
ap.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
ap.add_argument("--skip-gensim", action="store_true")
ap.add_argument("--skip-sklearn", action="store_true")
ap.add_argument("--trace", action="store_true", help="score the peers after every pass")
ap.add_argument("--caviar-before", help="another caviar binary, run at 1 rank for comparison")
ap.add_argument("--repeat", type=int, default=1)
ap.add_argument("--sklearn-repeat", type=int, default=1)
args = ap.parse_args()
os.makedirs(args.work, exist_ok=True)
K = args.topics
prior = 1.0 / K
env = dict(os.environ, OMP_NUM_THREADS="1")


def path(name):
    return os.path.join(args.work, name)


def caviar(cmd, ranks=1, binary=None):
    pre = []
    if ranks > 1:
        # Yield when idle: on a shared, oversubscribed machine, spinning ranks steal the cores.
        pre = ["mpirun", "-n", str(ranks), "--oversubscribe", "--mca", "mpi_yield_when_idle", "1"]
        if os.geteuid() == 0:
            pre.append("--allow-run-as-root")
    p = subprocess.run(pre + [binary or args.caviar, "-q"] + cmd, capture_output=True, text=True,
                       env=env)
    if p.returncode != 0:
        sys.exit(f"caviar failed: {' '.join(cmd)}\n{p.stderr}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def score_lambda(name, lam):
    """caviar's held-out perplexity of a peer's K x V Dirichlet parameters."""
    with h5py.File(path(name + "_components.h5"), "w") as h:
        h["components"] = np.asarray(lam, dtype=np.float64)
    caviar(["lda", "import", "--topics", path(name + "_components.h5"), "--alpha", str(prior),
            "--eta", str(prior), "--vocab", args.train, "--out", path(name + "_model.h5")])
    return caviar(["lda", "score", "--model", path(name + "_model.h5"), "--data", args.test])["perplexity"]


with h5py.File(args.train) as h:
    X = sp.csr_matrix((h["data"][:].astype(np.float64), h["indices"][:], h["indptr"][:]),
                      shape=tuple(h.attrs["shape"]))
D, V = X.shape
print(f"corpus: {D} documents, {V} words, {int(X.sum())} tokens; K={K}, {args.passes} passes, "
      f"batch {args.batch_size}", flush=True)
results, trace = [], []

def loadavg():
    return float(open("/proc/loadavg").read().split()[0])


# caviar (SVI, the same schedule as scikit-learn's defaults: tau0 = 10, kappa = 0.7).
runs = [(f"caviar svi, {r} rank(s)", args.caviar, r, f"np{r}") for r in args.ranks]
if args.caviar_before:
    runs.insert(0, ("caviar-before svi, 1 rank(s)", args.caviar_before, 1, "before"))
best = {}
for rep in range(args.repeat):
    for name, binary, r, tag in runs:
        out = path(f"caviar_{tag}.h5")
        load = loadavg()
        t0 = time.perf_counter()
        s = caviar(["lda", "fit", "--data", args.train, "--topics", str(K), "--algorithm", "svi",
                    "--max-iter", str(args.passes), "--batch-size", str(args.batch_size),
                    "--tau0", "10", "--kappa", "0.7", "--out", out, "--heldout", args.test],
                   ranks=r, binary=binary)
        wall = time.perf_counter() - t0
        print(f"# {name}, run {rep + 1}: fit {s['seconds']:.3f} s (load {load:.2f})", flush=True)
        if name not in best or s["seconds"] < best[name][0]["seconds"]:
            best[name] = (s, wall, out, load)
for name, binary, r, tag in runs:
    s, wall, out, load = best[name]
    perp = caviar(["lda", "score", "--model", out, "--data", args.test], binary=binary)["perplexity"]
    with h5py.File(out) as h:
        for i, (sec, pp) in enumerate(zip(h["trace/seconds"][:], h["trace/perplexity"][:])):
            trace.append((f"caviar {tag}", i + 1, float(sec), float(pp)))
    results.append({"system": name, "fit_seconds": s["seconds"], "wall_seconds": wall,
                    "perplexity": perp, "load": load,
                    "local_seconds_max": s.get("local_seconds_max"),
                    "local_seconds_min": s.get("local_seconds_min"),
                    "reduce_seconds_max": s.get("reduce_seconds_max")})
    print(json.dumps(results[-1]), flush=True)

if not args.skip_sklearn:
    from sklearn.decomposition import LatentDirichletAllocation

    # --sklearn-repeat N fits N times (the same fit: random_state=0) and keeps the fastest.
    times = []
    for rep in range(args.sklearn_repeat):
        lda = LatentDirichletAllocation(n_components=K, learning_method="online",
                                        batch_size=args.batch_size, doc_topic_prior=prior,
                                        topic_word_prior=prior, learning_offset=10.0,
                                        learning_decay=0.7, total_samples=D, random_state=0,
                                        n_jobs=1)
        fit_time = 0.0
        load = loadavg()
        # partial_fit over the minibatches is exactly fit(learning_method="online") pass by
        # pass, which lets the trace score the model after every pass (scoring is not timed).
        for p in range(args.passes):
            t0 = time.perf_counter()
            for b0 in range(0, D, args.batch_size):
                lda.partial_fit(X[b0:b0 + args.batch_size])
            fit_time += time.perf_counter() - t0
            if rep == 0 and (args.trace or p == args.passes - 1):
                trace.append(("sklearn", p + 1, fit_time,
                              score_lambda("sklearn", lda.components_)))
        times.append(fit_time)
        print(f"# sklearn online, run {rep + 1}: fit {fit_time:.3f} s (load {load:.2f})",
              flush=True)
    perp = [t for t in trace if t[0] == "sklearn"][-1][3]
    results.append({"system": "sklearn LatentDirichletAllocation online",
                    "fit_seconds": min(times), "runs": times, "perplexity": perp,
                    "load": loadavg()})
    print(json.dumps(results[-1]), flush=True)

if not args.skip_gensim:
    try:
        from gensim.matutils import Sparse2Corpus
        from gensim.models import LdaMulticore
        from gensim.corpora import Dictionary
    except ImportError:
        print("gensim not installed (Debian python3-gensim; scripts/install_bench_deps.sh)")
    else:
        corpus = list(Sparse2Corpus(X, documents_columns=False))
        id2word = {i: str(i) for i in range(V)}
        t0 = time.perf_counter()
        g = LdaMulticore(corpus=corpus, id2word=id2word, num_topics=K, passes=args.passes,
                         chunksize=args.batch_size, alpha=[prior] * K, eta=prior, decay=0.7,
                         offset=10.0, workers=1, random_state=0, eval_every=None)
        fit_time = time.perf_counter() - t0
        perp = score_lambda("gensim", g.state.get_lambda())
        trace.append(("gensim", args.passes, fit_time, perp))
        results.append({"system": "gensim LdaMulticore (workers=1)", "fit_seconds": fit_time,
                        "perplexity": perp})
        print(json.dumps(results[-1]), flush=True)

with open(path("trace.csv"), "w") as f:
    f.write("system,pass,seconds,perplexity\n")
    for row in trace:
        f.write("%s,%d,%.4f,%.4f\n" % row)
with open(path("results.json"), "w") as f:
    json.dump(results, f, indent=1)

print("\n%-42s %10s %12s" % ("system", "fit s", "perplexity"))
for r in results:
    print("%-42s %10.2f %12.2f" % (r["system"], r["fit_seconds"], r["perplexity"]))
peers = [r for r in results if not r["system"].startswith("caviar")]
for base in [r for r in results if r["system"].startswith("caviar")]:
    for r in peers:
        print("%s: %.2fx the time of %s, perplexity %+.2f%%" % (
            r["system"], r["fit_seconds"] / base["fit_seconds"], base["system"],
            100 * (r["perplexity"] / base["perplexity"] - 1)))
