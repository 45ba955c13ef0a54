#!/usr/bin/env -S /usr/bin/python3
"""Eigen's own matrix kernels against Eigen over OpenBLAS (EIGEN_USE_BLAS), the "BLAS backend"
question of docs/performance.md, measured side by side in one run: the same CAVI fit with the
default build and with one configured -DCAVIAR_EIGEN_BLAS=ON, at the three benchmark shapes,
interleaved (default, BLAS, default, BLAS, ...) so that load on a shared machine hits both alike.
OpenBLAS runs with OPENBLAS_NUM_THREADS=1: the threads are caviar's own (OpenMP over row blocks).

usage: blas_backend.py CAVIAR_BIN CAVIAR_BLAS_BIN WORKDIR [--scale 0.1] [--shapes 0,1,2]
                       [--threads 2] [--repeats 3] [--fast-reduce]
"""
import argparse
import os

import numpy as np

from compare_sklearn import CAVIAR_ITERS, SHAPES, caviar_per_iter, mpirun, run


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("caviar")
    ap.add_argument("caviar_blas")
    ap.add_argument("workdir")
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--shapes", default="0,1,2")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--fast-reduce", action="store_true")
    a = ap.parse_args()
    os.makedirs(a.workdir, exist_ok=True)
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
    rows = []
    for si in [int(s) for s in a.shapes.split(",")]:
        n, d, k = SHAPES[si]
        n = max(int(n * a.scale), 10 * k)
        data = os.path.join(a.workdir, f"shape{si}.h5")
        run(mpirun(1) + [a.caviar, "-q", "generate", "gmm", "--n", str(n), "--dim", str(d),
                         "--components", str(k), "--seed", "1", "--out", data])
        times = {"eigen": [], "openblas": []}
        elbos = {}
        for _ in range(a.repeats):
            for name, binary in (("eigen", a.caviar), ("openblas", a.caviar_blas)):
                t, elbo = caviar_per_iter(binary, data + ":/X", k, 1, a.threads, CAVIAR_ITERS[si],
                                          a.workdir, "cavi", "full", fast=a.fast_reduce)
                times[name].append(t)
                elbos[name] = elbo
        rows.append((n, d, k, np.median(times["eigen"]), np.median(times["openblas"]),
                     abs(elbos["eigen"] - elbos["openblas"]) / abs(elbos["eigen"])))
    print(f"CAVI s/iter, 1 rank x {a.threads} threads, {'--fast-reduce' if a.fast_reduce else 'exact sums'}, "
          f"median of {a.repeats} interleaved runs; load average {os.getloadavg()[0]:.2f} at the end")
    print("| N | D | K | Eigen kernels | Eigen over OpenBLAS | OpenBLAS / Eigen time | ELBO rel. diff |")
    print("|---|---|---|---|---|---|---|")
    for n, d, k, e, b, diff in rows:
        print(f"| {n} | {d} | {k} | {e:.4f} | {b:.4f} | {b / e:.2f} | {diff:.1e} |")


if __name__ == "__main__":
    main()
