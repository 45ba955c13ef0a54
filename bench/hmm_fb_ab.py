#!/usr/bin/env -S /usr/bin/python3
"""A/B time per iteration of `caviar hmm fit` for two binaries, runs interleaved in one session.

Data: `caviar generate hmm --sequences N --length 50-400 --states 8 --emission gaussian --dim 4
--seed 1` (made with binary A). Fits: EM, full covariances, K = 8 and K = 32 (--ks), `--tol 0`,
--iters iterations, 1 rank x --threads threads. Runs go A, B, B, A, A, B, ... (--reps each); a run's
time per iteration is the median of the differences of its `trace/seconds`, and the median over
runs is printed with the ratio A/B (the speed-up of B). The two binaries' transition matrices and
means are compared too (largest absolute difference): a change that reassociates sums moves the
last bits, and this shows by how much.

usage: hmm_fb_ab.py A_BIN B_BIN WORKDIR [--sequences 20000] [--reps 3] [--iters 5] [--threads 2]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

import h5py
import numpy as np


def run(binary, args, threads):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    p = subprocess.run([binary, "-q"] + args, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        sys.exit("%s %s failed: %s" % (binary, " ".join(args[:2]), p.stderr.strip()))
    return json.loads(p.stdout.strip().splitlines()[-1])


def per_iteration(model):
    with h5py.File(model, "r") as h:
        return float(np.median(np.diff(h["trace/seconds"][()])))


def max_diff(fa, fb):
    with h5py.File(fa, "r") as a, h5py.File(fb, "r") as b:
        return max(float(np.abs(a[n][()] - b[n][()]).max()) for n in ("transmat", "means"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("work")
    ap.add_argument("--sequences", type=int, default=20000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ks", default="8,32")
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    data = os.path.join(args.work, "data.h5")
    run(args.a, ["generate", "hmm", "--sequences", str(args.sequences), "--length", "50-400",
                 "--states", "8", "--emission", "gaussian", "--dim", "4", "--seed", "1",
                 "--out", data], 1)
    print("load average %s" % " ".join(open("/proc/loadavg").read().split()[:3]))
    print("| K | A s/iteration | B s/iteration | speed-up A/B | max abs diff of transmat, means |")
    print("|---|---|---|---|---|")
    for k in [int(x) for x in args.ks.split(",")]:
        times = {"a": [], "b": []}
        for rep in range(args.reps):
            for side in ("ab" if rep % 2 == 0 else "ba"):
                out = os.path.join(args.work, "%s_k%d.h5" % (side, k))
                run(getattr(args, side), ["hmm", "fit", "--data", data, "-k", str(k),
                                          "--emission", "gaussian", "--algorithm", "em",
                                          "--tol", "0", "--max-iter", str(args.iters),
                                          "--seed", "1", "--out", out], args.threads)
                times[side].append(per_iteration(out))
        ta, tb = statistics.median(times["a"]), statistics.median(times["b"])
        diff = max_diff(os.path.join(args.work, "a_k%d.h5" % k),
                        os.path.join(args.work, "b_k%d.h5" % k))
        print("| %d | %.4g | %.4g | %.2f | %.2g |" % (k, ta, tb, ta / tb, diff), flush=True)
    print("load average %s" % " ".join(open("/proc/loadavg").read().split()[:3]))


if __name__ == "__main__":
    main()
