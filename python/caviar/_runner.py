"""Running the caviar binary: where it is, how it is launched, how its errors come back.

Every fit is one run of ``caviar ...`` (under ``mpirun -n P`` when P > 1) in a temporary
directory that holds the input written from memory (if any) and the files caviar writes.
"""

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile

import numpy as np


class CaviarError(ValueError):
    """The caviar binary failed. The message is caviar's own one-line error
    (``caviar: error: ...``) when it printed one, else the end of its stderr."""

    def __init__(self, message, command=None, returncode=None, stderr=None):
        super().__init__(message)
        self.command = command
        self.returncode = returncode
        self.stderr = stderr


_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
# python/caviar/ -> the repository root -> build/caviar
_REPO_BINARY = os.path.normpath(os.path.join(_PACKAGE_DIR, "..", "..", "build", "caviar"))


def find_binary(caviar_bin=None):
    """The caviar executable: the estimator's caviar_bin, else $CAVIAR_BIN, else `caviar` on
    PATH, else build/caviar of the repository this package sits in."""
    tried = []
    for source, cand in (("caviar_bin", caviar_bin), ("CAVIAR_BIN", os.environ.get("CAVIAR_BIN"))):
        if cand:
            path = os.fspath(cand)
            if os.path.isfile(path) and os.access(path, os.X_OK):
                return os.path.abspath(path)
            # A name that is set but wrong is an error, not a reason to fall back silently.
            raise FileNotFoundError("%s=%r is not an executable file" % (source, path))
    on_path = shutil.which("caviar")
    if on_path:
        return on_path
    tried.append("`caviar` on PATH")
    if os.path.isfile(_REPO_BINARY) and os.access(_REPO_BINARY, os.X_OK):
        return _REPO_BINARY
    tried.append(_REPO_BINARY)
    raise FileNotFoundError(
        "cannot find the caviar binary (tried %s); build it (cmake --build build --target "
        "caviar) or set caviar_bin= or $CAVIAR_BIN" % " and ".join(tried))


def launch_prefix(n_ranks, mpirun=None):
    """The command prefix: nothing for one rank (the binary starts as an MPI singleton),
    else `mpirun -n P` (or the estimator's mpirun / $CAVIAR_MPIRUN, split like a shell)."""
    if n_ranks == 1 and mpirun is None and not os.environ.get("CAVIAR_MPIRUN"):
        return []
    cmd = mpirun if mpirun is not None else os.environ.get("CAVIAR_MPIRUN", "mpirun")
    cmd = shlex.split(cmd) if isinstance(cmd, str) else [os.fspath(c) for c in cmd]
    return cmd + ["-n", str(int(n_ranks))]


def child_env(n_ranks, n_threads, direct):
    """Environment of the caviar process. Open MPI settings are defaults only: a variable the
    user has set is kept. Other MPI implementations ignore the OMPI_* names."""
    env = dict(os.environ)
    if n_threads is not None:
        env["OMP_NUM_THREADS"] = str(int(n_threads))
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        # Open MPI refuses to run as root without both.
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    if direct:
        # A lone rank needs no daemon and no network transport; without these Open MPI 4.1
        # spends ~0.3 s starting them (measured here: 0.4 s -> 0.1 s per run).
        env.setdefault("OMPI_MCA_ess_singleton_isolated", "1")
        env.setdefault("OMPI_MCA_pml", "ob1")
    else:
        if n_ranks > (os.cpu_count() or 1):
            env.setdefault("OMPI_MCA_rmaps_base_oversubscribe", "1")
        if n_threads is None or int(n_threads) != 1:
            # Open MPI binds each rank to one core when P <= 2; its OpenMP threads would then
            # share that core.
            env.setdefault("OMPI_MCA_hwloc_base_binding_policy", "none")
    return env


def run(args, *, caviar_bin=None, n_ranks=1, n_threads=None, mpirun=None, verbose=0,
        cwd=None):
    """Runs caviar with `args`; returns the JSON summary line (dict) it ends with.
    Raises CaviarError on a non-zero exit. With verbose, caviar's progress lines (stderr)
    are echoed to sys.stdout as they come."""
    n_ranks = int(n_ranks)
    if n_ranks < 1:
        raise ValueError("n_ranks must be >= 1, got %r" % n_ranks)
    binary = find_binary(caviar_bin)
    prefix = launch_prefix(n_ranks, mpirun)
    cmd = prefix + [binary] + [str(a) for a in args]
    env = child_env(n_ranks, n_threads, direct=not prefix)
    err_lines = []
    with tempfile.TemporaryFile(mode="w+") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.PIPE, env=env, cwd=cwd,
                                universal_newlines=True, errors="replace")
        try:
            for line in proc.stderr:
                err_lines.append(line.rstrip("\n"))
                if verbose:
                    print(line, end="", file=sys.stdout)
                    sys.stdout.flush()
            rc = proc.wait()
        except BaseException:
            # KeyboardInterrupt and the like: do not leave caviar running.
            proc.kill()
            proc.wait()
            raise
        finally:
            proc.stderr.close()
        out.seek(0)
        stdout = out.read()
    if rc != 0:
        errors = [l for l in err_lines if l.startswith("caviar: error:")]
        if errors:
            msg = errors[-1]
        else:
            tail = [l for l in err_lines if l.strip()][-5:]
            msg = "caviar exited with code %d%s" % (rc, (": " + " | ".join(tail)) if tail else "")
        raise CaviarError(msg, command=cmd, returncode=rc, stderr="\n".join(err_lines))
    for line in reversed(stdout.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                continue
    raise CaviarError("caviar ended without its JSON summary line on stdout: %r" % stdout[-500:],
                      command=cmd, returncode=rc, stderr="\n".join(err_lines))


class Workdir:
    """A temporary directory for one run, removed afterwards ($TMPDIR chooses where: with
    several nodes it must be a directory every node sees)."""

    def __enter__(self):
        self.path = tempfile.mkdtemp(prefix="caviar-")
        return self

    def file(self, name):
        return os.path.join(self.path, name)

    def __exit__(self, *exc):
        shutil.rmtree(self.path, ignore_errors=True)
        return False


def is_data_ref(X):
    """True when X names an HDF5 dataset ("file.h5", "file.h5:/path", a path object)."""
    return isinstance(X, (str, bytes, os.PathLike))


def split_ref(ref, default_path):
    """'file.h5:/a/b' -> ('file.h5', '/a/b'); 'file.h5' -> ('file.h5', default_path)."""
    ref = os.fsdecode(os.fspath(ref))
    i = ref.rfind(":/")
    if i > 0:
        return ref[:i], ref[i + 1:]
    return ref, default_path


def dataset_shape(ref, default_path="/X"):
    """Shape of the dataset named by ref (metadata only; no rows are read)."""
    import h5py
    fname, path = split_ref(ref, default_path)
    with h5py.File(fname, "r") as f:
        if path not in f:
            raise ValueError("no dataset '%s' in '%s'" % (path, fname))
        return tuple(f[path].shape)


def iter_rows(ref, default_path="/X", chunk_rows=65536):
    """Yields (first_row, block) of an N x D dataset, `chunk_rows` rows at a time (float64)."""
    import h5py
    fname, path = split_ref(ref, default_path)
    with h5py.File(fname, "r") as f:
        d = f[path]
        for r0 in range(0, d.shape[0], chunk_rows):
            yield r0, np.asarray(d[r0:r0 + chunk_rows], dtype=np.float64)


def write_matrix(path, X, name="X"):
    import h5py
    with h5py.File(path, "w") as f:
        f.create_dataset(name, data=np.ascontiguousarray(X, dtype=np.float64))
