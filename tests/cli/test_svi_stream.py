#!/usr/bin/env -S /usr/bin/python3
"""`gmm fit --algorithm svi --stream` completes on a dataset larger than a memory cap put on the
whole run, with the same ELBO as in-memory SVI without the cap; and in-memory SVI under the same
cap is killed (so the cap is real).

The cap: a cgroup (v1 memory controller) whose memory.limit_in_bytes is CAP_MB; the test puts
the mpirun process into it before exec, so mpirun and both ranks share the cap (cgroup v1
charges page cache too, but reclaims it before killing). Needs root and a writable
/sys/fs/cgroup/memory; otherwise the test is skipped (exit 77). `ulimit -v`/`prlimit --as` was
not used: Open MPI and the OpenMP runtime reserve far more address space than they touch, so an
address-space cap says little about resident memory.

Dataset: N x D float64 with N*D*8 = DATA_MB (about 2 x CAP_MB), written in slabs with h5py so the
writer never holds it all either.

usage: test_svi_stream.py CAVIAR_BIN WORKDIR
"""
import json
import os
import subprocess
import sys
import time

import h5py
import numpy as np

from clitest import MemoryCap, fresh_workdir, mpirun

CAP_MB = 150
N, D = 1_200_000, 32  # 307 MB of float64


def write_data(path):
    rng = np.random.default_rng(7)
    centers = rng.normal(0, 4, size=(4, D))
    with h5py.File(path, "w") as f:
        ds = f.create_dataset("X", shape=(N, D), dtype="f8")
        for b in range(0, N, 100_000):
            n = min(100_000, N - b)
            z = rng.integers(0, 4, size=n)
            ds[b:b + n] = centers[z] + rng.normal(size=(n, D))


def fit(caviar, data, out, stream, cap=None):
    cmd = mpirun(2) + [caviar, "gmm", "fit", "--data", data + ":/X", "--components", "4",
                       "--algorithm", "svi", "--batch-size", "20000", "--max-iter", "1",
                       "--tol", "0", "--init", "random", "--seed", "3", "--out", out]
    if stream:
        cmd.append("--stream")

    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                       preexec_fn=cap.enter if cap else None)
    return r, time.time() - t0


def main():
    caviar, work = sys.argv[1], sys.argv[2]
    p = fresh_workdir(work)
    try:
        cap = MemoryCap("svi_stream", CAP_MB)
    except OSError as e:
        print("SKIP: cannot create a memory cgroup (%s); needs root and cgroup v1 memory" % e)
        return 77
    with cap:
        try:
            return run(caviar, p, cap)
        finally:
            try:
                os.remove(p("big.h5"))
            except OSError:
                pass


def run(caviar, p, cap):
    data = p("big.h5")
    write_data(data)
    mb = os.path.getsize(data) / 2**20
    print("dataset %d x %d float64: %.0f MB on disk; cap %d MB on mpirun + 2 ranks"
          % (N, D, mb, CAP_MB))
    assert mb > 2 * CAP_MB * 0.95 - 1

    free, dt = fit(caviar, data, p("mem.h5"), stream=False)
    if free.returncode != 0:
        raise SystemExit("FAIL: in-memory SVI without cap:\n" + free.stderr[-2000:])
    e_free = json.loads(free.stdout.strip().splitlines()[-1])["elbo"]
    print("in-memory, no cap: elbo %.12e (%.1fs)" % (e_free, dt))

    capped, dt = fit(caviar, data, p("stream.h5"), stream=True, cap=cap)
    if capped.returncode != 0:
        raise SystemExit("FAIL: --stream under the %d MB cap (rc %d):\n%s"
                         % (CAP_MB, capped.returncode, capped.stderr[-2000:]))
    e_cap = json.loads(capped.stdout.strip().splitlines()[-1])["elbo"]
    print("--stream, capped:  elbo %.12e (%.1fs), cgroup peak %.0f MB"
          % (e_cap, dt, cap.peak_mb()))
    rel = abs(e_cap - e_free) / abs(e_free)
    if not rel < 1e-12:
        raise SystemExit("FAIL: streamed ELBO differs from in-memory by %.2e relative" % rel)

    # The cap is real: the in-memory fit (each rank holds half the data) cannot run under it.
    mem, dt = fit(caviar, data, p("mem_capped.h5"), stream=False, cap=cap)
    if mem.returncode == 0:
        raise SystemExit("FAIL: in-memory SVI completed under the cap: the cap is not binding")
    print("in-memory under the cap fails as expected (rc %d, %.1fs)" % (mem.returncode, dt))
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
