"""Shared helpers of the command-line tests (run with Debian's /usr/bin/python3)."""
import os
import shutil


def mpirun(n):
    """The mpirun prefix for n ranks: oversubscribed (2 cores here), and as root when CI is."""
    extra = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    return ["mpirun", "-n", str(n), "--oversubscribe"] + extra


def fresh_workdir(path):
    """Empties `path` and returns a function joining names onto it."""
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    return lambda name: os.path.join(path, name)
