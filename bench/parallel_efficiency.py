#!/usr/bin/env -S /usr/bin/python3
"""Parallel efficiency and peak memory of `caviar gmm fit` on this machine (docs/performance.md).

Runs the same CAVI fit (N = 1e6, D = 16, K = 20 by default; random start, --tol 0, fixed
iteration count) at 1 rank x 1 thread, 1 x T and T x 1 (and P x 1 for each --ranks P), takes the
median time per iteration from the model's trace/seconds, and prints the efficiency
t(1x1) / (P T t(PxT)) and the share of the iterations spent inside allreduce (the summary's
allreduce_seconds over loop_seconds: least on the rank that waits least, most on the one that
waits longest for the others). Each configuration runs in
its own process group; peak resident memory per process comes from getrusage (the largest
caviar process of the run) and is compared with that process's data shard (N D 8 / P bytes).

usage: parallel_efficiency.py CAVIAR_BIN WORKDIR [--n 1000000] [--dim 16] [--k 20] [--threads 2]
                              [--iters 10] [--fast-reduce] [--ranks 4]
"""
import argparse
import json
import os
import subprocess
import sys

from compare_sklearn import mpirun, per_iteration_seconds


def run_fit(caviar, data, k, ranks, threads, iters, fast, workdir):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    out = os.path.join(workdir, f"eff_model_{ranks}x{threads}.h5")
    argv = mpirun(ranks) + [caviar, "gmm", "fit", "--data", data, "-k", str(k), "--init",
                            "random", "--seed", "1", "--max-iter", str(iters), "--tol", "0",
                            "--out", out]
    if fast:
        argv.append("--fast-reduce")
    # Peak RSS of this run alone: a fresh child python whose children are the run.
    probe = ("import resource,subprocess,sys,json;"
             "r=subprocess.run(sys.argv[1:],capture_output=True,text=True);"
             "print(json.dumps([r.returncode,r.stdout,r.stderr,"
             "resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss]))")
    probed = subprocess.run([sys.executable, "-c", probe] + argv, capture_output=True, text=True,
                            env=env, timeout=3600)
    code, stdout, stderr, maxrss_kb = json.loads(probed.stdout)
    if code != 0:
        sys.exit(f"FAILED ({ranks}x{threads}):\n{stderr}")
    summary = json.loads(stdout.strip().splitlines()[-1])
    share = [w / summary["loop_seconds"] for w in summary["allreduce_seconds"]]
    return per_iteration_seconds(out, iters), maxrss_kb * 1024, share


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("caviar")
    ap.add_argument("workdir")
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--dim", type=int, default=16)
    ap.add_argument("--k", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--fast-reduce", action="store_true")
    ap.add_argument("--ranks", type=int, nargs="*", default=[],
                    help="more P x 1 runs (e.g. 4), for the allreduce share; beyond the core count "
                         "they are oversubscribed, so their speed-up says little")
    a = ap.parse_args()
    os.makedirs(a.workdir, exist_ok=True)
    data = os.path.join(a.workdir, f"eff_{a.n}_{a.dim}_{a.k}.h5")
    if not os.path.exists(data):
        subprocess.run(mpirun(1) + [a.caviar, "-q", "generate", "gmm", "--n", str(a.n), "--dim",
                                    str(a.dim), "--components", str(a.k), "--seed", "1",
                                    "--out", data + ":/X"], check=True, capture_output=True)
    t = a.threads
    configs = [(1, 1), (1, t), (t, 1)] + [(p, 1) for p in a.ranks if p not in (1, t)]
    res = {c: run_fit(a.caviar, data + ":/X", a.k, *c, a.iters, a.fast_reduce, a.workdir)
           for c in configs}
    base = res[(1, 1)][0]
    load = os.getloadavg()[0]
    print(f"CAVI N={a.n} D={a.dim} K={a.k}, {a.iters} iterations, "
          f"{'--fast-reduce' if a.fast_reduce else 'exact sums'}; load average {load:.2f} at the end")
    print("| ranks x threads | s/iter | speed-up | efficiency | allreduce share (min-max over "
          "ranks) | peak RSS per process (MB) | data shard (MB) |")
    print("|---|---|---|---|---|---|---|")
    for (p, th), (s, rss, share) in res.items():
        shard = a.n * a.dim * 8 / p / 2**20
        print(f"| {p} x {th} | {s:.4f} | {base / s:.2f} | {100 * base / (s * p * th):.0f}% | "
              f"{100 * share[0]:.1f}-{100 * share[1]:.1f}% | {rss / 2**20:.0f} | {shard:.0f} |")


if __name__ == "__main__":
    main()
