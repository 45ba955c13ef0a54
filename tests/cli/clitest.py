"""Shared helpers of the command-line tests (run with Debian's /usr/bin/python3)."""
import json
import os
import shutil
import subprocess
import sys
import time

import h5py
import numpy as np

# Attributes that record how a run was made, not what it computed.
PROVENANCE = {"command", "ranks", "threads"}


def is_timing(name):
    """Wall-clock values (datasets, attributes and JSON keys named "...seconds...") differ every run."""
    return "seconds" in name


def mpirun(n):
    """The mpirun prefix for n ranks: oversubscribed (2 cores here), and as root when CI is."""
    extra = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    return ["mpirun", "-n", str(n), "--oversubscribe"] + extra


def fresh_workdir(path):
    """Empties `path` and returns a function joining names onto it."""
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    return lambda name: os.path.join(path, name)


def h5_contents(path):
    """{name: (dtype, shape, bytes) or repr} for every dataset and attribute of an HDF5 file
    (root attributes included), timings and provenance left out: the results, bit for bit."""
    out = {}
    with h5py.File(path, "r") as f:
        def visit(name, obj):
            if isinstance(obj, h5py.Dataset) and not is_timing(name.split("/")[-1]):
                v = obj[()]
                raw = (repr(v.tolist()) if getattr(v, "dtype", None) is not None and
                       v.dtype.kind == "O" else np.ascontiguousarray(v).tobytes())
                out["D:" + name] = (np.asarray(v).dtype.str, np.shape(v), raw)
            for a, v in obj.attrs.items():
                if a not in PROVENANCE and not is_timing(a):
                    out[f"A:{name}@{a}"] = repr(v)
        visit("/", f)
        f.visititems(visit)
    return out


def h5_differences(first, *others):
    """Sorted names whose contents differ between `first` and any of `others` (or that only some
    of the files have)."""
    base = h5_contents(first)
    bad = set()
    for path in others:
        other = h5_contents(path)
        bad |= {k for k in set(base) | set(other) if base.get(k) != other.get(k)}
    return sorted(bad)


def json_summary(stdout):
    """The last JSON line of a run's stdout, without timings and provenance."""
    j = json.loads([line for line in stdout.splitlines() if line.startswith("{")][-1])
    return {k: v for k, v in j.items() if not is_timing(k) and k not in PROVENANCE}


def run_summary(argv, timeout=300):
    """Runs argv (exiting the test with its stderr if it fails) and returns the last JSON line
    of its stdout, whole: the summary every caviar command prints."""
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise SystemExit(f"FAIL: {' '.join(argv)}\n{r.stderr}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def rank_pids(parent):
    """Pids of the direct children of `parent` (mpirun forks the local ranks itself)."""
    pids = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == parent:
                pids.append(int(d))
    return pids


class Checks:
    """A test script's checks and runs: `check` prints ok/FAIL and counts failures; `run` runs
    caviar under `ranks` MPI ranks and `threads` OpenMP threads, and stops the script if a run
    that should succeed fails; `finish` exits non-zero if any check failed."""

    def __init__(self, caviar):
        self.caviar = caviar
        self.failures = 0

    def check(self, cond, what):
        print(("ok   " if cond else "FAIL ") + what, flush=True)
        self.failures += 0 if cond else 1

    def run(self, args, ranks=1, threads=1, ok=True):
        env = dict(os.environ, OMP_NUM_THREADS=str(threads))
        r = subprocess.run(mpirun(ranks) + [self.caviar] + args, capture_output=True, text=True,
                           env=env, timeout=600)
        if ok and r.returncode != 0:
            print(r.stdout, r.stderr)
            raise SystemExit(f"FAIL: caviar {' '.join(args)} exited {r.returncode}")
        return r

    def finish(self):
        print("FAILED" if self.failures else "PASSED", f"({self.failures} failure(s))")
        sys.exit(1 if self.failures else 0)


def summary(r):
    """The last line of a run's stdout, its JSON summary."""
    return json.loads(r.stdout.strip().splitlines()[-1])


class MemoryCap:
    """A memory cap on a process tree: a cgroup (v1 memory controller) whose limit is `mb` MB.
    Pass `enter` as subprocess's preexec_fn: the child (e.g. mpirun) joins the cgroup before exec,
    so it and every rank it starts share the cap. cgroup v2 is not used because its controllers
    must be delegated first, and `ulimit -v` caps address space, not memory. Needs root and
    /sys/fs/cgroup/memory: `MemoryCap(...)` raises OSError otherwise (the caller skips).
    Use as a context manager; the cgroup is removed on exit."""

    def __init__(self, name, mb):
        self.path = "/sys/fs/cgroup/memory/caviar_%s_%d" % (name, os.getpid())
        os.makedirs(self.path)
        try:
            self._write("memory.limit_in_bytes", "%dM" % mb)
        except OSError:
            os.rmdir(self.path)
            raise

    def _write(self, name, value):
        with open(os.path.join(self.path, name), "w") as f:
            f.write(value)

    def enter(self):
        self._write("cgroup.procs", str(os.getpid()))

    def reset_peak(self):
        self._write("memory.max_usage_in_bytes", "0")

    def peak_mb(self):
        """The cgroup's peak usage since creation or reset_peak(), page cache included."""
        with open(os.path.join(self.path, "memory.max_usage_in_bytes")) as f:
            return int(f.read()) / 2**20

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for attempt in range(20):  # a killed rank may take a moment to leave the cgroup
            try:
                os.rmdir(self.path)
                return
            except OSError as e:
                if attempt == 19:
                    print("warning: could not remove %s: %s" % (self.path, e))
                time.sleep(0.5)
